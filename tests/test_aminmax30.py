"""aminmax (issue 30): symgrad.load("aminmax", ...) composes amin and amax (symgrad/aminmax.py).

Oracles: a brute-force loop over each slice from the README's definition (the winners of a max/min
under the NaN rule 'dominate' and the mask rules 'zero'/'nan', weighted by the tie policy) under
every policy; PyTorch 2.13's torch.aminmax (values, autograd gradient, torch.func.jvp) and JAX's
(jnp.min(x), jnp.max(x)) (jax.vjp, jax.jvp) on the CPU under the presets, bit for bit (signs of
zero included, any NaN equal to any NaN) in float64/32/16 and bfloat16 on tie-heavy slices of NaN,
+-inf, +-0; the cpu backend against the NumPy module.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import symgrad
from conftest import assert_same_values, same_values
from symgrad.policy import POLICIES

from oracle import policy_weights, window_winners

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.float64, np.float32, np.float16, BF16]
SPECIALS = [-np.inf, -1.0, -0.0, 0.0, 1.0, np.inf, np.nan]
GRADS = [-1.0, 0.5, -0.0, 0.0, 3.0, 0.1, np.inf]  # 0.1 / 3 rounds; inf * 0 is NaN
LAYOUTS = [(-1, False), (0, True), (None, False), (None, True)]


def _inputs(dtype, rng, dim, keepdim, shape=(3, 4, 5)):
    """A tie-heavy input (constant slices, NaN, +-inf, +-0 ties), gradients of the outputs' shape
    and a tangent of the input's."""
    x = rng.choice(SPECIALS, size=shape, p=[0.12, 0.12, 0.14, 0.14, 0.12, 0.12, 0.24])
    x[0, 0] = 1.0  # a constant slice: each element is both the min and the max
    x[1, 1] = [-np.inf, np.inf, -np.inf, np.inf, -1.0]
    x[2, 3] = [-0.0, 0.0, 1.0, -0.0, 0.0]
    x[2, 2] = [-0.0, 0.0, -0.0, 0.0, -0.0]
    out_shape = np.amax(np.zeros(shape), axis=dim, keepdims=keepdim).shape
    g_min, g_max = (rng.choice(GRADS, size=out_shape).astype(dtype) for _ in range(2))
    t = rng.choice([-1.0, 0.5, 3.0, 0.1, -0.0], size=shape)
    return x.astype(dtype), g_min, g_max, t.astype(dtype)


def _slices(x, dim):
    """x with the reduced dims last, flattened to (outputs, slice length)."""
    if dim is None:
        return x.reshape(1, -1)
    return np.moveaxis(x, dim, -1).reshape(-1, x.shape[dim])


def _unslice(rows, x, dim):
    if dim is None:
        return rows.reshape(x.shape)
    moved = np.moveaxis(x, dim, -1).shape
    return np.moveaxis(rows.reshape(moved), -1, dim)


def _brute(x, g_min, g_max, t, dim, ties, nan):
    """(min, max), grad_input and (t_min, t_max) from the README's definition, slice by slice."""
    xs, ts = _slices(x, dim), _slices(t, dim)
    grads = {"min": np.ravel(g_min), "max": np.ravel(g_max)}
    grad = np.zeros_like(xs)
    values = {k: np.zeros(len(xs)) for k in grads}
    tangents = {k: np.zeros(len(xs)) for k in grads}
    for r, row in enumerate(xs):
        for kind in ("min", "max"):
            winners = window_winners(list(row), kind)
            values[kind][r] = row[winners[0]]
            has_nan = np.isnan(row).any()
            if has_nan and nan == "zero":
                continue
            if has_nan and nan == "nan":
                grad[r] = np.nan
                tangents[kind][r] = np.nan
                continue
            for i, w in policy_weights(winners, ties).items():
                grad[r, i] += w * grads[kind][r]
                tangents[kind][r] += w * ts[r, i]
    return values, _unslice(grad, x, dim), tangents


CASES = [(ties, "dominate") for ties in POLICIES] + [("split", "zero"), ("all", "zero"),
                                                      ("split", "nan")]


