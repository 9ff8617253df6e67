"""PyTorch 2.13 CPU as a second oracle, where its convention equals one of symgrad's policies.

| symgrad (policy)            | PyTorch                         |
|-----------------------------|---------------------------------|
| max_pool1d/2d/3d (first)    | F.max_pool1d/2d/3d              |
| amax / amin (split)         | torch.amax / torch.amin         |
| maximum / minimum (split)   | torch.maximum / torch.minimum   |
| relu, clamp (first)         | F.relu, torch.clamp             |
| hardtanh, relu6, leaky_relu (last) | F.hardtanh, F.relu6, F.leaky_relu |
| abs (split)                 | torch.abs                       |
| maxout (first)              | x.view(N, C//p, p, ...).max(2)  |

NaN is left out: PyTorch's NaN rules differ from symgrad's (framework presets are another issue).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import symgrad

from conftest import examples, tie_heavy

if os.environ.get("CI"):
    import torch  # CI installs torch==2.13.0: a missing torch is a failure there, not a skip
else:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

F = torch.nn.functional


def torch_grads(fn, inputs, g):
    ts = [torch.tensor(x, requires_grad=True) for x in inputs]
    y = fn(*ts)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), [t.grad.numpy() for t in ts]


def check(op, params, ties, fn, inputs, g, exact=True):
    m = symgrad.load(op, ties=ties, **params)
    y, saved = m.forward(*inputs)
    got = m.backward(g, saved)
    ty, tgrads = torch_grads(fn, inputs, g)
    np.testing.assert_array_equal(y, ty)
    for a, b in zip(got, tgrads):
        assert a.dtype == b.dtype and a.shape == b.shape
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-12 if a.dtype == np.float64 else 1e-5, atol=1e-12)


def inputs_for(rng, shape, dtype):
    yield tie_heavy(rng, shape).astype(dtype)  # many ties
    yield rng.normal(size=shape).astype(dtype)


POOLS = [
    (1, dict(kernel_size=2), (2, 3, 9)),
    (1, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), (3, 10)),
    (1, dict(kernel_size=3, stride=1, dilation=2, padding=1), (2, 2, 11)),
    (2, dict(kernel_size=2), (2, 3, 6, 8)),
    (2, dict(kernel_size=3, stride=2, padding=1), (2, 3, 9, 9)),
    (2, dict(kernel_size=2, stride=1), (1, 2, 5, 5)),
    (2, dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 1), dilation=(2, 1), ceil_mode=True), (3, 7, 8)),
    (3, dict(kernel_size=2), (1, 2, 4, 4, 4)),
    (3, dict(kernel_size=3, stride=2, padding=1), (1, 2, 5, 6, 5)),
    (3, dict(kernel_size=(1, 2, 3), stride=(1, 1, 2), ceil_mode=True), (2, 4, 5, 7)),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("d,params,shape", POOLS, ids=[f"{d}d-{p}" for d, p, _ in POOLS])
def test_max_pool_first_equals_torch(d, params, shape, dtype):
    rng = np.random.default_rng(0)
    fn = lambda t: getattr(F, f"max_pool{d}d")(t, **params)  # noqa: E731
    for x in inputs_for(rng, shape, dtype):
        y, _ = symgrad.load(f"max_pool{d}d", **params).forward(x)
        g_int = rng.integers(-4, 5, size=y.shape).astype(dtype)
        check(f"max_pool{d}d", params, "first", fn, [x], g_int)  # exact: integer sums
        # random gradients round when added: equal bit for bit, as windows add in PyTorch's order
        check(f"max_pool{d}d", params, "first", fn, [x], rng.normal(size=y.shape).astype(dtype))


def test_motivating_example_equals_torch():
    x = np.array([[[1.0, 2, 3], [4, 5, 6], [7, 8, 9]]])
    check("max_pool2d", dict(kernel_size=2, stride=1), "first",
          lambda t: F.max_pool2d(t, kernel_size=2, stride=1), [x], np.ones((1, 2, 2)))
    check("max_pool2d", dict(kernel_size=2, stride=1), "first",
          lambda t: F.max_pool2d(t, kernel_size=2, stride=1), [x], np.array([[[1.0, 2], [3, 4]]]))


@given(data=st.data())
@settings(max_examples=examples(default=12, slow=60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_max_pool_parameter_space_equals_torch(data):
    d = data.draw(st.integers(1, 3), label="dims")
    k = tuple(data.draw(st.integers(1, 3)) for _ in range(d))
    s = tuple(data.draw(st.integers(1, 3)) for _ in range(d))
    p = tuple(data.draw(st.integers(0, kk // 2)) for kk in k)
    dil = tuple(data.draw(st.integers(1, 2)) for _ in range(d))
    ceil = data.draw(st.booleans())
    batched = data.draw(st.booleans())
    spatial = tuple(data.draw(st.integers(1, 7)) for _ in range(d))
    shape = ((2, 2) if batched else (2,)) + spatial
    params = dict(kernel_size=k, stride=s, padding=p, dilation=dil, ceil_mode=ceil)
    x = tie_heavy(np.random.default_rng(data.draw(st.integers(0, 2**16))), shape)
    module = symgrad.load(f"max_pool{d}d", **params)
    try:
        ty = getattr(F, f"max_pool{d}d")(torch.tensor(x), **params)
    except RuntimeError:
        with pytest.raises(ValueError):  # symgrad refuses what PyTorch refuses
            module.forward(x)
        return
    try:
        module.forward(x)
    except ValueError as exc:
        assume("only padding" not in str(exc))  # PyTorch returns garbage there; symgrad refuses
        raise
    g = np.random.default_rng(1).integers(-3, 4, size=ty.shape).astype(np.float64)
    check(f"max_pool{d}d", params, "first", lambda t: getattr(F, f"max_pool{d}d")(t, **params), [x], g)


REDUCTIONS = [("amax", {}, (3, 4)), ("amax", {"dim": 1}, (3, 4, 5)), ("amax", {"dim": (0, 2), "keepdim": True}, (3, 4, 5)),
              ("amin", {"dim": -1}, (4, 6)), ("amin", {"dim": (1, 2)}, (2, 3, 4))]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("op,params,shape", REDUCTIONS, ids=[f"{o}-{p}" for o, p, _ in REDUCTIONS])
def test_reductions_split_equal_torch(op, params, shape, dtype):
    rng = np.random.default_rng(1)
    tdim = params.get("dim", ())
    fn = lambda t: getattr(torch, op)(t, dim=tdim, keepdim=params.get("keepdim", False))  # noqa: E731
    for x in inputs_for(rng, shape, dtype):
        y, _ = symgrad.load(op, ties="split", **params).forward(x)
        check(op, params, "split", fn, [x], rng.normal(size=y.shape).astype(dtype))


ELEMENTWISE_TORCH = [
    ("relu", {}, "first", lambda t: F.relu(t)),
    ("clamp", {"min": 0}, "first", lambda t: torch.clamp(t, min=0)),
    ("clamp", {"max": 1}, "first", lambda t: torch.clamp(t, max=1)),
    ("clamp", {"min": -1.0, "max": 2.0}, "first", lambda t: torch.clamp(t, min=-1.0, max=2.0)),
    ("clamp", {"min": 2.0, "max": -1.0}, "first", lambda t: torch.clamp(t, min=2.0, max=-1.0)),
    ("hardtanh", {}, "last", lambda t: F.hardtanh(t)),
    ("hardtanh", {"min_val": -2.0, "max_val": 1.0}, "last", lambda t: F.hardtanh(t, -2.0, 1.0)),
    ("relu6", {}, "last", lambda t: F.relu6(t)),
    ("leaky_relu", {}, "last", lambda t: F.leaky_relu(t)),
    ("leaky_relu", {"negative_slope": 0.5}, "last", lambda t: F.leaky_relu(t, 0.5)),
    ("leaky_relu", {"negative_slope": -0.5}, "last", lambda t: F.leaky_relu(t, -0.5)),
    ("leaky_relu", {"negative_slope": 2.0}, "last", lambda t: F.leaky_relu(t, 2.0)),
    ("abs", {}, "split", lambda t: torch.abs(t)),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("op,params,ties,fn", ELEMENTWISE_TORCH, ids=[f"{o}-{p}" for o, p, _, _ in ELEMENTWISE_TORCH])
def test_elementwise_equal_torch_at_kinks(op, params, ties, fn, dtype):
    rng = np.random.default_rng(2)
    kinks = np.array([-2.0, -1.0, -0.0, 0.0, 1.0, 2.0, 6.0, -np.inf, np.inf])
    x = np.concatenate([kinks, rng.normal(scale=4, size=40)]).astype(dtype)
    check(op, params, ties, fn, [x], rng.normal(size=x.shape).astype(dtype))


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 1), (4,)), ((2, 1, 3), (4, 1))])
def test_maximum_minimum_split_equal_torch(op, shapes):
    rng = np.random.default_rng(3)
    a, b = (tie_heavy(rng, s) for s in shapes)
    shape = np.broadcast_shapes(*shapes)
    check(op, {}, "split", getattr(torch, op), [a, b], rng.integers(-3, 4, size=shape).astype(np.float64))
    check(op, {}, "split", getattr(torch, op), [a, b], rng.normal(size=shape), exact=False)


@pytest.mark.parametrize("pieces", [2, 3])
def test_maxout_first_equals_torch_max_dim(pieces):
    rng = np.random.default_rng(4)
    x = tie_heavy(rng, (2, 2 * pieces * 2, 5))

    def fn(t):
        n, c, w = t.shape
        return t.view(n, c // pieces, pieces, w).max(dim=2).values

    check("maxout", {"pieces": pieces}, "first", fn, [x], rng.normal(size=(2, 4, 5)))


@pytest.mark.parametrize("d,params,shape", [
    (2, dict(kernel_size=3, stride=1, padding=1), (2, 3, 140, 130)),  # planes of 18200 windows
    (1, dict(kernel_size=3, stride=2, padding=1), (1, 2, 40001)),
    (2, dict(kernel_size=2), (3, 5, 130, 128)),  # disjoint, several blocks
    (3, dict(kernel_size=3, stride=2, padding=1), (2, 3, 17, 40, 40)),
])
def test_max_pool_large_inputs_equal_torch(d, params, shape):
    """Inputs larger than one block and than one scatter step (the other tests fit in one)."""
    rng = np.random.default_rng(5)
    x = tie_heavy(rng, shape, levels=50).astype(np.float32)
    fn = lambda t: getattr(F, f"max_pool{d}d")(t, **params)  # noqa: E731
    y, _ = symgrad.load(f"max_pool{d}d", **params).forward(x)
    check(f"max_pool{d}d", params, "first", fn, [x], rng.integers(-4, 5, size=y.shape).astype(np.float32))
