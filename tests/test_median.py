"""kthvalue, median, nanmedian (issue 29, part 2): one rank of each row.

Oracles, all independent of the generated code:
* a brute-force W row written here from the README's definition: each row ranked by Python's
  stable sort of a total-order key (NaN largest, +0 and -0 equal; the reversed index order for
  'last'), the selected rank(s) (kthvalue k - 1; median (n - 1) // 2, a row holding NaN its first
  NaN's rank; nanmedian (m - 1) // 2 of the m numbers; JAX's midpoint also n // 2, each half), the
  policy's row (first/last: the element holding the rank; split: 1/t to each of the t elements of
  its tie block; all: 1 to each), and forward, W^T g and W t in exact rationals;
* PyTorch 2.13 and JAX on the CPU, bit for bit under the presets on tie-heavy inputs with NaN,
  +-inf and +-0 (float32 and bfloat16 in the default run, float16 and float64 with -m slow);
  where PyTorch's index at ties is its algorithm's (kthvalue's quickselect, nanmedian's row of
  NaNs) the values and each tie block's total gradient;
* symgrad.check (its probes read only forward) for every policy.
"""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from fractions import Fraction

import numpy as np
import pytest

import symgrad
from symgrad.ops import resolve

POLICIES = ("first", "last", "split", "all")
POOL = np.array([0.0, -0.0, 1.0, -1.0, 2.0, np.inf, -np.inf, np.nan, 0.5])
NO_NAN = POOL[~np.isnan(POOL)]
SLOW_DTYPES = (pytest.param(np.float16, marks=pytest.mark.slow), np.float32,
               pytest.param(np.float64, marks=pytest.mark.slow))


def tie_heavy(rng, shape, dtype=np.float64, pool=POOL):
    return rng.choice(pool, size=shape).astype(dtype)


