"""The torch backend's adaptive max pooling (windows "spans"): forward, Saved, backward and jvp bit
for bit equal to the NumPy backend's module (itself checked against brute force and PyTorch in
test_adaptive) on tie-heavy inputs (+-0, +-inf, NaN), every policy, NaN rule and preset, float16,
bfloat16, float32 and float64; the NumPy module run under both of its strategies (one whole-row
call per window, and the box passes), so the oracle is not only the algorithm the torch module
prints; PyTorch's indices; plain torch code; torch.compile(fullgraph=True)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import symgrad  # noqa: E402
import symgrad.ops  # noqa: E402
import symgrad.pipeline  # noqa: E402
from symgrad import backends  # noqa: E402
from test_torch_backend import _check_window, _code_only, _same, _window_id, _window_variants  # noqa: E402

ADAPTIVES = [("adaptive_max_pool2d", {"output_size": (3, 4)}, (2, 3, 7, 6)),
             ("adaptive_max_pool1d", {"output_size": 4}, (2, 3, 9)),
             ("adaptive_max_pool3d", {"output_size": 2}, (1, 2, 3, 5, 4)),  # a coordinate in every window
             ("adaptive_max_pool2d", {"output_size": (5, None), "return_indices": True}, (2, 3, 3, 6)),
             ("adaptive_max_pool2d", {"output_size": 1}, (2, 4, 5, 5))]  # the benchmark CNN's


@contextlib.contextmanager
def _numpy_strategy(name, kw, strategy):
    """The NumPy module with its STRATEGY set ("window": whole-row calls; "box": the box passes)."""
    mod = symgrad.load(name, **kw)
    before, mod.STRATEGY = mod.STRATEGY, strategy
    try:
        yield
    finally:
        mod.STRATEGY = before


def _check(name, kw, shape, strategy):
    with _numpy_strategy(name, kw, strategy):
        _check_window(name, kw, shape)


def _variants():
    for name, kw, shape in _window_variants(ADAPTIVES):
        if kw.get("return_indices") and (kw.get("ties") in ("split", "all") or kw.get("convention") == "jax"):
            continue  # return_indices needs one winner per window
        yield name, kw, shape


REPRESENTATIVE = [
    ("adaptive_max_pool2d", {"output_size": (3, 4), "ties": "first", "nan": "keep"}, (2, 3, 7, 6)),
    ("adaptive_max_pool2d", {"output_size": (3, 4), "ties": "last", "nan": "replace"}, (2, 3, 7, 6)),
    ("adaptive_max_pool1d", {"output_size": 4, "ties": "split"}, (2, 3, 9)),
    ("adaptive_max_pool1d", {"output_size": 4, "ties": "all", "nan": "zero"}, (2, 3, 9)),
    ("adaptive_max_pool3d", {"output_size": 2, "convention": "jax"}, (1, 2, 3, 5, 4)),
    ("adaptive_max_pool2d", {"output_size": (5, None), "return_indices": True, "convention": "torch"}, (2, 3, 3, 6)),
    # output size 1 (global pooling): each plane one window, its winner in closed form (_adaptive_whole)
    ("adaptive_max_pool2d", {"output_size": 1, "ties": "first", "nan": "replace"}, (2, 4, 5, 5)),
    ("adaptive_max_pool2d", {"output_size": 1, "convention": "jax"}, (2, 4, 5, 5)),
]


@pytest.mark.parametrize("name,kw,shape", REPRESENTATIVE, ids=[_window_id(*c) for c in REPRESENTATIVE])
def test_adaptive_module_equals_numpy_module_bit_for_bit(name, kw, shape):
    _check(name, kw, shape, "window")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["window", "box"])
@pytest.mark.parametrize("name,kw,shape", list(_variants()), ids=[_window_id(*c) for c in _variants()])
def test_adaptive_module_equals_numpy_module_every_variant(name, kw, shape, strategy):
    _check(name, kw, shape, strategy)


def test_adaptive_module_is_plain_torch_code():
    """No NumPy, no host round trip, no .item(), no scatter or index_put."""
    for name, kw, _ in REPRESENTATIVE:
        ((_, src),) = symgrad.pipeline.render(symgrad.ops.resolve(name, **kw), backends.get("torch")).items()
        src = _code_only(src).replace(" . ", ".").replace(" (", "(").replace("( )", "()")
        for bad in ("import numpy", "np.", ".numpy(", ".item()", ".tolist()", ".cpu()", "scatter", "index_put",
                    "index_add", "put_(", "import symgrad"):
            assert bad not in src, (name, kw, bad)


def test_adaptive_module_refuses_a_wrong_saved():
    mod = symgrad.load("adaptive_max_pool2d", backend="torch", output_size=2, ties="first")
    _, saved = mod.forward(torch.zeros(1, 1, 4, 4))
    with pytest.raises(TypeError, match="saved.index must be a tensor of torch.uint8"):
        mod.backward(torch.ones(1, 1, 2, 2), saved._replace(index=saved.index.long()))
    with pytest.raises(ValueError, match=r"saved.index must have shape \(1, 1, 2, 2\)"):
        mod.backward(torch.ones(1, 1, 2, 2), saved._replace(index=saved.index.reshape(1, 4)))
    with pytest.raises(ValueError, match="grad_output must have the shape"):
        mod.backward(torch.ones(1, 1, 3, 2), saved)


@pytest.mark.slow  # (about 80 s of Inductor on the 2-core machine)
def test_adaptive_module_compiles_fullgraph():
    """torch.compile(fullgraph=True) of forward and backward from the first call: the same bits
    as eager (float64: Inductor's float32 reassociation aside)."""
    mod = symgrad.load("adaptive_max_pool2d", backend="torch", output_size=(2, 3), ties="split")
    x = torch.tensor(np.random.default_rng(0).choice([0.0, -0.0, 1.0, 2.0], size=(2, 3, 5, 7)))
    g = torch.randn(2, 3, 2, 3, dtype=torch.float64)

    def step(x, g):
        y, saved = mod.forward(x)
        return y, mod.backward(g, saved)[0]
    y, gx = torch.compile(step, fullgraph=True)(x, g)
    y_eager, gx_eager = step(x, g)
    _same(y, y_eager.numpy(), "forward")
    _same(gx, gx_eager.numpy(), "backward")


@pytest.mark.slow  # (symgrad.torch's import: about 6 s)
@pytest.mark.parametrize("kw", [{"ties": "split"}, {"convention": "jax"}])
def test_symgrad_torch_takes_the_adaptive_module_natively(kw):
    """symgrad.torch's adaptive pooling holds the torch module; its autograd.Function (eager form):
    forward, backward through autograd, double backward (the jvp) and forward-mode AD against the
    NumPy module bit for bit; on the meta device (as an accelerator's tensors reach it) the shapes."""
    import torch.autograd.forward_ad as fwAD

    import symgrad.torch as st
    fn = st.op("adaptive_max_pool2d", output_size=(3, 2), **kw)
    assert fn.torch_module is not None and fn.torch_module.OP == "adaptive_max_pool2d"
    mod = symgrad.load("adaptive_max_pool2d", output_size=(3, 2), **kw)
    a = np.random.default_rng(0).choice([-np.inf, -1.0, 0.0, -0.0, 1.0, 2.0], size=(2, 3, 7, 5)).astype(np.float32)
    x = torch.tensor(a, requires_grad=True)
    y = fn._native[0].apply(x)
    y_np, saved = mod.forward(a)
    _same(y, y_np, "forward")
    g = np.linspace(-1, 1, y_np.size).astype(np.float32).reshape(y_np.shape)
    gt = torch.tensor(g, requires_grad=True)
    (gx,) = torch.autograd.grad(y, x, gt, create_graph=True)
    _same(gx, mod.backward(g, saved)[0], "backward")
    (ggt,) = torch.autograd.grad(gx, gt, torch.ones_like(gx))  # d<backward(g), 1>/dg = jvp(1)
    _same(ggt, mod.jvp(np.ones_like(a), saved), "double backward")
    t = np.float32(0.5) * a.clip(-3, 3)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(fn._native[0].apply(fwAD.make_dual(torch.tensor(a), torch.tensor(t)))).tangent
    _same(tangent, mod.jvp(t, saved), "forward-mode")
    m = torch.empty(2, 3, 7, 5, device="meta", requires_grad=True)
    y = st.AdaptiveMaxPool2d((3, 2), **kw)(m)
    assert y.device.type == "meta" and tuple(y.shape) == (2, 3, 3, 2)
    (gm,) = torch.autograd.grad(y.sum(), m)
    assert gm.device.type == "meta" and gm.shape == m.shape


def test_a_box_of_more_than_256_elements_saves_uint16():
    """Output size 1 over a 20x15 plane: a box of 300 elements, its index in uint16 (as the NumPy
    module's), forward, backward and jvp as the NumPy module's."""
    a = np.random.default_rng(0).choice([0.0, 1.0, 2.0, -0.0], size=(2, 2, 20, 15)).astype(np.float32)
    np_mod = symgrad.load("adaptive_max_pool2d", output_size=1, ties="last")
    th_mod = symgrad.load("adaptive_max_pool2d", backend="torch", output_size=1, ties="last")
    y_np, s_np = np_mod.forward(a)
    y, s = th_mod.forward(torch.from_numpy(a))
    assert s.index.dtype == torch.uint16 and s_np.index.dtype == np.uint16
    assert np.array_equal(s.index.to(torch.int64).numpy(), s_np.index.astype(np.int64))
    _same(y, y_np, "forward")
    g = np.linspace(-1, 1, y_np.size).astype(np.float32).reshape(y_np.shape)
    _same(th_mod.backward(torch.from_numpy(g), s)[0], np_mod.backward(g, s_np)[0], "backward")
    _same(th_mod.jvp(torch.from_numpy(a), s), np_mod.jvp(a, s_np), "jvp")
