"""nanmax/nanmin in the torch and jax backends (issue 32): the generated PyTorch and JAX modules
against the NumPy module (itself checked against the rules' definition and the frameworks in
test_nanreduce.py), bit for bit on the CPU (the sign of a zero included, any NaN equal to any
NaN): forward, backward and jvp on tie-heavy slices of NaN, +-inf and +-0, every tie policy, NaN
rule ('skip', 'fill') and preset, float64/32/16 and bfloat16, reduced dims one, two, all, kept."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from conftest import assert_same_values
from test_nanreduce import BF16, DTYPES, LAYOUTS, OPS, _inputs

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

SETTINGS = [{"ties": "first"}, {"ties": "last"}, {"ties": "split"}, {"ties": "all"},
            {"ties": "split", "nan": "fill"}, {"convention": "torch"}, {"convention": "jax"}]


def _torch_dtype(dtype):
    return torch.bfloat16 if dtype == BF16 else getattr(torch, np.dtype(dtype).name)


def _converters(backend, dtype):
    """(NumPy array -> the backend's array of dtype, the backend's result -> NumPy array of dtype)."""
    if backend == "jax":
        return (lambda a: jnp.asarray(a, jnp.bfloat16 if dtype == BF16 else a.dtype)), np.asarray
    t_dtype = _torch_dtype(dtype)

    def back(t):
        assert t.dtype == t_dtype, (t.dtype, t_dtype)
        return t.to(torch.float64).numpy().astype(dtype)  # (exact)
    return (lambda a: torch.tensor(a.astype(np.float64), dtype=t_dtype)), back


def _compare(backend, name, settings, dtype, layout, rounds=1):
    """forward, backward and jvp of the backend's module equal the NumPy module's, bit for bit."""
    dim, keepdim = layout
    rng = np.random.default_rng(sum(map(ord, f"{backend}{name}{settings}{np.dtype(dtype).name}{layout}")))
    want_mod = symgrad.load(name, backend="numpy", dim=dim, keepdim=keepdim, **settings)
    got_mod = symgrad.load(name, backend=backend, dim=dim, keepdim=keepdim, **settings)
    forward, backward, jvp = got_mod.forward, got_mod.backward, got_mod.jvp
    if backend == "jax":  # traced whole (no branch on array values)
        forward, backward, jvp = jax.jit(forward), jax.jit(backward), jax.jit(jvp)
    to, back = _converters(backend, dtype)
    for _ in range(rounds):
        x, g, t = _inputs(dtype, rng, dim, keepdim)
        want, want_saved = want_mod.forward(x)
        got, got_saved = forward(to(x))
        what = f"{backend} {name} {settings} {np.dtype(dtype).name} {layout} at x={x.tolist()}"
        assert_same_values(back(got), want, f"forward {what}")
        assert_same_values(back(backward(to(g), got_saved)[0]), want_mod.backward(g, want_saved)[0],
                           f"backward {what}")
        got_t, want_t = back(jvp(to(t), got_saved)), want_mod.jvp(t, want_saved)
        if backend == "torch" and settings.get("ties", "split") in ("split", "all") and \
                settings.get("convention") != "torch" and dtype != np.float64:
            n = x.size // np.asarray(want_t).size  # the terms of each row
            _close_sum(got_t, want_t, dtype, n, f"jvp {what}")
        else:
            assert_same_values(got_t, want_t, f"jvp {what}")


def _close_sum(got, want, dtype, n, what):
    """The torch module's documented exception (its docstring, as amax's): a split/all jvp in
    float32 or narrower adds the row's terms by torch.cumsum, in float64 on the CPU, where the
    NumPy module adds them in float32 in order: the same values but for the rounding of a sum of
    n inexact terms (within n units of the dtype, relative), NaN and inf where they are."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    same = np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    assert same, f"{what}: got {got.tolist()}, want {want.tolist()}"
    ulp = {np.dtype(np.float32): 2.0**-23, np.dtype(np.float16): 2.0**-10, BF16: 2.0**-7}[np.dtype(dtype)]
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=n * ulp, atol=0, err_msg=what)