def same_bits(got, want) -> bool:
    """Bit for bit, signs of zero included; every NaN is one NaN."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
    view = f"u{got.dtype.itemsize}"
    return np.array_equal(np.where(nan, 0, got.view(view)), np.where(nan, 0, want.view(view)))


# ----------------------------------------------------------------------------- the oracle

def _key(v: float):
    """Total order: NaN above everything (NaNs equal), +0 == -0."""
    return (1, 0.0) if math.isnan(v) else (0, v + 0.0)


def oracle(row, name, params, ties, nan, midpoint=False):
    """(W row as Fractions, the index of the first selected rank) of one row."""
    n = len(row)
    numbers = sum(1 for v in row if not math.isnan(v))
    if name == "kthvalue":
        ranks = [params["k"] - 1]
    elif name == "median":
        ranks = [numbers] * 2 if numbers < n else [(n - 1) // 2, n // 2]
    else:
        ranks = [max(numbers - 1, 0) // 2, numbers // 2]
    ranks = ranks if midpoint else ranks[:1]
    share = Fraction(1, len(ranks))
    indices = list(range(n)) if ties != "last" else list(range(n))[::-1]
    order = sorted(indices, key=lambda j: _key(row[j]))  # Python's sort is stable
    W = [Fraction(0)] * n
    for r in ranks:
        block = [j for j in range(n) if _key(row[j]) == _key(row[order[r]])]
        if ties in ("first", "last"):
            W[order[r]] += share
        for j in block if ties in ("split", "all") else ():
            W[j] += share / len(block) if ties == "split" else share
    if nan in ("propagate", "omit_zero") and math.isnan(row[order[ranks[0]]]):
        W = [Fraction(0)] * n
    return W, order[ranks[0]]


def _rows(a, dim):
    return np.moveaxis(a, dim, -1).reshape(-1, a.shape[dim])


# (op, params, nan rule, the rows of a (3, 7) input: dim, or None for every element)
CASES = [("kthvalue", {"k": 3, "dim": 1}, "largest", 1), ("kthvalue", {"k": 1, "dim": 0, "keepdim": True}, "largest", 0),
         ("median", {"dim": 1}, "dominate", 1), ("median", {"dim": 0, "keepdim": True}, "propagate", 0),
         ("median", {}, "dominate", None), ("nanmedian", {"dim": 1}, "omit", 1),
         ("nanmedian", {"keepdim": True}, "omit_zero", None)]


def _flat(a, dim, keepdim):
    if dim is None:
        return a.reshape(1, -1)
    return _rows(a, dim) if keepdim or a.ndim == 2 else a.reshape(-1, 1)


def _slow_but(pairs, fast):
    """Every (case, policy) pair, those not in `fast` marked slow (a representative set in the
    default run: each case and each policy at least once)."""
    return [pytest.param(*p, id=_id(p), marks=() if p in fast else pytest.mark.slow) for p in pairs]


def _id(pair) -> str:
    case, last = pair
    case = case if isinstance(case, tuple) else (case,)
    words = [c if isinstance(c, str) else "-".join(f"{k}{v}" for k, v in c.items()) if isinstance(c, dict)
             else f"dim{c}" for c in case]
    return "-".join([w for w in words if w] + [getattr(last, "__name__", str(last))])


_ORACLE_FAST = [(CASES[i], POLICIES[i % 4]) for i in range(len(CASES))]


@pytest.mark.parametrize("case,ties", _slow_but([(c, t) for c in CASES for t in POLICIES], _ORACLE_FAST))
def test_every_policy_against_the_brute_force_w(case, ties):
    name, params, nan, dim = case
    m = symgrad.load(name, ties=ties, nan=nan, **params)
    rng = np.random.default_rng(7)
    for trial in range(4):
        x = tie_heavy(rng, (3, 7), pool=POOL if trial % 2 else NO_NAN)
        if trial == 3:
            x[1] = np.nan  # a row of NaNs
        out, saved = m.forward(x)
        y, idx = out if dim is not None else (out, None)
        g = rng.choice([1.0, -2.0, 0.5, 3.0, -0.25], size=y.shape)
        t = rng.choice([1.0, -2.0, 0.5, 4.0], size=x.shape)
        (gx,) = m.backward(g, saved)
        jt = m.jvp(t, saved)
        rows = _rows(x, dim) if dim is not None else x.reshape(1, -1)
        grads = _rows(gx, dim) if dim is not None else gx.reshape(1, -1)
        tangents = _rows(t, dim) if dim is not None else t.reshape(1, -1)
        for r, (row, gxr, tr) in enumerate(zip(rows, grads, tangents)):
            W, first = oracle(list(row), name, params, ties, nan)
            assert same_bits(y.reshape(-1)[r], row[first])  # the selected element itself
            if idx is not None:
                assert idx.reshape(-1)[r] == first
            gr = Fraction(float(g.reshape(-1)[r]))
            assert np.array_equal(gxr, [float(w * gr) for w in W]), (row, gxr, W)
            want_t = sum((w * Fraction(float(v)) for w, v in zip(W, tr) if w), Fraction(0))
            if not math.isnan(row[first]) or nan in ("propagate", "omit_zero"):
                assert jt.reshape(-1)[r] == float(want_t)


def test_the_oracle_reads_the_issue_examples():
    """The oracle itself, on the issue's numbers: torch.median() of [2, 1, 2, 2, 3] splits 1/3 to
    each 2, median(dim) gives all to index 2; nanmedian of [2, nan, 2, 1] splits (PyTorch, no
    dim) and goes to the first (JAX); jnp.median of an even count halves."""
    third = Fraction(1, 3)
    assert oracle([2.0, 1.0, 2.0, 2.0, 3.0], "median", {}, "split", "dominate")[0] == [third, 0, third, third, 0]
    assert oracle([2.0, 1.0, 2.0, 2.0, 3.0], "median", {}, "first", "dominate") == ([0, 0, 1, 0, 0], 2)
    assert oracle([2.0, math.nan, 2.0, 1.0], "nanmedian", {}, "split", "omit")[0] == [Fraction(1, 2), 0, Fraction(1, 2), 0]
    assert oracle([2.0, math.nan, 2.0, 1.0], "nanmedian", {}, "first", "omit_zero", True)[0] == [1, 0, 0, 0]
    assert oracle([2.0, 1.0, 2.0, 3.0], "median", {}, "first", "propagate", True)[0] == [Fraction(1, 2), 0, Fraction(1, 2), 0]


_MIDPOINT = [("median", "propagate"), ("nanmedian", "omit_zero")]


@pytest.mark.parametrize("case,ties", _slow_but([(c, t) for c in _MIDPOINT for t in POLICIES],
                                                [(_MIDPOINT[0], "split"), (_MIDPOINT[1], "all")]))
def test_jax_midpoint_under_every_policy_against_the_oracle(case, ties):
    name, nan = case
    """JAX's midpoint stays when ties= overrides its policy: half of each middle rank's W row."""
    m = symgrad.load(name, convention="jax", ties=ties, dim=1)
    rng = np.random.default_rng(9)
    x = tie_heavy(rng, (6, 8))
    x[2] = np.nan
    (y, idx), saved = m.forward(x)
    g = rng.choice([1.0, -2.0, 0.5, 3.0], size=y.shape)
    (gx,) = m.backward(g, saved)
    for row, yr, gr, gxr in zip(x, y, g, gx):
        W, first = oracle(list(row), name, {}, ties, nan, midpoint=True)
        assert np.array_equal(gxr, [float(w * Fraction(float(gr))) for w in W]), (row, gxr, W)
        numbers = sorted(v for v in row if not math.isnan(v))
        if name == "median" and len(numbers) == len(row) or name == "nanmedian" and numbers:
            assert yr == (numbers[(len(numbers) - 1) // 2] + numbers[len(numbers) // 2]) * 0.5
        else:
            assert math.isnan(yr)


# ----------------------------------------------------------------------------- symgrad.check

_CHECKED = [("kthvalue", {"k": 2, "dim": 1}), ("median", {"dim": 0}), ("nanmedian", {"dim": 1, "keepdim": True}),
            ("median", {})]


@pytest.mark.parametrize("case,ties", _slow_but([(c, t) for c in _CHECKED for t in POLICIES],
                                                [(_CHECKED[0], "split"), (_CHECKED[1], "all"), (_CHECKED[2], "last"),
                                                 (_CHECKED[3], "first")]))
def test_check_decides_every_policy(case, ties):
    name, params = case
    x = np.array([[1.0, 0.5, 1.0, 0.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0, -1.0, 0.0]])
    x = x.T if params.get("dim") == 0 else x  # (rows of 6 along dim 0)
    report = symgrad.check(symgrad.load(name, ties=ties, **params), x, modes="both")
    assert report.ok, str(report)
    assert report.tied_windows > 0
    assert (report.not_subgradient > 0) == (ties == "all")


def test_check_fails_a_module_of_another_policy():
    x = np.array([[1.0, 0.5, 1.0, 0.0, 1.0, 0.5]])
    m = symgrad.load("median", ties="first", dim=1)
    for other in ("last", "split"):
        assert not symgrad.check(m, x, ties=other).ok


# ----------------------------------------------------------------------------- PyTorch

def same_number(got, want) -> bool:
    """Bit for bit but for the sign of a zero (where +0 and -0 tie, which one PyTorch's selection
    returns is its algorithm's: std::nth_element, quickselect)."""
    return same_bits(np.where(np.asarray(got) == 0, 0, got).astype(np.asarray(got).dtype),
                     np.where(np.asarray(want) == 0, 0, want).astype(np.asarray(want).dtype))


def _torch():
    return pytest.importorskip("torch")


def _torch_run(fn, x, g, dtype=None):
    torch = _torch()
    t = torch.tensor(x, requires_grad=True) if dtype is None else torch.tensor(x, dtype=dtype, requires_grad=True)
    out = fn(t)
    ty = out[0] if isinstance(out, tuple) else out
    gt = torch.tensor(g) if dtype is None else torch.tensor(g, dtype=dtype)
    ty.backward(gt)
    return out, t.grad


TORCH_CASES = [("median", {"dim": 1}, lambda t: __import__("torch").median(t, 1)),
               ("median", {"dim": 0, "keepdim": True}, lambda t: __import__("torch").median(t, 0, keepdim=True)),
               ("median", {}, lambda t: __import__("torch").median(t)),
               ("nanmedian", {"dim": 1}, lambda t: __import__("torch").nanmedian(t, 1)),
               ("nanmedian", {}, lambda t: __import__("torch").nanmedian(t))]


@pytest.mark.parametrize("name,params,fn", TORCH_CASES, ids=lambda c: str(c) if isinstance(c, (str, dict)) else "")
@pytest.mark.parametrize("dtype", SLOW_DTYPES)
def test_torch_preset_is_pytorch_bit_for_bit(name, params, fn, dtype):
    torch = _torch()
    m = symgrad.load(name, convention="torch", **params)
    rng = np.random.default_rng(3)
    for trial in range(8):
        x = tie_heavy(rng, (4, 9), dtype, pool=POOL if trial % 2 else NO_NAN)
        (out, saved) = m.forward(x)
        y = out[0] if "dim" in params else out
        g = rng.choice(np.array([1.0, -0.0, 0.0, 2.0, -3.0, 0.5]), size=y.shape).astype(dtype)
        tout, tgrad = _torch_run(fn, x, g)
        ty = tout[0] if "dim" in params else tout
        # (without dim PyTorch selects the value with std::nth_element over the values alone)
        assert (same_bits if "dim" in params else same_number)(y, ty.detach().numpy()), (x, y, ty)
        (gx,) = m.backward(g, saved)
        assert same_bits(gx, tgrad.numpy()), (x, gx, tgrad)
        if "dim" in params:
            assert np.array_equal(out[1], tout[1].numpy())
            _, tangent = torch.func.jvp(lambda a: fn(a)[0], (torch.tensor(x),), (torch.tensor(np.full_like(x, 0.5)),))
            assert same_bits(m.jvp(np.full_like(x, 0.5), saved), tangent.numpy())


@pytest.mark.parametrize("name,params,fn", [TORCH_CASES[0], TORCH_CASES[4]], ids=["median_dim", "nanmedian"])
def test_torch_preset_bfloat16(name, params, fn):
    torch = _torch()
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m = symgrad.load(name, convention="torch", **params)
    rng = np.random.default_rng(5)
    x = tie_heavy(rng, (4, 9), np.float32)
    out, saved = m.forward(x.astype(ml_dtypes.bfloat16))
    y = out[0] if "dim" in params else out
    g = rng.choice(np.array([1.0, -0.0, 2.0, -3.0]), size=y.shape).astype(np.float32)
    tout, tgrad = _torch_run(fn, x, g, torch.bfloat16)
    ty = tout[0] if "dim" in params else tout
    (gx,) = m.backward(g.astype(ml_dtypes.bfloat16), saved)
    assert y.dtype == ml_dtypes.bfloat16
    assert (same_bits if "dim" in params else same_number)(np.asarray(y).astype(np.float32),
                                                           ty.detach().float().numpy())
    assert same_bits(gx.astype(np.float32), tgrad.float().numpy())


def _block_totals_match(x_rows, got_rows, want_rows):
    for row, a, b in zip(x_rows, got_rows, want_rows):
        for v in {_key(e) for e in row}:
            block = [j for j, e in enumerate(row) if _key(e) == v]
            assert a[block].sum() == b[block].sum(), (row, a, b)


def test_torch_kthvalue_values_and_each_tie_blocks_gradient():
    """torch.kthvalue orders tied elements by quickselect's steps (the preset's note): its values
    match (bit for bit but for which of tied +0 and -0), and the gradient each tie block receives
    (summed over the block)."""
    torch = _torch()
    rng = np.random.default_rng(11)
    for k, dim in ((1, 1), (4, 1), (9, 1), (2, 0)):
        m = symgrad.load("kthvalue", convention="torch", k=k, dim=dim)
        for _ in range(4):
            x = tie_heavy(rng, (5, 9))
            (y, idx), saved = m.forward(x)
            g = rng.choice([1.0, 2.0, 4.0], size=y.shape)
            (tv, ti), tgrad = _torch_run(lambda t: torch.kthvalue(t, k, dim), x, g)
            assert same_number(y, tv.detach().numpy())
            assert same_bits(np.take_along_axis(x, np.expand_dims(ti.numpy(), dim), dim).squeeze(dim),
                             tv.detach().numpy())  # (PyTorch's value is the element at its index)
            (gx,) = m.backward(g, saved)
            _block_totals_match(_rows(x, dim), _rows(gx, dim), _rows(tgrad.numpy(), dim))


def test_torch_nanmedian_row_of_nans_values_and_gradient():
    """A row of NaNs: torch.nanmedian(x, dim)'s index is std::nth_element's (not index order):
    the value (NaN) and the block's total gradient match."""
    torch = _torch()
    m = symgrad.load("nanmedian", convention="torch", dim=1)
    x = np.full((3, 7), np.nan)
    x[1, :3] = [1.0, 1.0, 0.0]
    (y, idx), saved = m.forward(x)
    g = np.array([1.0, 2.0, 4.0])
    (tv, ti), tgrad = _torch_run(lambda t: torch.nanmedian(t, 1), x, g)
    assert same_bits(y, tv.detach().numpy()) and idx[1] == ti[1]
    (gx,) = m.backward(g, saved)
    _block_totals_match(x, gx, tgrad.numpy())


def test_torch_issue_examples():
    torch = _torch()
    x = np.array([2.0, 1.0, 2.0, 2.0, 3.0])
    for params, fn in (({}, torch.median), ({"dim": 0}, lambda t: torch.median(t, 0))):
        out, saved = symgrad.load("median", convention="torch", **params).forward(x)
        (gx,) = symgrad.load("median", convention="torch", **params).backward(np.array(1.0), saved)
        assert same_bits(gx, _torch_run(fn, x, np.array(1.0))[1].numpy())
    assert gx.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]


