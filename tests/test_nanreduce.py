"""nanmax/nanmin (issue 30): reductions that skip NaN, under the NaN rules 'skip' and 'fill'.

Oracles: PyTorch 2.13 (torch.where(x.isnan(), -inf, x).amax(dim, keepdim) with NaN put back where
a slice is all NaN: the code the torch preset reads) and JAX (jnp.nanmax/nanmin) on the CPU under
the presets, bit for bit (the sign of a zero included, any NaN equal to any NaN) in float64/32/16
and bfloat16, forward, backward and jvp, on tie-heavy slices of NaN, +-inf, +-0; a brute-force loop
over each slice written from the rules' definitions (policy.py) under every tie policy;
symgrad.check under every policy, and a planted wrong tie value it must catch; <jvp(t), g> =
<t, vjp(g)>; central finite differences away from ties; the cpu backend against the NumPy module.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import symgrad
from conftest import assert_same_values, same_values
from symgrad.policy import POLICIES

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
SPECIALS = [-np.inf, -1.0, -0.0, 0.0, 1.0, np.inf, np.nan]
GRADS = [-1.0, 0.5, -0.0, 0.0, 3.0, 0.1, np.inf]  # 0.1 / 3 rounds; inf * 0 is NaN
DTYPES = [np.float64, np.float32, np.float16, BF16]
OPS = ("nanmax", "nanmin")
# (dim, keepdim) of a (3, 4, 5) input: one dim, two dims, every dim, keepdim
LAYOUTS = [(-1, False), (0, True), ((0, 2), False), (None, False)]
RULES = [("first", "skip"), ("last", "skip"), ("split", "skip"), ("all", "skip"), ("split", "fill")]


def _dims(dim, ndim):
    if dim is None:
        return tuple(range(ndim))
    return tuple(d % ndim for d in (dim if isinstance(dim, tuple) else (dim,)))


def _inputs(dtype, rng, dim, keepdim, shape=(3, 4, 5)):
    """A tie-heavy input (whole NaN slices, a slice of -inf and NaN, +-0 ties), a gradient of the
    output's shape and a tangent of the input's."""
    x = rng.choice(SPECIALS, size=shape, p=[0.12, 0.12, 0.14, 0.14, 0.12, 0.12, 0.24])
    x[0, 0] = np.nan  # slices of NaN only (dim -1), and NaN among others
    x[1, 1] = [np.nan, -np.inf, np.nan, -np.inf, np.nan]
    x[1, 2] = [np.nan, np.inf, np.nan, np.inf, np.nan]
    x[2, 3] = [-0.0, 0.0, np.nan, -0.0, 0.0]
    out_shape = np.amax(np.zeros(shape), axis=_dims(dim, len(shape)), keepdims=keepdim).shape
    g = rng.choice(GRADS, size=out_shape)
    t = rng.choice([-1.0, 0.5, 3.0, 0.1, -0.0], size=shape)
    return x.astype(dtype), g.astype(dtype), t.astype(dtype)


def _torch_dtype(dtype):
    return torch.bfloat16 if dtype == BF16 else {np.float64: torch.float64, np.float32: torch.float32,
                                                 np.float16: torch.float16}[np.dtype(dtype).type]


def _torch(name, x, g, t, dim, keepdim):
    dt, dims = _torch_dtype(x.dtype), _dims(dim, x.ndim)
    big = -torch.inf if name == "nanmax" else torch.inf
    red = torch.amax if name == "nanmax" else torch.amin

    def f(v):  # what the torch preset reads (conventions.py)
        out = red(torch.where(v.isnan(), big, v), dims, keepdim)
        return torch.where(v.isnan().all(dim=dims, keepdim=keepdim), torch.nan, out)

    tx = torch.tensor(x.astype(np.float64)).to(dt).requires_grad_()
    y = f(tx)
    y.backward(torch.tensor(g.astype(np.float64)).to(dt))
    _, tan = torch.func.jvp(f, (tx.detach(),), (torch.tensor(t.astype(np.float64)).to(dt),))
    back = lambda v: v.detach().to(torch.float64).numpy().astype(x.dtype)  # noqa: E731 (exact)
    return back(y), back(tx.grad), back(tan)


def _jax(name, x, g, t, dim, keepdim):
    dt = jnp.bfloat16 if x.dtype == BF16 else x.dtype
    f = lambda v: getattr(jnp, name)(v, axis=dim, keepdims=keepdim)  # noqa: E731
    y, pullback = jax.vjp(f, jnp.asarray(x, dt))
    (gx,) = pullback(jnp.asarray(g, dt))
    _, tan = jax.jvp(f, (jnp.asarray(x, dt),), (jnp.asarray(t, dt),))
    return tuple(np.asarray(v).astype(x.dtype) for v in (y, gx, tan))


def _ours(module, x, g, t):
    y, saved = module.forward(x)
    return y, module.backward(g, saved)[0], module.jvp(t, saved)


# the default run: each op, preset, dtype and layout once; every combination under -m slow
_DEFAULT_PRESET_CASES = {("nanmax", "torch", np.float64, LAYOUTS[0]), ("nanmin", "jax", np.float32, LAYOUTS[2])}


def _preset_cases():
    for name in OPS:
        for convention in ("torch", "jax"):
            for dtype in DTYPES:
                for layout in LAYOUTS:
                    case = (name, convention, dtype, layout)
                    cid = f"{name}-{convention}-{np.dtype(dtype).name}-dim{layout[0]}{'-keep' if layout[1] else ''}"
                    yield pytest.param(*case, id=cid, marks=() if case in _DEFAULT_PRESET_CASES
                                       else pytest.mark.slow)


@pytest.mark.parametrize("name,convention,dtype,layout", _preset_cases())
def test_presets_equal_the_frameworks_bit_for_bit(name, convention, dtype, layout):
    dim, keepdim = layout
    rng = np.random.default_rng(sum(map(ord, f"{name}{convention}{np.dtype(dtype).name}{layout}")))
    module = symgrad.load(name, convention=convention, dim=dim, keepdim=keepdim)
    framework = _torch if convention == "torch" else _jax
    for _ in range(1 if (name, convention, dtype, layout) in _DEFAULT_PRESET_CASES else 3):
        x, g, t = _inputs(dtype, rng, dim, keepdim)
        got, want = _ours(module, x, g, t), framework(name, x, g, t, dim, keepdim)
        what = f"{name} {convention} {np.dtype(dtype).name} at x={x.tolist()}"
        # the documented exception (conventions.py): PyTorch's amax returns the first of +0 and -0
        # along the innermost dim (the preset's fold) and the last across outer rows (vectorized)
        inner = x.ndim - 1 in _dims(dim, x.ndim)
        assert_same_values(got[0], want[0], f"forward {what}", zeros=convention == "jax" or inner)
        assert_same_values(got[1], want[1], f"backward {what}")
        if convention == "torch" and dtype in (np.float64, np.float32) and dim != (0, 2):
            assert_same_values(got[2], want[2], f"jvp {what}")
        else:
            # documented (conventions.py): jvp adds the slice's terms in another order (JAX's
            # reduce_sum, PyTorch's at::sum over dims that are not adjacent) or rounds the sum to
            # float16 before dividing (PyTorch): equal to rounding
            tol = {np.float64: 1e-14, np.float32: 1e-6, np.float16: 2e-3}.get(np.dtype(dtype).type, 1.6e-2)
            np.testing.assert_allclose(got[2].astype(np.float64), want[2].astype(np.float64),
                                       rtol=tol, atol=tol, err_msg=f"jvp {what}")


def _reference(name, ties, nan, x, g, dim, keepdim):
    """The rules' definitions (policy.py), one slice at a time.  skip: the extremum of the slice's
    numbers (NaN if none); the numbers equal to it win, first/last/split/all by the policy; a slice
    of NaNs keeps the gradient on its first element under first/last (fmax's scan) and sends none
    under split/all.  fill: each NaN is -inf (+inf) for the count and gets 0."""
    dims = _dims(dim, x.ndim)
    kept = [d for d in range(x.ndim) if d not in dims]
    moved = np.moveaxis(x.astype(np.float64), dims, range(x.ndim - len(dims), x.ndim))
    rows = moved.reshape(moved.shape[:len(kept)] + (-1,))
    big = -np.inf if name == "nanmax" else np.inf
    pick = max if name == "nanmax" else min
    ys, grads = np.empty(rows.shape[:-1]), np.zeros(rows.shape)
    gs = g.astype(np.float64).reshape(rows.shape[:-1])
    for i in np.ndindex(rows.shape[:-1]):
        row, gi = list(rows[i]), gs[i]
        numbers = [v for v in row if not np.isnan(v)]
        m = pick(numbers) if numbers else np.nan
        ys[i] = m
        if not numbers:
            if ties in ("first", "last") and nan == "skip":
                grads[i + (0,)] = gi
            continue
        winners = [k for k, v in enumerate(row) if v == m]
        if nan == "fill":
            counted = len(winners) + (sum(map(np.isnan, row)) if m == big else 0)
            for k in winners:
                grads[i + (k,)] = gi / counted
            continue
        share = {"first": {winners[0]: 1.0}, "last": {winners[-1]: 1.0},
                 "split": dict.fromkeys(winners, 1.0 / len(winners)),
                 "all": dict.fromkeys(winners, 1.0)}[ties]
        for k, w in share.items():
            grads[i + (k,)] = w * gi
    out_shape = np.amax(np.zeros(x.shape), axis=dims, keepdims=keepdim).shape
    grad = np.moveaxis(grads.reshape(moved.shape), range(x.ndim - len(dims), x.ndim), dims)
    return ys.reshape(out_shape), grad


@pytest.mark.parametrize("ties,nan", [RULES[0], pytest.param(*RULES[1], marks=pytest.mark.slow), RULES[2],
                                      pytest.param(*RULES[3], marks=pytest.mark.slow), RULES[4]])
@pytest.mark.parametrize("name", ["nanmax", pytest.param("nanmin", marks=pytest.mark.slow)])
def test_every_policy_and_rule_follows_the_definition(name, ties, nan):
    rng = np.random.default_rng(7)
    for dim, keepdim in LAYOUTS:
        module = symgrad.load(name, ties=ties, nan=nan, dim=dim, keepdim=keepdim)
        assert (module.TIES, module.OP) == (ties, name)
        for dtype in (np.float64, np.float32, np.float16):
            x, g, _ = _inputs(dtype, rng, dim, keepdim)
            g = np.where(np.abs(g) == np.abs(g.dtype.type(0.1)), 2.0, g)
            g = np.where(np.isinf(g), -4.0, g).astype(dtype)  # (g / count exact but for 3)
            y, saved = module.forward(x)
            (grad,) = module.backward(g, saved)
            want_y, want_g = _reference(name, ties, nan, x, g, dim, keepdim)
            assert_same_values(y, want_y.astype(dtype), f"{name} {ties} {nan} forward", zeros=False)
            # the sign of a zero is the presets' (above); the values are the definition's
            assert_same_values(grad, want_g.astype(dtype), f"{name} {ties} {nan} {dim} backward at "
                                                     f"x={x.tolist()}, g={g.tolist()}", zeros=False)


@pytest.mark.parametrize("ties,nan", RULES)
@pytest.mark.parametrize("name", ["nanmax", pytest.param("nanmin", marks=pytest.mark.slow)])
def test_check_passes_and_the_jvp_is_the_transpose(name, ties, nan):
    module = symgrad.load(name, ties=ties, nan=nan, dim=-1)
    x = np.array([[1.0, 1.0, 0.0, -2.0], [2.0, -1.0, 2.0, 2.0], [0.5, -0.5, 3.0, 0.0]])
    report = symgrad.check(module, x, modes="both")
    assert report.ok, str(report)
    # forward mode agrees with reverse mode at ties and NaN: <jvp(t), g> = <t, vjp(g)>
    rng = np.random.default_rng(8)
    x, _, _ = _inputs(np.float64, rng, -1, False)
    _, saved = module.forward(x)
    for _ in range(3):
        t = rng.choice([-1.0, 2.0, 0.5], size=x.shape)
        g = rng.choice([-1.0, 2.0, 0.5], size=saved.output_shape)
        (grad,) = module.backward(g, saved)
        np.testing.assert_allclose(np.sum(module.jvp(t, saved) * g), np.sum(t * grad), rtol=1e-12)


@pytest.mark.parametrize("name", OPS)
def test_check_catches_a_wrong_tie_value(name):
    """A planted nanmax whose backward splits a tie while it claims 'first' fails the check."""
    ours = symgrad.load(name, ties="split", dim=-1)

    def vjp(g, x):
        return ours.backward(g, ours.forward(x)[1])

    pair = (lambda x: ours.forward(x)[0], vjp)
    x = np.array([[1.0, np.nan, 1.0], [0.5, np.nan, -1.0]])
    report = symgrad.check(pair, x, ties="first", op=name, params={"dim": (-1,), "keepdim": False})
    assert not report.ok
    assert any(f.index[0] == 0 and f.kind == "tie" for f in report.failures), str(report)
    assert symgrad.check(pair, x, ties="split", op=name, params={"dim": (-1,), "keepdim": False}).ok


@pytest.mark.parametrize("name", ["nanmax", pytest.param("nanmin", marks=pytest.mark.slow)])
def test_finite_differences_away_from_ties(name):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 6))
    x[rng.random(x.shape) < 0.3] = np.nan
    h = 1e-6
    f = getattr(np, name)
    for ties, nan in RULES:
        module = symgrad.load(name, ties=ties, nan=nan, dim=-1)
        (grad,) = module.backward(np.ones(4), module.forward(x)[1])
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            if np.isnan(x[i]):
                continue  # a NaN takes no part: its gradient is 0
            e = np.zeros_like(x)
            e[i] = h
            fd[i] = np.sum(f(x + e, axis=-1) - f(x - e, axis=-1)) / (2 * h)
        np.testing.assert_allclose(grad, fd, atol=1e-6)


def test_settings_errors_are_one_line():
    with pytest.raises(ValueError, match=r"^nanmax: nan must be 'skip' or 'fill' \(nanmax/nanmin skip "
                                         r"NaN.*, got nan='dominate'$"):
        symgrad.load("nanmax", nan="dominate")
    with pytest.raises(ValueError, match=r"^NaN rule 'skip' is defined for nanmax and nanmin only"):
        symgrad.load("amax", nan="skip")
    with pytest.raises(ValueError, match=r"^NaN rule 'fill' expects tie policy split, not "
                                         r"ties='first'"):
        symgrad.load("nanmin", ties="first", nan="fill")


@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
@pytest.mark.parametrize("name,settings", [
    pytest.param("nanmax", {"ties": "first"}, marks=pytest.mark.slow),
    pytest.param("nanmax", {"ties": "last"}, marks=pytest.mark.slow),
    pytest.param("nanmin", {"ties": "split"}, marks=pytest.mark.slow),
    pytest.param("nanmax", {"ties": "all"}, marks=pytest.mark.slow), ("nanmax", {"convention": "torch"}),
    pytest.param("nanmin", {"convention": "jax"}, marks=pytest.mark.slow),
], ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_cpu_backend_equals_the_numpy_module(name, settings):
    rng = np.random.default_rng(10)
    for dim, keepdim in LAYOUTS[:2]:
        cpu = symgrad.load(name, backend="cpu", dim=dim, keepdim=keepdim, **settings)
        ref = symgrad.load(name, dim=dim, keepdim=keepdim, **settings)
        for dtype in (np.float64, np.float32, np.float16):
            x, g, t = _inputs(dtype, rng, dim, keepdim)
            for what, got, want in zip(("forward", "backward", "jvp"), _ours(cpu, x, g, t),
                                       _ours(ref, x, g, t)):
                assert_same_values(got, want, f"cpu {name} {settings} {np.dtype(dtype).name} {what}")
