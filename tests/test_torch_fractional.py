"""The torch backend's fractional max pooling (windows "sampled"): forward, Saved, backward and
jvp bit for bit equal to the NumPy backend's module (itself checked against brute force and
PyTorch in test_fractional) on tie-heavy inputs (+-0, +-inf, NaN), every policy, NaN rule and
preset, float16, bfloat16, float32 and float64, the samples given as an input as the NumPy module
takes them; float16 samples whose rounded starts repeat (more windows hold a coordinate than a
window has elements); PyTorch's indices; plain torch code; torch.compile(fullgraph=True)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import symgrad  # noqa: E402
import symgrad.ops  # noqa: E402
import symgrad.pipeline  # noqa: E402
from symgrad import backends  # noqa: E402
from test_torch_backend import DTYPES, _code_only, _same, _tensor, _window_arrays, _window_id, _window_variants  # noqa: E402

FRACTIONALS = [("fractional_max_pool2d", {"kernel_size": 3, "output_ratio": 0.5}, (2, 3, 9, 8)),
               ("fractional_max_pool2d", {"kernel_size": (2, 1), "output_size": (4, 5), "return_indices": True},
                (3, 7, 9)),  # unbatched
               ("fractional_max_pool3d", {"kernel_size": 2, "output_size": (3, 2, 3)}, (1, 2, 5, 6, 7))]


def _samples(rng, shape, spatial, dtype):
    """random_samples (N, C, spatial) in [0, 1), as the NumPy module takes them."""
    batched = shape if len(shape) == spatial + 2 else (1,) + shape
    return rng.random(batched[:2] + (spatial,)).astype(dtype)


def _check(name, kw, shape, dtypes=tuple(DTYPES), samples=None) -> None:
    np_mod, th_mod = symgrad.load(name, **kw), symgrad.load(name, backend="torch", **kw)
    for dtype in dtypes:
        what = f"{name} {kw} {dtype}"
        a, rng = _window_arrays(shape, DTYPES[dtype][1], 0)
        u = _samples(rng, shape, np_mod.SPATIAL, a.dtype) if samples is None else samples.astype(a.dtype)
        y_np, s_np = np_mod.forward(a, u)
        y_th, s_th = th_mod.forward(_tensor(a, dtype), _tensor(u, dtype))
        if kw.get("return_indices"):  # (output, PyTorch's indices)
            (y_np, i_np), (y_th, i_th) = y_np, y_th
            assert i_th.dtype == torch.int64 and np.array_equal(i_th.numpy(), i_np), f"{what} indices"
        _same(y_th, y_np, f"{what} forward")
        if "index" in s_np._fields:  # the same Saved: one uint8 window-local index per output
            assert s_th.index.dtype == torch.uint8 and np.array_equal(s_th.index.numpy(), s_np.index), what
        g = rng.standard_normal(y_np.shape)
        g.ravel()[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0][:g.size]
        g = g.astype(a.dtype)
        with np.errstate(invalid="ignore"):
            want = np_mod.backward(g, s_np)
        got = th_mod.backward(_tensor(g, dtype), s_th)
        assert got[1] is None and want[1] is None, what  # random_samples get no gradient
        _same(got[0], want[0], f"{what} backward")
        t = rng.standard_normal(shape).astype(a.dtype)
        t.ravel()[:3] = [-0.0, np.inf, np.nan]
        with np.errstate(invalid="ignore"):
            want = np_mod.jvp(t, None, s_np)
        _same(th_mod.jvp(_tensor(t, dtype), None, s_th), want, f"{what} jvp")


def _variants():
    for name, kw, shape in _window_variants(FRACTIONALS):
        if kw.get("return_indices") and (kw.get("ties") in ("split", "all") or kw.get("convention") == "jax"):
            continue  # return_indices needs one winner per window
        yield name, kw, shape


REPRESENTATIVE = [
    ("fractional_max_pool2d", {"kernel_size": 3, "output_ratio": 0.5, "ties": "split"}, (2, 3, 9, 8)),
    ("fractional_max_pool2d", {"kernel_size": (2, 1), "output_size": (4, 5), "return_indices": True,
                               "convention": "torch"}, (3, 7, 9)),
]


@pytest.mark.parametrize("name,kw,shape", REPRESENTATIVE, ids=[_window_id(*c) for c in REPRESENTATIVE])
def test_fractional_module_equals_numpy_module_bit_for_bit(name, kw, shape):
    _check(name, kw, shape)


@pytest.mark.slow
@pytest.mark.parametrize("name,kw,shape", list(_variants()), ids=[_window_id(*c) for c in _variants()])
def test_fractional_module_equals_numpy_module_every_variant(name, kw, shape):
    _check(name, kw, shape)


# float16 samples near 1: i + u rounds up to the next integer, so starts repeat (alpha = 1 here) and
# a coordinate has more holding windows than a window has elements
NEAR_ONE = np.array([0.99951171875, 0.9990234375, 0.5, 0.0])


@pytest.mark.parametrize("ties", ["first", pytest.param("split", marks=pytest.mark.slow)])
def test_float16_starts_that_repeat(ties):
    u = np.stack([np.tile(NEAR_ONE, 3).reshape(4, 3), np.zeros((4, 3))], axis=-1)[..., ::-1]  # axis 0 reads sample 1
    _check("fractional_max_pool2d", {"kernel_size": (1, 1), "output_size": (5, 2), "ties": ties}, (4, 3, 5, 3),
           dtypes=("float16",), samples=np.ascontiguousarray(u))


def test_fractional_module_is_plain_torch_code():
    """No NumPy, no host round trip, no .item(), no scatter or index_put."""
    for name, kw, _ in REPRESENTATIVE:
        ((_, src),) = symgrad.pipeline.render(symgrad.ops.resolve(name, **kw), backends.get("torch")).items()
        src = _code_only(src).replace(" . ", ".").replace(" (", "(").replace("( )", "()")
        for bad in ("import numpy", "np.", ".numpy(", ".item()", ".tolist()", ".cpu()", "scatter", "index_put",
                    "index_add", "put_(", "import symgrad"):
            assert bad not in src, (name, kw, bad)


def test_fractional_module_refuses_wrong_arguments():
    mod = symgrad.load("fractional_max_pool2d", backend="torch", kernel_size=2, output_size=2, ties="first")
    x, u = torch.zeros(1, 1, 4, 4), torch.full((1, 1, 2), 0.5)
    with pytest.raises(ValueError, match=r"random_samples must have shape \(1, 1, 2\)"):
        mod.forward(x, u[0])
    _, saved = mod.forward(x, u)
    with pytest.raises(TypeError, match="saved.index must be a tensor of torch.uint8"):
        mod.backward(torch.ones(1, 1, 2, 2), saved._replace(index=saved.index.long()))
    with pytest.raises(ValueError, match="saved.samples must be a tensor of saved.dtype"):
        mod.backward(torch.ones(1, 1, 2, 2), saved._replace(samples=saved.samples.double()))
    with pytest.raises(ValueError, match="tangent_random_samples must be None"):
        mod.jvp(x, u, saved)


@pytest.mark.slow  # (Inductor: 13 s with its cache warm, minutes cold on the loaded 2-core machine)
def test_fractional_module_compiles_fullgraph():
    """torch.compile(fullgraph=True) of forward and backward from the first call: the same bits
    as eager."""
    mod = symgrad.load("fractional_max_pool2d", backend="torch", kernel_size=2, output_size=(3, 4), ties="split")
    x = torch.tensor(np.random.default_rng(0).choice([0.0, -0.0, 1.0, 2.0], size=(2, 3, 6, 7)))
    u = torch.rand(2, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    g = torch.randn(2, 3, 3, 4, dtype=torch.float64)

    def step(x, u, g):
        y, saved = mod.forward(x, u)
        return y, mod.backward(g, saved)[0]
    y, gx = torch.compile(step, fullgraph=True)(x, u, g)
    y_eager, gx_eager = step(x, u, g)
    _same(y, y_eager.numpy(), "forward")
    _same(gx, gx_eager.numpy(), "backward")


@pytest.mark.slow  # (symgrad.torch's import: about 6 s)
@pytest.mark.parametrize("kw", [{"ties": "split"}, {"convention": "torch"}])
def test_symgrad_torch_takes_the_fractional_module_natively(kw):
    """symgrad.torch's fractional pooling holds the torch module; its autograd.Function (eager
    form): forward, backward through autograd (random_samples get no gradient), double backward
    (the jvp) and forward-mode AD against the NumPy module bit for bit; on the meta device (as an
    accelerator's tensors reach it) the shapes."""
    import torch.autograd.forward_ad as fwAD

    import symgrad.torch as st
    params = {"kernel_size": 2, "output_size": (3, 2), **kw}
    fn = st.op("fractional_max_pool2d", **params)
    assert fn.torch_module is not None and fn.torch_module.WRT == ("x",)
    mod = symgrad.load("fractional_max_pool2d", **params)
    rng = np.random.default_rng(0)
    a = rng.choice([-np.inf, -1.0, 0.0, -0.0, 1.0, 2.0], size=(2, 3, 7, 5)).astype(np.float32)
    u = rng.random((2, 3, 2)).astype(np.float32)
    x, ut = torch.tensor(a, requires_grad=True), torch.tensor(u)
    y = fn._native[0].apply(x, ut)
    y_np, saved = mod.forward(a, u)
    _same(y, y_np, "forward")
    g = np.linspace(-1, 1, y_np.size).astype(np.float32).reshape(y_np.shape)
    gt = torch.tensor(g, requires_grad=True)
    (gx,) = torch.autograd.grad(y, x, gt, create_graph=True)
    _same(gx, mod.backward(g, saved)[0], "backward")
    (ggt,) = torch.autograd.grad(gx, gt, torch.ones_like(gx))  # d<backward(g), 1>/dg = jvp(1)
    _same(ggt, mod.jvp(np.ones_like(a), None, saved), "double backward")
    t = np.float32(0.5) * a.clip(-3, 3)
    with fwAD.dual_level():
        dual = fn._native[0].apply(fwAD.make_dual(torch.tensor(a), torch.tensor(t)), ut)
        tangent = fwAD.unpack_dual(dual).tangent
    _same(tangent, mod.jvp(t, None, saved), "forward-mode")
    m = torch.empty(2, 3, 7, 5, device="meta", requires_grad=True)
    y = fn(m, torch.empty(2, 3, 2, device="meta"))
    assert y.device.type == "meta" and tuple(y.shape) == (2, 3, 3, 2)
    (gm,) = torch.autograd.grad(y.sum(), m)
    assert gm.device.type == "meta" and gm.shape == m.shape