# ----------------------------------------------------------------------------- JAX

def _jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


def jax_cases():
    import jax.numpy as jnp
    return {"median": ("median", {"dim": 1}, lambda a: jnp.median(a, axis=1)),
            "median_whole": ("median", {"keepdim": True}, lambda a: jnp.median(a, keepdims=True)),
            "nanmedian": ("nanmedian", {"dim": 0}, lambda a: jnp.nanmedian(a, axis=0)),
            "nanmedian_whole": ("nanmedian", {}, lambda a: jnp.nanmedian(a)),
            "kthvalue": ("kthvalue", {"k": 3, "dim": 1}, lambda a: jnp.sort(a, axis=1)[:, 2])}


_JAX_FAST = [("median", np.float32)]


@pytest.mark.parametrize("case,dtype", _slow_but(
    [(c, d) for c in ("median", "median_whole", "nanmedian", "nanmedian_whole", "kthvalue")
     for d in (np.float16, np.float32, np.float64, "bfloat16")], _JAX_FAST))
def test_jax_preset_is_jax_bit_for_bit(case, dtype):
    jax = _jax()
    import jax.numpy as jnp
    name, params, values = jax_cases()[case]
    if dtype == "bfloat16":
        dtype = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    m = symgrad.load(name, convention="jax", **params)
    rng = np.random.default_rng(13)
    for trial in range(4):  # (one shape: JAX compiles each primitive once per shape)
        x = tie_heavy(rng, (9, 8), dtype, pool=POOL if trial % 2 else NO_NAN)
        x[:trial, 1] = np.nan  # (whole: an even count of 72, and of numbers an odd one or an even one)
        x[trial, 2:] = np.nan  # (dim 1: a row of NaNs but for two numbers; dim 0: a column of NaNs)
        if trial == 3:
            x[:, 7] = np.nan
        out, saved = m.forward(x)
        y = out[0] if "dim" in params else out
        g = rng.choice(np.array([1.0, -0.0, 0.0, 2.0, -3.0, 0.5, 0.375]), size=y.shape).astype(dtype)
        t = rng.choice(np.array([1.0, -0.0, 2.0, -0.75]), size=x.shape).astype(dtype)
        want, pull = jax.vjp(values, jnp.asarray(x))
        (jg,) = pull(jnp.asarray(g))
        _, jt = jax.jvp(values, (jnp.asarray(x),), (jnp.asarray(t),))
        assert same_bits(y, np.asarray(want)), (x, y, want)
        (gx,) = m.backward(g, saved)
        assert same_bits(gx, np.asarray(jg)), (x, g, gx, jg)
        assert same_bits(m.jvp(t, saved), np.asarray(jt)), (x, t, m.jvp(t, saved), jt)


