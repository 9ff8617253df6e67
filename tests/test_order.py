"""Order statistics (issue 29): sort, topk, cummax, cummin.

Oracles, all independent of the generated code:
* a brute-force W written here from the definition: each row ranked by Python's stable sort of a
  total-order key (NaN largest, +0 and -0 equal), the policy's W (first / last: one element per
  rank; split: 1/t of a tie block's rows to each of its t elements; all: the whole row), and
  forward, W^T g and W t computed from it in exact rationals;
* PyTorch 2.13 and JAX on the CPU, bit for bit under the presets (every NaN read as one NaN:
  XLA's min/max give NaNs whose sign bit depends on the dtype), on tie-heavy inputs with NaN,
  +-inf and +-0 in float16/32/64 and bfloat16;
* symgrad.check (its probes read only forward) for every policy.
"""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

import symgrad
from symgrad.ops import resolve

POLICIES = ("first", "last", "split", "all")
POOL = np.array([0.0, -0.0, 1.0, -1.0, 2.0, np.inf, -np.inf, np.nan, 0.5])
# the frameworks' tests: float32 in the default run, float16 and float64 exhaustive (-m slow; JAX
# compiles each dtype's scan anew, about 10 s a case on 2 loaded cores)
FRAMEWORK_DTYPES = (pytest.param(np.float16, marks=pytest.mark.slow), np.float32,
                    pytest.param(np.float64, marks=pytest.mark.slow))
# (op, params, the row's dim in a (3, 7) input)
CASES = [("sort", {}, 1), ("sort", {"descending": True, "dim": 0}, 0), ("topk", {"k": 3}, 1),
         ("topk", {"k": 2, "largest": False, "dim": 0}, 0), ("cummax", {"dim": 1}, 1),
         ("cummin", {"dim": 0}, 0)]


def tie_heavy(rng, shape, dtype=np.float64):
    return rng.choice(POOL, size=shape).astype(dtype)


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


def oracle_w(row, name, params, ties):
    """(W as rows of Fractions, the selected element of each output) for one row."""
    n = len(row)
    if name in ("cummax", "cummin"):
        W, picked = [], []
        for i in range(n):
            keys = [_key(v) for v in row[:i + 1]]
            best = max(keys) if name == "cummax" or (1, 0.0) in keys else min(keys)
            tied = [j for j in range(i + 1) if keys[j] == best]
            W.append(_weights(tied, n, ties, tied.index(tied[0] if ties != "last" else tied[-1])))
            picked.append(tied[-1] if ties == "last" else tied[0])
        return W, picked
    desc = params.get("descending", False) if name == "sort" else params.get("largest", True)
    k = params["k"] if name == "topk" else n
    indices = list(range(n)) if ties != "last" else list(range(n))[::-1]
    order = sorted(indices, key=lambda j: _key(row[j]), reverse=desc)  # Python's sort is stable
    W = []
    for r in range(k):
        tied = [j for j in order if _key(row[j]) == _key(row[order[r]])]
        W.append(_weights(tied, n, ties, tied.index(order[r])))
    return W, order[:k]


def _weights(tied, n, ties, held):
    row = [Fraction(0)] * n
    if ties in ("first", "last"):
        row[tied[held]] = Fraction(1)
    else:
        for j in tied:
            row[j] = Fraction(1, len(tied)) if ties == "split" else Fraction(1)
    return row


def _rows(a, dim):
    return np.moveaxis(a, dim, -1).reshape(-1, a.shape[dim])


@pytest.mark.parametrize("name,params,dim", CASES)
@pytest.mark.parametrize("ties", POLICIES)
def test_every_policy_against_the_brute_force_w(name, params, dim, ties):
    m = symgrad.load(name, ties=ties, **params)
    rng = np.random.default_rng(7)
    for _ in range(4):
        x = tie_heavy(rng, (3, 7))
        (y, idx), saved = m.forward(x)
        g = rng.choice([1.0, -2.0, 0.5, 3.0, -0.25], size=y.shape)
        t = rng.choice([1.0, -2.0, 0.5, 4.0], size=x.shape)
        (gx,) = m.backward(g, saved)
        jt = m.jvp(t, saved)
        for row, yr, ir, gr, gxr, tr, jtr in zip(_rows(x, dim), _rows(y, dim), _rows(idx, dim), _rows(g, dim),
                                                _rows(gx, dim), _rows(t, dim), _rows(jt, dim)):
            W, picked = oracle_w(list(row), name, params, ties)
            assert ir.tolist() == picked
            assert same_bits(yr, row[picked])  # the selected elements themselves (signs of zero)
            want_g = [sum((W[o][j] * Fraction(gr[o]) for o in range(len(W))), Fraction(0)) for j in range(len(row))]
            assert np.allclose(gxr, [float(v) for v in want_g], rtol=1e-12, atol=0), (row, gxr, want_g)
            want_t = [sum(W[o][j] * Fraction(tr[j]) for j in range(len(row)) if W[o][j]) for o in range(len(W))]
            fin = np.isfinite(row[picked]) | ~np.isnan(row[picked])
            assert np.allclose(jtr[fin], np.array([float(v) for v in want_t])[fin], rtol=1e-12, atol=0)


