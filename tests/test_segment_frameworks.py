"""The torch and jax backends' segment modules (scatter_max/min, segment_max/min; issue 33)
against the NumPy module (itself checked against the definition and the frameworks in
test_segment.py), bit for bit on the CPU: output, backward and jvp on tie-heavy inputs with NaN,
+-inf and +-0, every policy, NaN rule and preset, float16/32/64 and bfloat16; and the framework
ops symgrad.torch.op / symgrad.jax.op on these native modules against torch.scatter_reduce and
jax.ops.segment_max."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch")

VALUES = [0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan]
POLICIES = [{"ties": t} for t in ("first", "last", "split", "all")] + [
    {"ties": "split", "nan": n} for n in ("zero", "nan")] + [{"ties": "all", "nan": "zero"}] + [
    {"convention": "torch"}, {"convention": "jax"}]
# (nan="each" is left out: the NumPy module's own _weight reads an undefined name there)


def _same(got, want, what):
    """Equal bits (every NaN taken as NaN), signs of zero included."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    nan = np.isnan(want.astype(np.float64))
    assert np.array_equal(np.isnan(got.astype(np.float64)), nan), (what, got, want)
    bits = f"u{want.dtype.itemsize}"
    assert np.array_equal(got[~nan].view(bits), want[~nan].view(bits)), (what, got, want)


def _params(op, include_self=True, dim=0):
    return {"num_segments": 5} if op.startswith("segment") else {"dim": dim, "include_self": include_self}


def _inputs(op, rng, dim=0):
    """The forward inputs (float64 NumPy arrays and the int64 index) and the output's shape."""
    def tie_heavy(shape):
        return rng.choice(VALUES, size=shape)
    if op.startswith("segment"):
        data = tie_heavy((13, 3))
        return (data, rng.integers(0, 5, 13)), (5, 3)
    src = np.moveaxis(tie_heavy((4, 9)), 0, dim)
    index = np.moveaxis(rng.integers(0, 3, (4, 9)), 0, dim)
    inp = np.moveaxis(tie_heavy((3, 9)), 0, dim)
    return (inp, index, src), inp.shape


def _numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _converters(backend, dtype):
    """(NumPy array -> the backend's array of dtype (an index as it is), the backend's result ->
    NumPy array of dtype)."""
    np_dtype = _numpy_dtype(dtype)
    if backend == "jax":
        import jax.numpy as jnp
        return ((lambda a: jnp.asarray(a.astype(np_dtype) if a.dtype.kind == "f" else a)),
                (lambda r: np.asarray(r)))
    t_dtype = getattr(torch, dtype)
    return ((lambda a: torch.tensor(a.astype(np.float64), dtype=t_dtype) if a.dtype.kind == "f" else torch.tensor(a)),
            (lambda t: t.to(torch.float64).numpy().astype(np_dtype)))


def _compare(backend, op, policy, dtype, rng, include_self=True, dim=0):
    """forward, backward and jvp of the backend's module equal the NumPy module's, bit for bit."""
    params = _params(op, include_self, dim)
    want_mod = symgrad.load(op, backend="numpy", **policy, **params)
    got_mod = symgrad.load(op, backend=backend, **policy, **params)
    forward, backward, jvp = got_mod.forward, got_mod.backward, got_mod.jvp
    if backend == "jax":  # traced whole (no branch on array values): one compile, not one per op
        import jax
        forward, backward, jvp = jax.jit(forward), jax.jit(backward), jax.jit(jvp)
    np_dtype = _numpy_dtype(dtype)
    to, back = _converters(backend, dtype)

    def as_np(a):
        return a.astype(np_dtype) if a.dtype.kind == "f" else a
    inputs, out_shape = _inputs(op, rng, dim)
    want, want_saved = want_mod.forward(*map(as_np, inputs))
    got, got_saved = forward(*map(to, inputs))
    _same(back(got), want, "output")
    g = rng.choice([1.0, -3.0, 0.0, -0.0, 7.0, 0.5, 0.1], out_shape)
    for a, b in zip(backward(to(g), got_saved), want_mod.backward(as_np(g), want_saved)):
        assert (a is None) == (b is None)
        if b is not None:
            _same(back(a), b, "backward")
    tangents = [None if i.dtype.kind in "iu" else rng.choice([1.0, -2.0, 0.25, -0.0, 0.1, 3.0], i.shape)
                for i in inputs]
    want_t = want_mod.jvp(*[None if t is None else as_np(t) for t in tangents], want_saved)
    got_t = jvp(*[None if t is None else to(t) for t in tangents], got_saved)
    _same(back(got_t), want_t, "jvp")


def _torch_compare(*args, **kwargs):
    _compare("torch", *args, **kwargs)


def _jax_compare(*args, **kwargs):
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):
        _compare("jax", *args, **kwargs)


# the default run: a representative set (each module is generated once per session); every
# op, policy, NaN rule, preset, dtype, include_self and dim under -m slow
REPRESENTATIVE = [  # (op, policy, dtype, include_self, dim)
    ("scatter_max", {"ties": "first"}, "float32", True, 0),
    ("scatter_max", {"ties": "last"}, "float64", False, 0),
    ("scatter_max", {"ties": "split"}, "float32", False, 0),
    ("scatter_max", {"convention": "torch"}, "bfloat16", False, 0),
    ("scatter_min", {"ties": "all", "nan": "zero"}, "float64", True, 1),
    ("segment_max", {"convention": "jax"}, "float16", True, 0),
    ("segment_min", {"ties": "split", "nan": "nan"}, "float32", True, 0),
]


@pytest.mark.parametrize("case", REPRESENTATIVE, ids=lambda c: f"{c[0]}-{'-'.join(c[1].values())}-{c[2]}")
def test_torch_module_equals_the_numpy_module(case):
    op, policy, dtype, include_self, dim = case
    rng = np.random.default_rng(0)
    for _ in range(3):
        _torch_compare(op, policy, dtype, rng, include_self, dim)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(map(str, p.values())))
@pytest.mark.parametrize("op", ["scatter_max", "scatter_min", "segment_max", "segment_min"])
def test_torch_module_every_variant(op, policy, dtype):
    rng = np.random.default_rng(3)
    for include_self in ((True, False) if op.startswith("scatter") else (True,)):
        for dim in ((0, 1) if op.startswith("scatter") else (0,)):
            for _ in range(4):
                _torch_compare(op, policy, dtype, rng, include_self, dim)


@pytest.mark.parametrize("case", [REPRESENTATIVE[2], REPRESENTATIVE[5]],
                         ids=lambda c: f"{c[0]}-{'-'.join(c[1].values())}-{c[2]}")
def test_jax_module_equals_the_numpy_module(case):
    op, policy, dtype, include_self, dim = case
    _jax_compare(op, policy, dtype, np.random.default_rng(4), include_self, dim)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(map(str, p.values())))
@pytest.mark.parametrize("op", ["scatter_max", "scatter_min", "segment_max", "segment_min"])
def test_jax_module_every_variant(op, policy, dtype):
    rng = np.random.default_rng(6)
    for include_self in ((True, False) if op.startswith("scatter") else (True,)):
        for dim in ((0, 1) if op.startswith("scatter") else (0,)):
            for _ in range(4):
                _jax_compare(op, policy, dtype, rng, include_self, dim)