@pytest.mark.parametrize("ties,nan", CASES)
@pytest.mark.parametrize("dim,keepdim", LAYOUTS[:2] + [pytest.param(None, False, marks=pytest.mark.slow)])
def test_every_policy_against_the_definition(ties, nan, dim, keepdim):
    rng = np.random.default_rng(30)
    x, g_min, g_max, t = _inputs(np.float64, rng, dim, keepdim)
    g_min[np.isinf(g_min)] = 2.0  # (inf * 0 is the frameworks' business, tested below)
    g_max[np.isinf(g_max)] = 2.0
    m = symgrad.load("aminmax", ties=ties, nan=nan, dim=dim, keepdim=keepdim)
    (low, high), saved = m.forward(x)
    values, grad, tangents = _brute(x, g_min, g_max, t, dim, ties, nan)
    np.testing.assert_array_equal(np.ravel(low), values["min"])
    np.testing.assert_array_equal(np.ravel(high), values["max"])
    (got,) = m.backward(g_min, g_max, saved)
    np.testing.assert_allclose(got, grad, rtol=1e-15, atol=0, equal_nan=True)
    t_min, t_max = m.jvp(t, saved)
    np.testing.assert_allclose(np.ravel(t_min), tangents["min"], rtol=1e-15, equal_nan=True)
    np.testing.assert_allclose(np.ravel(t_max), tangents["max"], rtol=1e-15, equal_nan=True)


def _torch_dtype(dtype):
    return {BF16: torch.bfloat16, np.dtype(np.float64): torch.float64,
            np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16}[np.dtype(dtype)]


def _to_torch(a):
    a = np.asarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _from_torch(a, dtype):
    return a.detach().float().numpy().astype(dtype) if dtype == BF16 else a.detach().numpy()


def _torch(x, g_min, g_max, t, dim, keepdim):
    dtype = x.dtype
    xt = _to_torch(x).requires_grad_(True)
    kw = {} if dim is None else {"dim": dim}
    low, high = torch.aminmax(xt, keepdim=keepdim, **kw)
    (grad,) = torch.autograd.grad((low, high), xt, (_to_torch(g_min), _to_torch(g_max)))
    _, tangents = torch.func.jvp(lambda v: tuple(torch.aminmax(v, keepdim=keepdim, **kw)),
                                 (_to_torch(x),), (_to_torch(t),))
    return ([_from_torch(v, dtype) for v in (low, high)], _from_torch(grad, dtype),
            [_from_torch(v, dtype) for v in tangents])


def _jax(x, g_min, g_max, t, dim, keepdim):
    def f(v):
        return jnp.min(v, axis=dim, keepdims=keepdim), jnp.max(v, axis=dim, keepdims=keepdim)
    values, vjp = jax.vjp(f, jnp.asarray(x))
    (grad,) = vjp((jnp.asarray(g_min), jnp.asarray(g_max)))
    _, tangents = jax.jvp(f, (jnp.asarray(x),), (jnp.asarray(t),))
    return [np.asarray(v) for v in values], np.asarray(grad), [np.asarray(v) for v in tangents]


def _check_preset(framework, convention, dtype, dim, keepdim, backend="numpy"):
    rng = np.random.default_rng(31)
    x, g_min, g_max, t = _inputs(dtype, rng, dim, keepdim)
    m = symgrad.load("aminmax", backend=backend, convention=convention, dim=dim, keepdim=keepdim)
    (low, high), saved = m.forward(x)
    (grad,) = m.backward(g_min, g_max, saved)
    tangents = m.jvp(t, saved)
    want_values, want_grad, want_tangents = framework(x, g_min, g_max, t, dim, keepdim)
    what = f"{convention} {np.dtype(dtype).name} dim={dim} keepdim={keepdim}"
    # the sign of a zero min/max is amin/amax's (np.min/np.max: not PyTorch's, whose full
    # aminmax even differs from its own amin/amax there); gradient and jvp are bit for bit
    assert_same_values(low, want_values[0], f"min {what}", zeros=False)
    assert_same_values(high, want_values[1], f"max {what}", zeros=False)
    assert_same_values(grad, want_grad, f"grad {what}")
    # jvp: amin/amax's own jvp under the presets adds a 3-way tie's tangents in another order than
    # both frameworks (and can give +0 for -0): a last-bit difference of those ops, not of the
    # composition (torch.aminmax's jvp equals torch.amin/amax's), so close here, not bit for bit
    eps = float(np.finfo(np.float32 if dtype == BF16 else dtype).eps) * (2 ** 16 if dtype == BF16 else 4)
    for got, want, name in zip(tangents, want_tangents, ("min", "max")):
        assert got.dtype == want.dtype and got.shape == want.shape, f"jvp {name} {what}"
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=eps,
                                   atol=0, equal_nan=True, err_msg=f"jvp {name} {what}")