def test_the_oracle_reads_the_issue_examples():
    """The oracle itself, on the issue's numbers: torch.cummin([1, 0, 0, 2, 0]) backward (last)."""
    W, _ = oracle_w([1.0, 0.0, 0.0, 2.0, 0.0], "cummin", {}, "last")
    assert [sum(c) for c in zip(*W)] == [1, 1, 2, 0, 1]
    W, picked = oracle_w([5.0, 5.0, 5.0, 1.0], "topk", {"k": 2}, "first")
    assert picked == [0, 1]


# ----------------------------------------------------------------------------- symgrad.check

@pytest.mark.parametrize("name,params", [("sort", {}), ("sort", {"descending": True}), ("topk", {"k": 2}),
                                         ("topk", {"k": 4, "largest": False}), ("cummax", {"dim": 1}),
                                         ("cummin", {"dim": 1})])
@pytest.mark.parametrize("ties", POLICIES)
def test_check_decides_every_policy(name, params, ties):
    x = np.array([[1.0, 0.5, 1.0, 0.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0, -1.0, 0.0]])
    report = symgrad.check(symgrad.load(name, ties=ties, **params), x, modes="both")
    assert report.ok, str(report)
    assert report.tied_windows > 0
    assert (report.not_subgradient > 0) == (ties == "all")


@pytest.mark.parametrize("name,params", [("sort", {}), ("topk", {"k": 2}), ("cummax", {"dim": 1})])
def test_check_fails_a_module_of_another_policy(name, params):
    x = np.array([[1.0, 0.5, 1.0, 0.0, 1.0, 0.5]])
    m = symgrad.load(name, ties="first", **params)
    for other in ("last", "split"):
        assert not symgrad.check(m, x, ties=other).ok


# ----------------------------------------------------------------------------- PyTorch

torch_cases = [("sort", {"dim": 1}, lambda t: torch.sort(t, dim=1)),
               ("sort", {"dim": 1, "descending": True, "stable": True},
                lambda t: torch.sort(t, dim=1, descending=True, stable=True)),
               ("sort", {"dim": 0, "descending": True}, lambda t: torch.sort(t, dim=0, descending=True)),
               ("cummax", {"dim": 1}, lambda t: torch.cummax(t, 1)),
               ("cummin", {"dim": 0}, lambda t: torch.cummin(t, 0))]


def _torch_dtype(torch, dtype):
    return {np.float16: torch.float16, np.float32: torch.float32, np.float64: torch.float64}[dtype]


@pytest.mark.parametrize("name,params,fn", torch_cases, ids=lambda c: str(c) if isinstance(c, (str, dict)) else "")
@pytest.mark.parametrize("dtype", FRAMEWORK_DTYPES)
def test_torch_preset_is_pytorch_bit_for_bit(name, params, fn, dtype):
    global torch
    torch = pytest.importorskip("torch")
    m = symgrad.load(name, convention="torch", **params)
    rng = np.random.default_rng(3)
    for _ in range(6):
        x = tie_heavy(rng, (4, 9), dtype)
        g = rng.choice(np.array([1.0, -0.0, 0.0, 2.0, -3.0, 0.5, 0.25]), size=x.shape).astype(dtype)
        (y, idx), saved = m.forward(x)
        t = torch.tensor(x, requires_grad=True)
        ty, ti = fn(t)
        ty.backward(torch.tensor(g))
        (gx,) = m.backward(g, saved)
        assert same_bits(y, ty.detach().numpy()) and np.array_equal(idx, ti.numpy())
        assert same_bits(gx, t.grad.numpy()), (x, gx, t.grad)
        _, tangent = torch.func.jvp(lambda a: fn(a)[0], (torch.tensor(x),), (torch.tensor(g),))
        assert same_bits(m.jvp(g, saved), tangent.numpy())