def _run(backend, *case, rounds=1):
    if backend == "jax":
        with jax.enable_x64(True):
            _compare(backend, *case, rounds=rounds)
    else:
        _compare(backend, *case, rounds=rounds)


# the default run: two cases ('fill' with the torch preset's at::sum jvp in bfloat16, the jax
# preset's ordered zeros in float16); every op, setting, dtype and layout under -m slow
REPRESENTATIVE = {("torch", "nanmin", 5, BF16, 0), ("jax", "nanmax", 6, np.float16, 1)}


def _cases():
    for backend in ("torch", "jax"):
        for name in OPS:
            for s, settings in enumerate(SETTINGS):
                for dtype in DTYPES:
                    for k, layout in enumerate(LAYOUTS):
                        key = (backend, name, s, dtype, k)
                        cid = (f"{backend}-{name}-{'-'.join(map(str, settings.values()))}-"
                               f"{np.dtype(dtype).name}-dim{layout[0]}{'-keep' if layout[1] else ''}")
                        yield pytest.param(backend, name, settings, dtype, layout, id=cid,
                                           marks=() if key in REPRESENTATIVE else pytest.mark.slow)


@pytest.mark.parametrize("backend,name,settings,dtype,layout", list(_cases()))
def test_framework_module_equals_the_numpy_module_bit_for_bit(backend, name, settings, dtype, layout, request):
    slow = request.node.get_closest_marker("slow") is not None
    _run(backend, name, settings, dtype, layout, rounds=3 if slow else 1)


def _oracle(name, settings, x, g):
    """The NumPy module's output and backward."""
    module = symgrad.load(name, dim=-1, **settings)
    y, saved = module.forward(x)
    return y, module.backward(g, saved)[0]


X = np.array([[1.0, np.nan, 1.0, -0.0], [np.nan] * 4, [0.0, -0.0, np.nan, 2.0], [-np.inf, np.nan, -np.inf, 0.5]],
             np.float32)
G = np.array([1.0, 2.0, 3.0, -0.5], np.float32)


@pytest.mark.slow
def test_symgrad_jax_runs_them_natively():
    """symgrad.jax.op takes the jax backend's module (no callback in the jitted grad's program),
    its gradient the NumPy module's backward bit for bit."""
    import symgrad.jax as sj
    for name, settings in (("nanmax", {"convention": "jax"}), ("nanmin", {"ties": "first"})):
        f = sj.op(name, dim=-1, **settings)
        assert repr(f).endswith("native)"), repr(f)
        loss = lambda v: jnp.sum(f(v) * G)  # noqa: E731
        assert "callback" not in str(jax.make_jaxpr(jax.grad(loss))(X))
        want_y, want_g = _oracle(name, settings, X, G)
        assert_same_values(np.asarray(jax.jit(f)(X)), want_y, f"symgrad.jax {name} forward")
        assert_same_values(np.asarray(jax.jit(jax.grad(loss))(X)), want_g, f"symgrad.jax {name} grad")


@pytest.mark.slow
def test_symgrad_torch_compiles_them_from_the_first_call():
    """symgrad.torch.op holds the torch backend's module; torch.compile(fullgraph=True) traces it
    (no graph break), forward and gradient the NumPy module's bit for bit."""
    import symgrad.torch as st
    torch._dynamo.reset()
    f = st.op("nanmax", dim=-1, convention="torch")
    assert f.torch_module is not None and f.torch_module.OP == "nanmax"
    x = torch.tensor(X, requires_grad=True)
    y = torch.compile(f, fullgraph=True)(x)
    y.backward(torch.tensor(G))
    want_y, want_g = _oracle("nanmax", {"convention": "torch"}, X, G)
    assert_same_values(y.detach().numpy(), want_y, "symgrad.torch nanmax forward")
    assert_same_values(x.grad.numpy(), want_g, "symgrad.torch nanmax grad")
