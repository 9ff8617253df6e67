"""symgrad.torch: PyTorch operators with autograd and double backward.

Oracles: PyTorch 2.13's own ops under convention="torch" (forward, grad and gradgrad, float64,
tie-heavy inputs with NaN, +-inf and +-0), torch.library.opcheck, and eager mode for
torch.compile.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import symgrad
from symgrad import api, backends, catalog

if os.environ.get("CI"):
    import torch
else:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

import symgrad.torch as st  # noqa: E402

from cuda_harness.check import _extra_shapes  # noqa: E402
from conftest import first_entry_of_each_op  # noqa: E402

F = torch.nn.functional
SPECIALS = [-np.inf, -6.0, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 6.0, 7.0, np.inf, np.nan]


def _maxout(t):
    n, c = t.shape[:2]
    return t.view(n, c // 2, 2, *t.shape[2:]).max(2).values


# (id, op, params, torch function, input shapes, values: "specials" | "ints" | "finite")
CASES = [
    ("relu", "relu", {}, F.relu, [(40,)], "specials"),
    ("clamp", "clamp", {"min": -1.0, "max": 2.0}, lambda t: torch.clamp(t, -1.0, 2.0), [(40,)], "specials"),
    ("clamp-min", "clamp", {"min": 0}, lambda t: torch.clamp(t, min=0), [(40,)], "specials"),
    # PyTorch's vectorized hardtanh/relu6 backward gives NaN lanes a 0 (tests/test_conventions.py)
    ("hardtanh", "hardtanh", {}, F.hardtanh, [(40,)], "finite"),
    ("relu6", "relu6", {}, F.relu6, [(40,)], "finite"),
    ("leaky_relu", "leaky_relu", {}, F.leaky_relu, [(40,)], "specials"),
    ("abs", "abs", {}, torch.abs, [(40,)], "specials"),
    ("maximum", "maximum", {}, torch.maximum, [(6, 5), (6, 5)], "specials"),
    ("minimum-broadcast", "minimum", {}, torch.minimum, [(6, 5), (5,)], "specials"),
    ("amax", "amax", {"dim": 1}, lambda t: torch.amax(t, 1), [(3, 4, 2)], "ints"),
    ("amin", "amin", {"dim": -1}, lambda t: torch.amin(t, -1), [(3, 5)], "ints"),
    ("max_pool1d", "max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1},
     lambda t: F.max_pool1d(t, 3, 2, 1), [(2, 3, 9)], "ints"),
    ("max_pool2d", "max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1},
     lambda t: F.max_pool2d(t, 3, 2, 1), [(2, 2, 7, 7)], "ints"),
    ("max_pool2d-overlap", "max_pool2d", {"kernel_size": 2, "stride": 1},
     lambda t: F.max_pool2d(t, 2, 1), [(1, 2, 5, 5)], "ints"),
    ("max_pool3d", "max_pool3d", {"kernel_size": 2}, lambda t: F.max_pool3d(t, 2), [(1, 2, 4, 4, 4)], "ints"),
    ("adaptive_max_pool1d", "adaptive_max_pool1d", {"output_size": 3},
     lambda t: F.adaptive_max_pool1d(t, 3), [(2, 3, 8)], "ints"),
    ("adaptive_max_pool2d", "adaptive_max_pool2d", {"output_size": (3, 2)},
     lambda t: F.adaptive_max_pool2d(t, (3, 2)), [(2, 2, 7, 5)], "ints"),
    ("adaptive_max_pool3d", "adaptive_max_pool3d", {"output_size": 2},
     lambda t: F.adaptive_max_pool3d(t, 2), [(1, 2, 3, 5, 4)], "ints"),
    ("maxout", "maxout", {"pieces": 2}, _maxout, [(2, 6, 3)], "ints"),
]


def _values(rng, shape, kind):
    if kind == "ints":
        x = rng.integers(0, 3, size=shape).astype(np.float64)
        where = rng.random(shape) < 0.15
        x[where] = rng.choice([np.nan, np.inf, -np.inf, -0.0], size=int(where.sum()))
        return x
    values = [v for v in SPECIALS if kind == "specials" or np.isfinite(v)]
    return rng.choice(values, size=shape)


def _grads(rng, shape):
    """Multiples of 12: every split among up to 4 tied elements is exact, so sums of any order
    agree (bit equality then tests the policy, not an accumulation order)."""
    return rng.integers(-3, 4, size=shape).astype(np.float64) * 12


def _run(fn, inputs, g, v):
    """Forward, grad, and the gradgrad of <grad, v> with respect to grad_output and the inputs."""
    ts = [torch.tensor(x, requires_grad=x.dtype.kind == "f") for x in inputs]
    floats = [t for t in ts if t.requires_grad]
    y = fn(*ts)
    go = torch.tensor(g, requires_grad=True)
    grads = torch.autograd.grad(y, floats, go, create_graph=True)
    s = sum((gr * torch.tensor(vi)).sum() for gr, vi in zip(grads, v))
    second = torch.autograd.grad(s, [go] + floats, allow_unused=True)
    second = [np.zeros(t.shape) if d is None else d.detach().numpy(force=True) for d, t in zip(second, [go] + floats)]
    return [y.detach().numpy()] + [gr.detach().numpy() for gr in grads] + second


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_torch_convention_equals_pytorch(case):
    _, name, params, torch_fn, shapes, kind = case
    rng = np.random.default_rng(0)
    ours = st.op(name, convention="torch", **params)
    for _ in range(4):
        inputs = [_values(rng, s, kind) for s in shapes]
        y = torch_fn(*[torch.tensor(x) for x in inputs]).numpy()
        g = _grads(rng, y.shape)
        v = [_grads(rng, x.shape) for x in inputs]
        got, want = _run(ours, inputs, g, v), _run(torch_fn, inputs, g, v)
        for k, (a, b) in enumerate(zip(got, want)):
            assert a.shape == b.shape, (k, a.shape, b.shape)
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: result {k}")  # NaN == NaN, 0.0 == -0.0


@pytest.mark.parametrize("d", [1, 2])
def test_max_unpool_equals_pytorch(d):
    rng = np.random.default_rng(1)
    shape = (2, 2) + (6,) * d
    x = rng.integers(0, 3, size=shape).astype(np.float64)
    pool = getattr(F, f"max_pool{d}d")
    # overlapping windows (k3 s1): one element can win several windows: duplicate indices
    pooled, indices = pool(torch.tensor(x), 3, 1, return_indices=True)
    unpool = lambda p, i: getattr(F, f"max_unpool{d}d")(p, i, 3, 1)  # noqa: E731
    ours = st.op(f"max_unpool{d}d", convention="torch", kernel_size=3, stride=1)
    inputs = [pooled.numpy(), indices.numpy()]
    g = _grads(rng, unpool(pooled, indices).shape)
    v = [_grads(rng, pooled.shape)]
    for a, b in zip(_run(ours, inputs, g, v), _run(unpool, inputs, g, v)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_logsumexp_matches_pytorch_to_rounding_and_has_double_backward(temperature):
    """exp and log round differently from PyTorch's: equal to a few ulps, not bit for bit."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 5))
    ours = st.op("logsumexp", dim=-1, temperature=temperature)

    def theirs(t):
        return temperature * torch.logsumexp(t / temperature, -1)
    g, v = rng.standard_normal(3), [rng.standard_normal((3, 5))]
    for a, b in zip(_run(ours, [x], g, v), _run(theirs, [x], g, v)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)
    bad = st.expr("x*y + Max(x, 0)", inputs=["x", "y"])
    t = torch.ones(3, dtype=torch.float64, requires_grad=True)
    (gx, _) = torch.autograd.grad(bad(t, t).sum(), (t, t), create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward is supported for piecewise-linear ops and logsumexp"):
        torch.autograd.grad(gx.sum(), t)


def test_expression_op_gradients_and_double_backward():
    f = st.expr("Max(x, 2*y, 0) - Min(x, y)", inputs=["x", "y"], ties="split")
    rng = np.random.default_rng(3)
    x, y = (torch.tensor(rng.integers(-2, 3, size=(4, 5)).astype(np.float64), requires_grad=True)
            for _ in range(2))
    out = f(x, y)
    ref = torch.maximum(torch.maximum(x, 2 * y), torch.zeros(())) - torch.minimum(x, y)
    np.testing.assert_array_equal(out.detach().numpy(), ref.detach().numpy())
    module = symgrad.load_expr("Max(x, 2*y, 0) - Min(x, y)", inputs=["x", "y"], ties="split")
    _, saved = module.forward(x.detach().numpy(), y.detach().numpy())
    g = torch.ones_like(out, requires_grad=True)
    gx, gy = torch.autograd.grad(out, (x, y), g, create_graph=True)
    want = module.backward(np.ones((4, 5)), saved)
    np.testing.assert_array_equal(gx.detach().numpy(), want[0])
    np.testing.assert_array_equal(gy.detach().numpy(), want[1])
    vx, vy = torch.ones(4, 5, dtype=torch.float64), 2 * torch.ones(4, 5, dtype=torch.float64)
    (gg,) = torch.autograd.grad((gx * vx + gy * vy).sum(), g)
    np.testing.assert_array_equal(gg.numpy(), module.jvp(vx.numpy(), vy.numpy(), saved))


def _catalog_inputs(entry, rng):
    kind = entry.spec.kind
    if kind == "unpool":
        d = entry.spec.spatial
        k, stride, padding = (entry.params[n][0] for n in ("kernel_size", "stride", "padding"))
        # an input length that unpooling restores: (out - 1) * stride - 2 * padding + k
        length = next(n for n in range(4, 12) if ((n + 2 * padding - k) // stride) * stride - 2 * padding + k == n)
        x = torch.tensor(rng.integers(0, 3, size=(1, 2) + (length,) * d).astype(np.float64))
        pooled, indices = getattr(F, f"max_pool{d}d")(x, k, stride, padding, return_indices=True)
        return [pooled, indices]
    if kind == "logsumexp":
        return [torch.tensor(rng.standard_normal((3, 4, 5)))]
    if kind == "segment":  # (input, index, src) of scatter_reduce; (data, segment_ids) of segment_max
        ties = rng.integers(0, 3, size=(6, 3)).astype(np.float64)
        if "include_self" in entry.params:  # index along dim 0 into 4 slots (slot 3 left empty)
            return [torch.tensor(rng.integers(0, 3, size=(4, 3)).astype(np.float64)),
                    torch.tensor(rng.integers(0, 3, size=(6, 3))), torch.tensor(ties)]
        if "indptr" in entry.spec.inputs:  # CSR offsets: segments of 2, 0 and 4 rows
            return [torch.tensor(ties), torch.tensor([0, 2, 2, 6])]
        return [torch.tensor(ties), torch.tensor(np.sort(rng.integers(0, 3, size=6)))]
    if kind == "bag":  # (input, weight, offsets) of embedding_bag: an empty bag, repeated rows
        return [torch.tensor(rng.integers(0, 4, size=7)), torch.tensor(rng.integers(0, 3, size=(4, 3)).astype(np.float64)),
                torch.tensor([0, 3, 3])]
    if kind == "roi":  # (input, boxes) of roi_pool: overlapping boxes
        return [torch.tensor(rng.integers(0, 3, size=(1, 2, 5, 5)).astype(np.float64)),
                torch.tensor([[0.0, 0, 0, 4, 4], [0.0, 1, 1, 3, 4]])]
    # fractional pooling's samples (no gradient) lie in [0, 1)
    return [torch.tensor(rng.random(s) if name in entry.spec.constant_inputs else
                         rng.integers(0, 3, size=s).astype(np.float64))
            for name, s in zip(entry.spec.inputs, _extra_shapes(entry))]


ORDER_STATISTICS = ("sort", "topk", "cummax", "cummin", "kthvalue", "median", "nanmedian")


@pytest.mark.parametrize("entry", [  # (the order statistics' (values, indices) since wrap returns both: -m slow)
    pytest.param(e, marks=pytest.mark.slow) if getattr(e, "name", None) in ORDER_STATISTICS else e
    for e in first_entry_of_each_op(catalog.entries())], ids=lambda e: f"{e.name}-{e.ties}-{e.params}")
def test_opcheck_every_catalog_op(entry):
    rng = np.random.default_rng(4)
    f = st.wrap(api._load(entry, backends.get("numpy")))
    inputs = _catalog_inputs(entry, rng)
    forward, backward, jvp = f._ops
    # every check opcheck has (schema, autograd registration, fake tensors, AOT dispatch with
    # dynamic shapes) on forward and backward (its autograd is double backward); jvp has no autograd
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(forward, ([t.requires_grad_(t.dtype.is_floating_point) for t in inputs],))
    with torch.no_grad():
        out, *arrays = forward([t.detach() for t in inputs])
    plain = [t.detach() for t in inputs]
    g = torch.ones_like(out)
    # the AOT check differentiates backward (double backward), which symgrad.torch refuses for a
    # backward smooth in the inputs (margin_ranking_loss's target gradient -(input1 - input2) * ...)
    smooth = not f.module.PIECEWISE_LINEAR and entry.name != "logsumexp"
    torch.library.opcheck(backward, (g.requires_grad_(), plain, out, arrays),
                          **({"test_utils": checks} if smooth else {}))
    tangents = [torch.ones_like(plain[k]) for k in f._differentiable]
    torch.library.opcheck(jvp, (tangents, plain, out, arrays), test_utils=checks)


@pytest.mark.slow  # 70 s under Inductor; test_symgrad_torch_native compiles fullgraph first in a fresh process by default
def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    pool = st.MaxPool2d(3, 2, 1, ties="split")
    relu = st.ReLU()
    mix = st.expr("Max(x, 0.5*x)", inputs=["x"])
    conv = torch.nn.Conv2d(2, 3, 3, padding=1).double()

    def model(x):
        return mix(relu(pool(conv(x)))).square().sum()

    x = torch.randn(2, 2, 8, 8, dtype=torch.float64).round()  # ties in the pooling windows
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    eager_loss = model(x)
    eager = torch.autograd.grad(eager_loss, list(conv.parameters()))
    compiled_loss = compiled(x)
    got = torch.autograd.grad(compiled_loss, list(conv.parameters()))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-12, atol=1e-12)  # inductor may reorder the sum
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# Run in a fresh process: torch.compile before any eager call (the fake implementation's first
# layout and dtype look-ups happen under fake mode), every nn.Module, static and dynamic shapes.
# aot_eager traces forward and backward through the fake implementations as inductor does, faster.
_COMPILE_FIRST = """
import torch
import symgrad.torch as st
F = torch.nn.functional
torch.manual_seed(0)
x1 = torch.randn(2, 3, 9, dtype=torch.float64).round()
x2 = torch.randn(2, 3, 8, 8, dtype=torch.float64).round()
x3 = torch.randn(1, 2, 4, 4, 4, dtype=torch.float64).round()
nodes, batch = torch.randn(7, 3, dtype=torch.float64).round(), torch.tensor([0, 0, 1, 1, 1, 2, 2])

class Graphs(torch.nn.Module):  # GlobalMaxPool with the number of graphs given (no eager read)
    def __init__(self):
        super().__init__()
        self.pool = st.GlobalMaxPool(ties="split")

    def forward(self, x, batch):
        return self.pool(x, batch, 3)

class Bags(torch.nn.Module):  # EmbeddingBag with its table given, so that the gradient reaches it
    def __init__(self):
        super().__init__()
        self.bag = st.EmbeddingBag(5, 3, mode="max", ties="split")

    def forward(self, weight, input, offsets):
        return torch.func.functional_call(self.bag, {"weight": weight}, (input, offsets))

table = torch.randn(5, 3, dtype=torch.float64).round()
rois = torch.tensor([[0, 0.0, 0.0, 5.0, 5.0], [1, 2.0, 1.0, 7.0, 6.0]], dtype=torch.float64)

cases = {
    "MaxPool1d": (st.MaxPool1d(3, 2, 1), (x1,)),
    "MaxPool2d": (st.MaxPool2d(3, 2, 1, ties="split"), (x2,)),
    "MaxPool3d": (st.MaxPool3d(2), (x3,)),
    "AdaptiveMaxPool1d": (st.AdaptiveMaxPool1d(4), (x1,)),
    "AdaptiveMaxPool2d": (st.AdaptiveMaxPool2d((3, 2)), (x2,)),
    "AdaptiveMaxPool3d": (st.AdaptiveMaxPool3d(2), (x3,)),
    "MaxUnpool1d": (st.MaxUnpool1d(2), F.max_pool1d(x1[..., :8], 2, return_indices=True)),
    "MaxUnpool2d": (st.MaxUnpool2d(2), F.max_pool2d(x2, 2, return_indices=True)),
    "MaxUnpool3d": (st.MaxUnpool3d(2), F.max_pool3d(x3, 2, return_indices=True)),
    "ReLU": (st.ReLU(), (x2,)), "ReLU6": (st.ReLU6(), (x2,)),
    "Hardtanh": (st.Hardtanh(-0.5, 0.5), (x2,)), "LeakyReLU": (st.LeakyReLU(0.2), (x2,)),
    "GlobalMaxPool": (Graphs(), (nodes, batch)),
    "EmbeddingBag": (Bags(), (table, torch.tensor([0, 2, 2, 4, 1, 3]), torch.tensor([0, 2, 4]))),
    "RoIPool": (st.RoIPool(2, 1.0, ties="split"), (x2, rois)),
}
modules = {n for n in st.__all__ if isinstance(getattr(st, n), type) and issubclass(getattr(st, n), torch.nn.Module)}
assert set(cases) == modules, sorted(modules ^ set(cases))

def run(module, inputs):
    ins = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    y = module(*ins)
    (g,) = torch.autograd.grad(y.square().sum(), ins[0])
    return y.detach(), g

results = {}
for dynamic in (False, True):
    for name, (module, inputs) in cases.items():
        torch._dynamo.reset()  # one module class's forward serves several: no recompile limit
        compiled = torch.compile(module, fullgraph=True, dynamic=dynamic, backend="aot_eager")
        results[name, dynamic] = run(compiled, inputs)
for (name, dynamic), got in results.items():  # eager, only now
    module, inputs = cases[name]
    for a, b in zip(got, run(module, inputs)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"{name} dynamic={dynamic}: {m}")
# the index-window modules ran the torch backend's modules under compile (the native path)
assert all(fn._native is not None for fn in (cases["GlobalMaxPool"][0].pool.fn, cases["EmbeddingBag"][0].bag.fn,
                                               cases["RoIPool"][0].fn))
print("compiled first:", len(results))
"""


@pytest.mark.slow  # 61 s; test_symgrad_torch_native compiles first in a fresh process (static, dynamic) by default
def test_torch_compile_first_in_a_fresh_process_every_nn_module():
    """torch.compile(fullgraph=True), static and dynamic=True, of every nn.Module that
    symgrad.torch exports, before any eager call, in a fresh process: forward and gradient equal
    eager mode's (run afterwards)."""
    out = subprocess.run([sys.executable, "-c", _COMPILE_FIRST], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "compiled first: 32" in out.stdout


def test_nn_modules_match_torch_nn():
    rng = np.random.default_rng(5)
    x = torch.tensor(rng.standard_normal((2, 3, 9, 9)))
    pairs = [
        (st.MaxPool2d(3, stride=2, padding=1), torch.nn.MaxPool2d(3, stride=2, padding=1)),
        (st.MaxPool2d(2, ceil_mode=True), torch.nn.MaxPool2d(2, ceil_mode=True)),
        (st.AdaptiveMaxPool2d((4, 3)), torch.nn.AdaptiveMaxPool2d((4, 3))),
        (st.ReLU(), torch.nn.ReLU()), (st.ReLU6(), torch.nn.ReLU6()),
        (st.Hardtanh(-0.5, 0.5), torch.nn.Hardtanh(-0.5, 0.5)),
        (st.LeakyReLU(0.2), torch.nn.LeakyReLU(0.2)),
    ]
    for ours, theirs in pairs:
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    x1 = torch.tensor(rng.standard_normal((2, 3, 9)))
    torch.testing.assert_close(st.MaxPool1d(3)(x1), torch.nn.MaxPool1d(3)(x1), rtol=0, atol=0)
    torch.testing.assert_close(st.AdaptiveMaxPool1d(4)(x1), torch.nn.AdaptiveMaxPool1d(4)(x1), rtol=0, atol=0)
    x3 = torch.tensor(rng.standard_normal((1, 2, 4, 4, 4)))
    torch.testing.assert_close(st.MaxPool3d(2)(x3), torch.nn.MaxPool3d(2)(x3), rtol=0, atol=0)
    torch.testing.assert_close(st.AdaptiveMaxPool3d(2)(x3), torch.nn.AdaptiveMaxPool3d(2)(x3), rtol=0, atol=0)
    pooled, indices = F.max_pool2d(x[..., :8, :8], 2, return_indices=True)
    torch.testing.assert_close(st.MaxUnpool2d(2)(pooled, indices), torch.nn.MaxUnpool2d(2)(pooled, indices))
    pooled, indices = F.max_pool2d(x, 2, return_indices=True)  # 9 x 9: output_size says so
    for size in ((9, 9), x.shape):  # torch.nn also takes the full (N, C, H, W) size
        torch.testing.assert_close(st.MaxUnpool2d(2)(pooled, indices, output_size=size),
                                   torch.nn.MaxUnpool2d(2)(pooled, indices, output_size=size))


def test_policy_reaches_the_gradient():
    x = torch.tensor([[[1.0, 1.0, 0.0, 0.0]]], requires_grad=True)
    for ties, want in (("first", [1, 0, 1, 0]), ("last", [0, 1, 0, 1]), ("split", [0.5, 0.5, 0.5, 0.5])):
        (g,) = torch.autograd.grad(st.MaxPool1d(2, ties=ties)(x).sum(), x)
        assert g[0, 0].tolist() == want, ties


def test_float32_and_float16_keep_their_dtype():
    f = st.op("max_pool2d", kernel_size=2)
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(1, 2, 4, 4, dtype=dtype, requires_grad=True)
        y = f(x)
        (g,) = torch.autograd.grad(y.sum(), x)
        assert y.dtype == dtype and g.dtype == dtype and g.shape == x.shape


def test_errors():
    f = st.op("relu")
    with pytest.raises(TypeError, match="x must be a float16, bfloat16, float32 or float64 tensor, got torch.int64"):
        f(torch.ones(3, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"expected 1 tensor\(s\) \(x\), got 2"):
        f(torch.ones(3), torch.ones(3))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        f(np.ones(3))
    with pytest.raises(ValueError, match="kernel_size"):
        st.op("max_pool2d", kernel_size=0)
    with pytest.raises(ValueError, match="inplace=True is not supported"):
        st.ReLU(inplace=True)
    with pytest.raises(TypeError, match="expected a generated NumPy module"):
        st.wrap(object())


NN_MODULES = ["MaxPool1d", "MaxPool2d", "MaxPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
              "AdaptiveMaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d", "ReLU", "ReLU6",
              "Hardtanh", "LeakyReLU"]


@pytest.mark.parametrize("name", NN_MODULES)
def test_misspelled_names_get_did_you_mean(name):
    """A misspelled keyword (each of torch.nn's constructor parameters and ties=, one letter off)
    is a one-line TypeError suggesting the right name and naming every name the constructor
    takes (torch.nn's, whose signature is the oracle, then symgrad's settings)."""
    import inspect
    required = {"kernel_size": 2, "output_size": 2}
    deprecated = {"min_value", "max_value"}  # torch.nn.Hardtanh's, deprecated: symgrad takes neither
    theirs = [n for n in inspect.signature(getattr(torch.nn, name)).parameters if n not in deprecated]
    for right in theirs + ["ties"]:
        args = {k: v for k, v in required.items() if k in theirs and k != right}
        with pytest.raises(TypeError) as err:
            getattr(st, name)(**args, **{right[:-1]: 1})
        message = str(err.value)
        assert "\n" not in message and f"did you mean {right!r}?" in message, message
        assert message.startswith(f"{name}: unexpected keyword argument {right[:-1]!r}")
        assert f"({name} takes {', '.join(theirs)}, ties, convention, nan, order)" in message


def test_misspelled_op_and_parameter_names_get_did_you_mean():
    """symgrad.load and symgrad.torch.op: the CLI's suggestion for an op name and a keyword."""
    cases = [(lambda: symgrad.load("max_pool2d", kernel_size=2, tie="split"), TypeError, "ties"),
             (lambda: symgrad.load("relu", backnd="numpy"), TypeError, "backend"),
             (lambda: symgrad.load("max_pol2d", kernel_size=2), ValueError, "max_pool2d"),
             (lambda: st.op("max_pool2d", kernel_size=2, strid=1), TypeError, "stride"),
             (lambda: st.op("max_pool2d", kernel_size=2, convension="torch"), TypeError, "convention"),
             (lambda: st.op("amx", dim=1), ValueError, "amax")]
    for call, kind, right in cases:
        with pytest.raises(kind) as err:
            call()
        assert "\n" not in str(err.value) and f"did you mean {right!r}?" in str(err.value), err.value
    with pytest.raises(TypeError, match=r"^relu: unexpected parameter 'zzz' \(relu takes backend, ties, "
                                        r"convention, nan, order\)$"):
        symgrad.load("relu", zzz=1)  # nothing close: no suggestion
    with pytest.raises(TypeError, match=r"takes kernel_size, .*, return_indices, ties, convention, nan, order\)$"):
        st.op("max_pool2d", kernel_size=2, backnd="cpu")  # symgrad.torch.op takes no backend=


def test_sparse_tensors_are_refused_in_one_line():
    f = st.op("relu")
    for t in (torch.ones(4).to_sparse(), torch.eye(3).to_sparse_csr()):
        with pytest.raises(TypeError, match=rf"^relu: x must be a dense \(strided\) tensor, got layout "
                                            rf"{t.layout} \(convert it with .to_dense\(\)\)$"):
            f(t)
    pool = st.MaxPool2d(2)
    with pytest.raises(TypeError, match="must be a dense"):
        pool(torch.ones(1, 1, 2, 2).to_sparse())


def test_import_symgrad_does_not_import_torch_and_a_missing_torch_is_explained():
    code = ("import sys; import symgrad; assert 'torch' not in sys.modules; sys.modules['torch'] = None\n"
            "try:\n    import symgrad.torch\nexcept ModuleNotFoundError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 'pip install ".[torch]" from symgrad\'s checkout' in out.stdout


def test_models_holding_symgrad_ops_pickle_whole(tmp_path):
    model = torch.nn.Sequential(st.MaxPool2d(2, ties="split"), st.ReLU(), torch.nn.Flatten())
    torch.save(model, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    x = torch.tensor([[[[1.0, 1.0], [0.0, -1.0]]]], requires_grad=True)
    (g,) = torch.autograd.grad(loaded(x).sum(), x)
    assert g.flatten().tolist() == [0.5, 0.5, 0.0, 0.0]
    with pytest.raises(TypeError, match="cannot be pickled"):
        import pickle
        pickle.dumps(st.wrap(symgrad.load("hardtanh", min_val=-3.0, max_val=3.0, ties="last")))


# ----------------------------------------------------------------------------- the cpu backend for CPU tensors

def _count_calls(monkeypatch, module, calls: list) -> None:
    """Record the cpu backend module's kernel calls (role names) in calls."""
    real = module._call

    def counted(role, *args):
        calls.append(role)
        return real(role, *args)
    monkeypatch.setattr(module, "_call", counted)


def _compiler() -> bool:
    import shutil
    return any(shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang")))


@pytest.mark.skipif(not _compiler(), reason="no C compiler: the cpu backend is not available")
@pytest.mark.parametrize("ties", ["first", "split"])
def test_cpu_tensors_run_through_the_cpu_backend_with_the_numpy_modules_bits(monkeypatch, ties):
    """SYMGRAD_CPU_BACKEND=cpu (and the default, auto, with a compiler) runs CPU tensors through
    the cpu backend's kernels; =numpy through the NumPy module: the same output, gradient and
    second-order gradient bit for bit (float32 and float64; NCHW and channels-last inputs);
    float16 stays with the NumPy module."""
    settings = {"ties": ties, "kernel_size": 3, "stride": 2, "padding": 1}
    f = st.op("max_pool2d", **settings)
    monkeypatch.setattr(f, "_cpu", {})  # the choices made from now on
    calls = []
    rng = np.random.default_rng(5)
    x0 = torch.from_numpy(rng.integers(0, 3, size=(2, 3, 9, 8)).astype(np.float64))
    g0 = torch.from_numpy(rng.standard_normal((2, 3, 5, 4)))
    results = {}
    for choice in ("numpy", "cpu", "auto"):
        monkeypatch.setenv("SYMGRAD_CPU_BACKEND", choice)
        module = f._backend([x0.float()])[0]  # the module float32 CPU tensors reach
        # auto: the cpu backend, split's too (its saved state also holds the counts)
        on_cpu = choice in ("cpu", "auto")
        assert (module is not f.module) == on_cpu and f._backend([x0.half()])[0] is f.module
        if on_cpu:
            _count_calls(monkeypatch, module, calls)
        for dtype in (torch.float32, torch.float64, torch.float16):
            for cl in (False, True):
                x = x0.to(dtype)
                x = x.to(memory_format=torch.channels_last) if cl else x.clone()
                x.requires_grad_(True)
                y = f(x)
                (gx,) = torch.autograd.grad(y, x, g0.to(dtype), create_graph=True)
                (ggx,) = torch.autograd.grad((gx * x.detach()).sum(), x, allow_unused=True)
                key = (dtype, cl)
                got = [y.detach().numpy().tobytes(), gx.detach().contiguous().numpy().tobytes(),
                       None if ggx is None else ggx.contiguous().numpy().tobytes()]
                results.setdefault(key, {})[choice] = got
        if not on_cpu:
            assert calls == []
        else:
            assert "forward" in calls and "backward" in calls, calls
            calls.clear()
    for key, by_choice in results.items():
        assert by_choice["cpu"] == by_choice["numpy"] == by_choice["auto"], key


@pytest.mark.parametrize("choice", ["auto", "cpu"])
def test_without_a_compiler_cpu_tensors_fall_back_to_numpy(monkeypatch, tmp_path, choice):
    """No C compiler: auto runs CPU tensors through the NumPy module (the same results); cpu
    raises the cpu backend's error naming what to install; an unknown setting is a ValueError."""
    settings = {"kernel_size": 2, "stride": 1, "padding": 1, "ties": "last"}
    module = symgrad.load("max_pool2d", backend="cpu", **settings)
    monkeypatch.setattr(module, "_library", None)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    monkeypatch.setenv("SYMGRAD_CPU_BACKEND", choice)
    f = st.op("max_pool2d", **settings)
    x = torch.arange(24.0).reshape(1, 2, 3, 4).requires_grad_(True)
    if choice == "cpu":
        with pytest.raises(RuntimeError, match=r"needs a C compiler .* install one"):
            f(x)
        return
    y = f(x)
    y.sum().backward()
    numpy_module = symgrad.load("max_pool2d", **settings)
    want, saved = numpy_module.forward(x.detach().numpy())
    assert np.array_equal(y.detach().numpy(), want)
    assert np.array_equal(x.grad.numpy(), numpy_module.backward(np.ones_like(want), saved)[0])
    monkeypatch.setenv("SYMGRAD_CPU_BACKEND", "fast")
    with pytest.raises(ValueError, match="SYMGRAD_CPU_BACKEND must be one of auto, cpu, numpy"):
        f(x)


@pytest.mark.skipif(not _compiler(), reason="no C compiler: the cpu backend is not available")
@pytest.mark.parametrize("ties", ["first", pytest.param("split", marks=pytest.mark.slow)])
def test_torch_compile_traces_the_cpu_backends_ops(monkeypatch, ties):
    """torch.compile(fullgraph=True) of a model whose pooling runs on the cpu backend (its fake
    implementation from the cpu module's saved state: split's also holds the counts) gives eager
    mode's loss and gradients."""
    monkeypatch.setenv("SYMGRAD_CPU_BACKEND", "auto")
    torch.manual_seed(1)
    pool = st.MaxPool2d(3, 2, 1, ties=ties)
    monkeypatch.setattr(pool.fn, "_cpu", {})
    conv = torch.nn.Conv2d(2, 3, 3, padding=1).double()

    def model(x):
        return pool(conv(x)).square().sum()
    x = torch.randn(2, 2, 8, 8, dtype=torch.float64).round()
    eager_loss = model(x)
    eager = torch.autograd.grad(eager_loss, list(conv.parameters()))
    assert pool.fn._backend([x])[0] is not pool.fn.module  # the cpu backend's module
    compiled_loss = torch.compile(model, fullgraph=True, backend="inductor")(x)
    got = torch.autograd.grad(compiled_loss, list(conv.parameters()))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("choice", ["numpy", "cpu"])
def test_amax_double_backward_is_pytorchs_bit_for_bit(monkeypatch, choice):
    """amax/amin under the torch preset: the gradient of the gradient in grad_output (backward's
    derivative, the module's jvp) equals PyTorch's bit for bit: PyTorch differentiates
    (g / count) * mask, so its sum(v * mask) is at::sum's (cascade sum: vector lanes, four
    interleaved partial sums, blocks of columns) and one division by the count follows.  Tie-heavy
    float32/float64 input, dims -1 and 0, rows shorter and longer than a vector, column counts on
    both sides of a block of vectors; the NumPy module and the cpu backend."""
    if choice == "cpu" and not _compiler():
        pytest.skip("no C compiler: the cpu backend is not available")
    monkeypatch.setenv("SYMGRAD_CPU_BACKEND", choice)
    rng = np.random.default_rng(14)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (inputs this small are summed on one thread anyway)
    try:
        for name, reference in (("amax", torch.amax), ("amin", torch.amin)):
            for dim, shapes in ((-1, [(6, 3), (5, 9), (4, 17), (3, 40), (2, 75)]),
                                (0, [(9, 6), (40, 3), (7, 37), (5, 70), (17, 3, 5)])):
                f = st.op(name, dim=dim, convention="torch")
                monkeypatch.setattr(f, "_cpu", {})  # the choice made from now on
                for shape in shapes:
                    x0 = rng.integers(0, 3, size=shape).astype(np.float64)  # ties everywhere
                    g0 = rng.standard_normal(np.amax(x0, axis=dim).shape)
                    v0 = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, size=shape)
                    for dtype in (torch.float32, torch.float64):
                        assert (f._backend([torch.zeros(1, dtype=dtype)])[0] is not f.module) == (choice == "cpu")
                        got = []
                        for fn in (f, lambda t: reference(t, dim)):
                            x = torch.tensor(x0, dtype=dtype, requires_grad=True)
                            g = torch.tensor(g0, dtype=dtype, requires_grad=True)
                            (gx,) = torch.autograd.grad(fn(x), x, g, create_graph=True)
                            (gg,) = torch.autograd.grad(gx, g, torch.tensor(v0, dtype=dtype))
                            got.append(gg.numpy().tobytes())
                        assert got[0] == got[1], (name, dim, shape, dtype)
    finally:
        torch.set_num_threads(threads)


# float64 first: the cpu backend's module (where a C compiler is found); float16 split: the NumPy module
@pytest.mark.parametrize("ties, dtype", [("first", torch.float64), ("split", torch.float16)])
def test_eager_backward_hands_the_saved_value_back_as_it_is(monkeypatch, ties, dtype):
    """Eager first-order autograd keeps the module's Saved value and hands it to its backward: no
    flattening into tensors and back (bridge.split/join, the per-call work of an eager step); the
    output and gradient equal the NumPy module's own, bit for bit, on a tie-heavy input; autograd still refuses an input edited in place since the forward and a second
    backward of a freed graph, and retain_graph gives the same gradient twice."""
    f = st.op("max_pool2d", kernel_size=3, stride=2, padding=1, ties=ties)
    numpy_module = symgrad.load("max_pool2d", kernel_size=3, stride=2, padding=1, ties=ties)
    rng = np.random.default_rng(21)
    x0 = rng.integers(0, 3, size=(2, 3, 7, 6)).astype(np.float64)
    f(torch.from_numpy(x0).to(dtype))  # (any layout made before the check below)

    def refused(*args):
        raise AssertionError("bridge.split/join ran in an eager first-order call")
    monkeypatch.setattr(st.bridge, "split", refused)
    monkeypatch.setattr(st.bridge, "join", refused)
    x = torch.from_numpy(x0).to(dtype).requires_grad_()
    with torch.no_grad():
        no_graph = f(x)
    y = f(x)
    assert no_graph.numpy().tobytes() == y.detach().numpy().tobytes()
    g0 = rng.standard_normal(tuple(y.shape))
    g = torch.from_numpy(g0).to(dtype)
    y.backward(g, retain_graph=True)
    first = x.grad.clone()
    x.grad = None
    y.backward(g)
    want_y, saved = numpy_module.forward(x0.astype(first.numpy().dtype))
    (want_gx,) = numpy_module.backward(g0.astype(want_y.dtype), saved)
    assert y.detach().numpy().tobytes() == want_y.tobytes()
    assert first.numpy().tobytes() == x.grad.numpy().tobytes() == want_gx.tobytes()
    with pytest.raises(RuntimeError, match="freed|second time"):
        y.backward(g)
    x2 = torch.from_numpy(x0).to(dtype).requires_grad_()
    leaf = x2 * 1
    y2 = f(leaf)
    with torch.no_grad():
        leaf.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y2.backward(g)