@pytest.mark.parametrize("name,params,fn", torch_cases[:1] + torch_cases[3:4], ids=["sort", "cummax"])
def test_torch_preset_bfloat16(name, params, fn):
    global torch
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m = symgrad.load(name, convention="torch", **params)
    rng = np.random.default_rng(5)
    x = tie_heavy(rng, (4, 9), np.float32)
    g = rng.choice(np.array([1.0, -0.0, 2.0, -3.0, 0.5]), size=x.shape).astype(np.float32)
    tb = torch.tensor(x, dtype=torch.bfloat16, requires_grad=True)
    ty, ti = fn(tb)
    ty.backward(torch.tensor(g, dtype=torch.bfloat16))
    (y, idx), saved = m.forward(x.astype(ml_dtypes.bfloat16))
    (gx,) = m.backward(g.astype(ml_dtypes.bfloat16), saved)
    assert y.dtype == ml_dtypes.bfloat16 and np.array_equal(idx, ti.numpy())
    assert same_bits(y.astype(np.float32), ty.detach().float().numpy())
    # (small integers and halves: the scatter_add's adds are exact in bfloat16 too)
    assert same_bits(gx.astype(np.float32), tb.grad.float().numpy())


def test_torch_topk_values_and_each_tie_blocks_gradient():
    """torch.topk orders tied elements by std::partial_sort / nth_element's steps (the preset's
    note): its values match bit for bit where no +0 and -0 tie, and the gradient each tie block
    receives (summed over the block's elements) matches always."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    for largest in (True, False):
        m = symgrad.load("topk", convention="torch", k=3, largest=largest)
        for _ in range(8):
            x = rng.choice(POOL[2:], size=(5, 9))  # no zeros: tied values have one bit pattern
            g = rng.choice([1.0, 2.0, 4.0], size=(5, 3))
            (y, idx), saved = m.forward(x)
            t = torch.tensor(x, requires_grad=True)
            ty, _ = torch.topk(t, 3, largest=largest)
            ty.backward(torch.tensor(g))
            (gx,) = m.backward(g, saved)
            assert same_bits(y, ty.detach().numpy())
            for row, a, b in zip(x, gx, t.grad.numpy()):
                for v in {_key(e) for e in row}:
                    block = [j for j, e in enumerate(row) if _key(e) == v]
                    assert a[block].sum() == b[block].sum()


# ----------------------------------------------------------------------------- JAX

def _jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


def jax_cases():
    import jax.numpy as jnp
    from jax import lax
    return {
        "sort": ({"dim": 1}, lambda a: jnp.sort(a, axis=1), lambda a: jnp.argsort(a, axis=1)),
        "sort_descending": ({"dim": 0, "descending": True}, lambda a: jnp.sort(a, axis=0, descending=True),
                            # jnp.sort(descending=True) reverses the ascending sort: its permutation
                            lambda a: jnp.argsort(a, axis=0)[::-1]),
        "top_k": ({"k": 3}, lambda a: lax.top_k(a, 3)[0], lambda a: lax.top_k(a, 3)[1]),
        "top_k_smallest": ({"k": 3, "largest": False}, lambda a: -lax.top_k(-a, 3)[0],
                           lambda a: lax.top_k(-a, 3)[1]),
        "cummax": ({"dim": 1}, lambda a: lax.cummax(a, axis=1), None),
        "cummin": ({"dim": 0}, lambda a: lax.cummin(a, axis=0), None),
    }


@pytest.mark.parametrize("case", ["sort", "sort_descending", "top_k", "top_k_smallest", "cummax", "cummin"])
@pytest.mark.parametrize("dtype", FRAMEWORK_DTYPES + ("bfloat16",))
def test_jax_preset_is_jax_bit_for_bit(case, dtype):
    jax = _jax()
    import jax.numpy as jnp
    params, values, indices = jax_cases()[case]
    name = {"top_k": "topk", "top_k_smallest": "topk", "sort_descending": "sort"}.get(case, case)
    if dtype == "bfloat16":
        dtype = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    m = symgrad.load(name, convention="jax", **params)
    rng = np.random.default_rng(13)
    for _ in range(6):
        x = tie_heavy(rng, (5, 9), dtype)
        (y, idx), saved = m.forward(x)
        g = rng.choice(np.array([1.0, -0.0, 0.0, 2.0, -3.0, 0.5, 0.375]), size=y.shape).astype(dtype)
        t = rng.choice(np.array([1.0, -0.0, 2.0, -0.75]), size=x.shape).astype(dtype)
        _, pull = jax.vjp(values, jnp.asarray(x))
        (jg,) = pull(jnp.asarray(g))
        _, jt = jax.jvp(values, (jnp.asarray(x),), (jnp.asarray(t),))
        # (the values as called: under jax.vjp lax.cummax computes them through the scan's tree,
        # whose max of +0 and -0 may differ in sign from reduce_window's)
        want = values(jnp.asarray(x))
        assert same_bits(y, np.asarray(want)), (x, y, want)
        if indices is not None:
            assert np.array_equal(idx, np.asarray(indices(jnp.asarray(x))))
        (gx,) = m.backward(g, saved)
        assert same_bits(gx, np.asarray(jg)), (x, g, gx, jg)
        assert same_bits(m.jvp(t, saved), np.asarray(jt))


def test_jax_cummin_splits_as_the_issue_says():
    m = symgrad.load("cummin", convention="jax", dim=0)
    _, saved = m.forward(np.array([1.0, 0.0, 0.0, 2.0, 0.0]))
    assert m.backward(np.ones(5), saved)[0].tolist() == [1.0, 2.25, 1.25, 0.0, 0.5]
    m = symgrad.load("cummin", convention="torch", dim=0)
    _, saved = m.forward(np.array([1.0, 0.0, 0.0, 2.0, 0.0]))
    assert m.backward(np.ones(5), saved)[0].tolist() == [1.0, 1.0, 2.0, 0.0, 1.0]


# ----------------------------------------------------------------------------- shapes, errors, CLI

def test_shapes_and_empty_rows():
    m = symgrad.load("sort", dim=1)
    (y, idx), saved = m.forward(np.zeros((2, 0, 3)))
    assert y.shape == idx.shape == (2, 0, 3)
    assert m.backward(y, saved)[0].shape == (2, 0, 3)
    (y, idx), saved = symgrad.load("cummax", dim=0).forward(np.float32(3.0))
    assert y.shape == () and idx.shape == () and int(idx) == 0


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="k=5 is larger than the 3 elements"):
        symgrad.load("topk", k=5).forward(np.zeros(3))
    with pytest.raises(ValueError, match="dim=2 is out of range"):
        symgrad.load("sort", dim=2).forward(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="nan must be 'largest'"):
        resolve("sort", nan="keep")
    with pytest.raises(TypeError, match="missing required parameter 'k'"):
        resolve("topk")


def test_cli_generates_and_derives(tmp_path):
    env = {"SYMGRAD_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "symgrad", "generate", "topk", "--backend", "numpy", "--k", "2",
                        "--ties", "split", "--out", str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "topk_top2_split.py").exists()
    r = subprocess.run([sys.executable, "-m", "symgrad", "derive", "topk", "--k", "2", "--full"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "rank_i = sum_(j<i)" in r.stdout and "== W at a tie ==" in r.stdout
    r = subprocess.run([sys.executable, "-m", "symgrad", "derive", "topk"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("ties", ("first", "last"))
@pytest.mark.parametrize("largest", (True, False))
def test_topk_selection_by_partition_matches_the_oracle_on_long_rows(ties, largest):
    """topk with k below the row's length selects by a partition (not a whole sort): on long rows
    of few distinct values, many ties straddle the k-th rank."""
    rng = np.random.default_rng(17)
    m = symgrad.load("topk", ties=ties, k=17, largest=largest)
    x = rng.choice(POOL, size=(6, 200))
    (y, idx), saved = m.forward(x)
    g = rng.choice([1.0, 2.0, -0.5], size=y.shape)
    (gx,) = m.backward(g, saved)
    for row, yr, ir, gr, gxr in zip(x, y, idx, g, gx):
        W, picked = oracle_w(list(row), "topk", {"k": 17, "largest": largest}, ties)
        assert ir.tolist() == picked and same_bits(yr, row[picked])
        want = np.zeros(row.size)
        want[picked] = gr
        assert same_bits(gxr, want + 0)
