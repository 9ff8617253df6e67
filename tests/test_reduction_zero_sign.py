"""The torch preset's sign of a zero amax/amin (docs/conventions.md, Signs of zero): of tied +0 and
-0 the row's first zero in row order (the zeros rule 'first'), PyTorch's scalar path, in every
dtype and on every backend that prints the reductions' kernel.

Oracle: that rule written here, brute force over every row length 1..70 and zero placement (one
+0 among -0s, one -0 among +0s, and a +0 and a -0 at every pair of positions among -1s; +1s for
amin), the numpy and cpu backends in float16, bfloat16, float32 and float64; and PyTorch 2.13
itself on the rows it runs on its scalar path (shorter than two of its SIMD vectors), where it is
consistent.  Longer rows PyTorch folds in SIMD lanes, and there its zero depends on the positions
(tests/test_conventions.py::test_torch_amax_sign_of_zero_contradicts_itself)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import symgrad

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64))
LENGTHS = range(1, 71)
# the default run's lengths: short rows, and around one and two vectors of lanes (8 to 64 elements)
SOME = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 70)
COMPILER = next(filter(None, map(shutil.which, filter(None, (os.environ.get("CC"), "cc", "gcc", "clang")))), None)
BACKENDS = ["numpy", pytest.param("cpu", marks=pytest.mark.skipif(
    COMPILER is None and os.environ.get("CI") != "true", reason="no C compiler"))]


def zero_rows(n: int, op: str) -> np.ndarray:
    """Every zero placement in rows of n (float64): one +0 among -0s and one -0 among +0s at each
    position, and a +0 and a -0 at each pair of positions, in both orders, among elements that
    lose (-1 for amax, max and nanmax, +1 for the mins)."""
    rows = []
    for odd, rest in ((0.0, -0.0), (-0.0, 0.0)):
        r = np.full((n, n), rest)
        r[np.arange(n), np.arange(n)] = odd
        rows.append(r)
    p, q = np.nonzero(~np.eye(n, dtype=bool))  # every ordered pair of two positions
    pairs = np.full((len(p), n), -1.0 if op.endswith("max") else 1.0)
    pairs[np.arange(len(p)), p] = 0.0
    pairs[np.arange(len(p)), q] = -0.0
    return np.concatenate(rows + [pairs])


def first_zero(rows: np.ndarray) -> np.ndarray:
    """The rule: each row's first zero in row order (its sign is the output's)."""
    return rows[np.arange(len(rows)), np.argmax(rows == 0, axis=1)]


def plain_zero(rows: np.ndarray, ties: str) -> np.ndarray:
    """The rule without a convention: the first zero too, but under ties 'last' the winner's zero,
    the row's last (the output is the winner's value)."""
    if ties != "last":
        return first_zero(rows)
    return rows[np.arange(len(rows)), rows.shape[1] - 1 - np.argmax(rows[:, ::-1] == 0, axis=1)]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _check(op: str, backend: str, lengths, dim: int) -> None:
    """The rows reduced along dim -1 (the cpu backend's row kernels), or as the columns of their
    transpose along dim 0 (its column kernels)."""
    m = symgrad.load(op, backend=backend, convention="torch", dim=dim)
    one = {"threads": 1} if backend == "cpu" else {}  # (the kernels' result is the same on any count)
    for n in lengths:
        rows = zero_rows(n, op)
        want = first_zero(rows)
        x = rows if dim == -1 else np.ascontiguousarray(rows.T)
        for dtype in DTYPES:
            got = m.forward(x.astype(dtype), **one)[0]
            assert same_bits(got, want.astype(dtype)), (op, backend, n, dtype.name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_preset_zero_is_the_first_zero(backend):
    _check("amax", backend, SOME, 0)  # (the library tests/test_cpu_columns.py builds)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_torch_preset_zero_is_the_first_zero_every_length(op, backend, dim):
    _check(op, backend, LENGTHS, dim)


@pytest.mark.parametrize("ops,lengths", [pytest.param(("amax",), SOME, id="some"),
                                         pytest.param(("amax", "amin"), LENGTHS, id="every", marks=pytest.mark.slow)])
def test_pytorch_scalar_path_gives_the_first_zero(ops, lengths):
    """PyTorch 2.13 CPU on the same rows (one (rows, n) tensor), where it folds them on its scalar
    path (shorter than two SIMD vectors of its CPU capability: 64 bytes with AVX512; 16 bytes
    assumed elsewhere, fewer rows compared), bit for bit with the numpy module."""
    torch = pytest.importorskip("torch")
    vector = 64 if torch.backends.cpu.get_cpu_capability() == "AVX512" else 16
    types = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
    for op in ops:
        m = symgrad.load(op, convention="torch", dim=-1)
        for dtype in DTYPES:
            for n in (n for n in lengths if n < 2 * vector // dtype.itemsize):
                rows = zero_rows(n, op)
                x = torch.tensor(rows).to(types[dtype.name])
                want = getattr(torch, op)(x, dim=-1).float().numpy()
                got = m.forward(rows.astype(dtype))[0].astype(np.float32)
                assert same_bits(got, want), (op, n, dtype.name)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_torch_and_jax_backends_give_the_first_zero(backend):
    """The torch and jax backends print the same lowered reduction: the first zero, float32 and
    float64 (JAX: float32, its default without x64; the modules take the framework's arrays)."""
    lib = pytest.importorskip(backend)
    for op in ("amax", "amin"):
        m = symgrad.load(op, backend=backend, convention="torch", dim=-1)
        for n in LENGTHS:
            rows = zero_rows(n, op)
            for dtype in (np.float32, np.float64) if backend == "torch" else (np.float32,):
                x = rows.astype(dtype)
                y = m.forward(lib.tensor(x) if backend == "torch" else lib.numpy.asarray(x))[0]
                assert same_bits(np.asarray(y), first_zero(x)), (op, backend, n, np.dtype(dtype).name)


# ----------------------------------------------------------------------------- without a convention
# (before: under ties 'split' and 'all' the NumPy module took np.max's zero, whose sign depends on
# NumPy's SIMD lanes, and the cpu fold the last zero: 98 of 200 float32 rows of 33 differed)

TIES = ("first", "last", "split", "all")


def _check_plain(op: str, backend: str, ties: str, lengths) -> None:
    """Rows along dim 1 (amax's under ties 'split' the library tests/test_cpu_kinds.py builds);
    max/min (no dim: every element) one row a call, some rows of each length."""
    whole = op in ("max", "min")
    m = symgrad.load(op, backend=backend, ties=ties, **({} if whole else {"dim": 1}))
    one = {"threads": 1} if backend == "cpu" else {}
    for n in lengths:
        rows = zero_rows(n, op)
        rows = rows[::max(1, len(rows) // 40)] if whole else rows
        want = plain_zero(rows, ties)
        for dtype in DTYPES:
            x = rows.astype(dtype)
            got = np.array([m.forward(r, **one)[0] for r in x]) if whole else m.forward(x, **one)[0]
            assert same_bits(got, want.astype(dtype)), (op, backend, ties, n, dtype.name)


@pytest.mark.parametrize("backend,ties", [("numpy", t) for t in TIES] + [pytest.param(
    "cpu", "split", marks=BACKENDS[1].marks)])
def test_plain_zero_is_the_first_zero(backend, ties):
    _check_plain("amax", backend, ties, (2, 3, 17, 33))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ties", TIES)
@pytest.mark.parametrize("op", ["amax", "amin", "max", "min", "nanmax", "nanmin"])
def test_plain_zero_is_the_first_zero_every_length(op, backend, ties):
    _check_plain(op, backend, ties, LENGTHS if op not in ("max", "min") else SOME)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_plain_torch_and_jax_backends_give_the_rule(backend):
    """The torch and jax backends print the same lowered reduction without a convention (float32,
    the lengths around their lanes)."""
    lib = pytest.importorskip(backend)
    for op, ties in ((op, ties) for op in ("amax", "amin", "nanmax", "nanmin") for ties in TIES):
        m = symgrad.load(op, backend=backend, ties=ties, dim=-1)
        for n in SOME:
            x = zero_rows(n, op).astype(np.float32)
            y = m.forward(lib.tensor(x) if backend == "torch" else lib.numpy.asarray(x))[0]
            assert same_bits(np.asarray(y), plain_zero(x, ties)), (op, backend, ties, n)


# ----------------------------------------------------------------------------- the torch preset's max/min
# torch.max(x)/torch.min(x) without dim: the last zero on its short rows (before: the NumPy module
# took np.max's zero and the cpu fold the last: backends differed)
SHORT = {"float64": 4, "float32": 7}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["max", pytest.param("min", marks=pytest.mark.slow)])
def test_torch_preset_max_is_the_last_zero(op, backend):
    one = {"threads": 1} if backend == "cpu" else {}
    m = symgrad.load(op, backend=backend, convention="torch")
    for n in (2, 3, 17, 33):
        rows = zero_rows(n, op)
        rows = rows[::max(1, len(rows) // 20)]
        for dtype in DTYPES:
            x = rows.astype(dtype)
            got = np.array([m.forward(r, **one)[0] for r in x])
            assert same_bits(got, plain_zero(x, "last")), (op, backend, n, dtype.name)


@pytest.mark.parametrize("op", ["max", pytest.param("min", marks=pytest.mark.slow)])
def test_pytorch_max_short_rows_give_the_last_zero(op):
    torch = pytest.importorskip("torch")
    m = symgrad.load(op, convention="torch")
    for name, longest in SHORT.items():
        for n in range(1, longest + 1):
            for r in zero_rows(n, op).astype(name):
                want = getattr(torch, op)(torch.tensor(r)).numpy()
                assert same_bits(np.asarray(m.forward(r)[0]), want), (op, n, name, r)