# ----------------------------------------------------------------------------- shapes, errors

def test_jax_midpoint_past_the_largest_float_is_inf_without_a_warning():
    """(lo + hi) * 0.5 in the dtype: the sum of two float16 values past 65504 is inf, as in JAX,
    and NumPy's overflow warning is silenced (it failed before as an error under -W error)."""
    m = symgrad.load("median", convention="jax")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, _ = m.forward(np.array([60000.0, 60000.0], np.float16))
        nan, _ = m.forward(np.array([-np.inf, np.inf]))
    assert y == np.inf and np.isnan(nan)


def test_shapes():
    m = symgrad.load("median", dim=2)
    (y, idx), saved = m.forward(np.zeros((2, 0, 3)))
    assert y.shape == idx.shape == (2, 0)
    assert m.backward(y, saved)[0].shape == (2, 0, 3)
    (y, idx), saved = symgrad.load("kthvalue", k=1, keepdim=True).forward(np.float32(3.0))
    assert y.shape == () and int(idx) == 0
    y, saved = symgrad.load("nanmedian", keepdim=True).forward(np.ones((2, 3, 4)))
    assert y.shape == (1, 1, 1)


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="k=4 is out of range for the 3 elements"):
        symgrad.load("kthvalue", k=4).forward(np.zeros(3))
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        resolve("kthvalue", k=0)
    with pytest.raises(ValueError, match="needs at least one element in each row"):
        symgrad.load("median", dim=0).forward(np.zeros((0, 2)))
    with pytest.raises(ValueError, match="nan must be 'dominate' or 'propagate'"):
        resolve("median", nan="omit")
    with pytest.raises(ValueError, match="nan must be 'omit' or 'omit_zero'"):
        resolve("nanmedian", nan="dominate")
    with pytest.raises(ValueError, match="saved.indices must be forward's int64 indices"):
        m = symgrad.load("median", dim=1)
        _, saved = m.forward(np.zeros((2, 3)))
        m.backward(np.zeros(2), saved._replace(indices=saved.indices + 3))


@pytest.mark.slow  # (five fresh processes deriving from an empty cache: ~20 s)
def test_cli_generates_and_derives(tmp_path):
    env = {"SYMGRAD_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "symgrad", *args], capture_output=True, text=True, env=env)

    r = cli("generate", "median", "--dim", "0", "--keepdim", "--convention", "jax", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "median_dim0_keepdim1_jax.py").exists()
    r = cli("derive", "median", "--ties", "split", "--full")
    assert r.returncode == 0, r.stderr
    assert "== W at a tie ==" in r.stdout and "Matrix([[1/2, 1/2, 0]])" in r.stdout
    for args in (("derive", "kthvalue"), ("generate", "kthvalue", "--k", "0"), ("derive", "nanmedian", "--nan", "dominate")):
        r = cli(*args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