def _presets(default):
    """Every dtype and layout; the default run takes the ones listed in default."""
    return [pytest.param(d, dim, keep, id=f"{np.dtype(d).name}-{dim}-{keep}",
                         marks=() if (np.dtype(d).name, dim) in default else pytest.mark.slow)
            for d in DTYPES for dim, keep in LAYOUTS]


@pytest.mark.parametrize("dtype,dim,keepdim", _presets({("float32", -1), ("bfloat16", None),
                                                         ("float16", 0)}))
def test_torch_preset_bit_for_bit(dtype, dim, keepdim):
    _check_preset(_torch, "torch", dtype, dim, keepdim)


@pytest.mark.parametrize("dtype,dim,keepdim", _presets({("float64", -1)}))
def test_jax_preset_bit_for_bit(dtype, dim, keepdim):
    _check_preset(_jax, "jax", dtype, dim, keepdim)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="needs a C compiler")
def test_cpu_backend_matches_torch():
    _check_preset(_torch, "torch", np.float32, -1, False, backend="cpu")


@pytest.mark.parametrize("params,error,words", [
    (dict(dim=(0, 1)), TypeError, "dim must be an int or None"),
    (dict(dim=True), TypeError, "dim must be an int or None"),
    (dict(dims=1), TypeError, "did you mean 'dim'"),
    (dict(ties="middle"), ValueError, "ties"),
])
def test_bad_parameters_are_one_line_errors(params, error, words):
    with pytest.raises(error) as info:
        symgrad.load("aminmax", **params)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_bad_saved_is_a_one_line_error():
    m = symgrad.load("aminmax", dim=0)
    with pytest.raises(TypeError, match="saved must be the .saved_min, saved_max. pair"):
        m.backward(np.ones(3), np.ones(3), None)


def test_an_unused_output_is_left_out_as_pytorch_leaves_it_out():
    """None for grad_min or grad_max: torch.autograd.grad of one output alone, bit for bit (a -0
    gradient stays -0: adding a zero term would make it +0)."""
    rng = np.random.default_rng(32)
    x, g_min, g_max, _ = _inputs(np.float32, rng, -1, False)
    g_min[0, 0], g_max[0, 1] = -0.0, -0.0
    m = symgrad.load("aminmax", convention="torch", dim=-1)
    _, saved = m.forward(x)
    for grads, index in (((g_min, None), 0), ((None, g_max), 1)):
        xt = _to_torch(x).requires_grad_(True)
        output = torch.aminmax(xt, dim=-1)[index]
        (want,) = torch.autograd.grad(output, xt, _to_torch(grads[index]))
        assert_same_values(m.backward(*grads, saved)[0], want.numpy(), f"output {index} alone")
    with pytest.raises(TypeError, match="needs grad_min or grad_max"):
        m.backward(None, None, saved)


def test_derive_and_generate_say_aminmax_is_composed(tmp_path, capsys):
    """aminmax has no module of its own: derive/generate (API and CLI) say to load it, or to
    derive amin and amax, in one line (not 'unknown op ... did you mean nanmax')."""
    for call in (lambda: symgrad.derive("aminmax"), lambda: symgrad.generate("aminmax", tmp_path)):
        with pytest.raises(ValueError, match=r"^aminmax is amin and amax composed, loaded only") as info:
            call()
        assert "\n" not in str(info.value)
    from symgrad.cli import main
    assert main(["generate", "aminmax", "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("symgrad: error: aminmax is amin and amax composed") and error.count("\n") == 1
