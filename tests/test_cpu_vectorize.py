"""The cpu backend's elementwise loops vectorize (issues 28 and 30: at most 1.0x PyTorch one thread).

Oracles: GCC's own vectorizer report (-fopt-info-vec-optimized) on each generated .c compiled with
the loader's flags: every float32/float64 forward and backward loop is vectorized, in AVX-512's
64-byte vectors on x86-64 with glibc (elu's and celu's were scalar loops calling expf/expm1f; the
others used SSE2's 16 bytes only); exp through an expression against the exact value (float64's
exp of the float32 input; long double's for float64); elu and celu against the NumPy module: bit
for bit at the kink (+-0), NaN, +-inf and x > 0, within the ulps stated below on the smooth piece
(the C file's exp and expm1 are not NumPy's: tests/test_elu30.py states the frameworks' bounds).

Skipped without GCC (the report is GCC's), or without a C compiler for the module tests."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import symgrad
from symgrad import backends
from symgrad.backends.cpu import cflags
from symgrad.ops import resolve
from symgrad.pipeline import render

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_elu30 import _inputs, _same, _ulp  # noqa: E402  (elu's inputs and ulps, one definition)

COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)
GCC = shutil.which("gcc")
SLOW = pytest.mark.slow

# the elementwise ops of benchmarks/cpu_ops.py (the torch preset, as it times them)
OPS = [("relu", {}), ("leaky_relu", {}), ("clamp", {"min": -1.0, "max": 1.0}), ("hardtanh", {}), ("relu6", {}),
       ("abs", {}), ("maximum", {}), ("minimum", {}), ("rrelu", {}), ("softshrink", {}), ("hardsigmoid", {}),
       ("threshold", {"threshold": 1.0, "value": 5.0}), ("hardswish", {}), ("elu", {}), ("celu", {"alpha": 0.5})]
DEFAULT = {"leaky_relu"}  # (issue 28 item 6; elu and the rest: slow)


# x86-64 with glibc: those kernels are also compiled for AVX-512 (target_clones), 64-byte vectors
WIDTH = r"64" if platform.machine() in ("x86_64", "AMD64") and platform.libc_ver()[0] == "glibc" else r"\d+"


def _unvectorized(op: str, params: dict, tmp_path: Path) -> list[str]:
    """The float32/float64 forward and backward kernels of the op's .c whose loop GCC did not
    vectorize (compiled with the loader's flags), in WIDTH-byte vectors."""
    spec = resolve(op, convention="torch", **params)
    ((name, source),) = [(k, v) for k, v in render(spec, backends.get("cpu")).items() if k.endswith(".c")]
    path = tmp_path / name
    path.write_text(source)
    report = subprocess.run([GCC, *cflags(spec), str(path), "-o", str(path.with_suffix(".so")),
                             "-fopt-info-vec-optimized"], capture_output=True, text=True, check=True).stderr
    lines = source.splitlines()
    starts = {k + 1: m.group(1) for k, line in enumerate(lines)
              if (m := re.match(r"(?:\w+ )*int \w+_((?:forward|backward)_f(?:32|64))\(", line))}
    done = set()
    for m in re.finditer(rf":(\d+):\d+: optimized: loop vectorized using {WIDTH} byte vectors", report):
        at = int(m.group(1))
        start = max((s for s in starts if s <= at), default=None)
        if start is not None:
            done.add(starts[start])
    return sorted(set(starts.values()) - done) or ([] if starts else ["no kernels found"])


@pytest.mark.skipif(GCC is None, reason="GCC's vectorizer report")
@pytest.mark.parametrize("op,params", [pytest.param(o, p, id=o, marks=() if o in DEFAULT else SLOW) for o, p in OPS])
def test_elementwise_loops_vectorize(op, params, tmp_path):
    assert _unvectorized(op, params, tmp_path) == []


@SLOW
@pytest.mark.skipif(COMPILER is None, reason="no C compiler")
def test_exp_within_an_ulp_of_the_exact_value():
    """exp(x) through an expression, forward (exp) and backward (g * exp): within 1 ulp of the exact
    value in float32 (float64's exp of the float32 input) and float64 (long double's, where it is
    wider); the value at +-0, +-inf, NaN, past overflow and underflow as NumPy's."""
    module = symgrad.load_expr("exp(x)", backend="cpu")
    rng = np.random.default_rng(7)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30]
    for dtype, wide, edge in ((np.float32, np.float64, [89.0, 100.0, -105.0, -200.0]),
                              (np.float64, np.longdouble, [710.0, 800.0, -746.0, -2000.0])):
        if np.finfo(wide).nmant < np.finfo(dtype).nmant + 8:
            continue  # long double is double here: no exact value to compare with
        top = float(np.log(np.finfo(dtype).max))
        x = np.concatenate([rng.uniform(-top * 1.17, top, 4000), rng.uniform(-1, 1, 1000),
                            specials, edge]).astype(dtype)
        y, saved = module.forward(x)
        (gx,) = module.backward(np.ones_like(x), saved)
        with np.errstate(all="ignore"):
            exact = np.exp(x.astype(wide))
            want = exact.astype(dtype)
        assert _same(gx, y).all()
        finite = np.isfinite(want) & (want != 0)
        spacing = np.spacing(np.abs(want[finite])).astype(wide)
        err = np.abs(y[finite].astype(wide) - exact[finite]) / spacing
        assert err.max() <= 1.0, (dtype, err.max(), x[finite][err.argmax()])
        assert _same(y[~finite], want[~finite]).all(), (dtype, x[~finite], y[~finite])


# (op, alpha, convention): the smooth piece against the NumPy module, in ulps of the output
# (forward), of the gradient (torch preset) or of |alpha * g| (jax preset, whose (alpha * g) *
# (expm1(x) + 1) cancels); at or above the largest difference measured on 20,000 random points
FORWARD_ULPS = {np.float64: 2, np.float32: 3, np.float16: 1}
GRAD_ULPS = {"torch": {np.float64: 2, np.float32: 3, np.float16: 1}, "jax": {np.float64: 2, np.float32: 2, np.float16: 2}}
ELU_CASES = [pytest.param("elu", 1.0, "torch", id="elu-torch"),
             pytest.param("celu", 0.5, "jax", id="celu-0.5-jax", marks=SLOW),
             pytest.param("elu", 2.5, "jax", id="elu-2.5-jax", marks=SLOW),
             pytest.param("celu", 2.5, "torch", id="celu-2.5-torch", marks=SLOW)]


@pytest.mark.skipif(COMPILER is None, reason="no C compiler")
@pytest.mark.parametrize("op,alpha,convention", ELU_CASES)
def test_elu_celu_equal_the_numpy_module_within_ulps(op, alpha, convention):
    cpu = symgrad.load(op, backend="cpu", convention=convention, alpha=alpha)
    ref = symgrad.load(op, convention=convention, alpha=alpha)
    for dtype in (np.float64, np.float32, np.float16):
        x, g = _inputs(dtype)
        xf = x.astype(np.float64)
        exact = ~(np.isfinite(xf) & (xf < 0))  # +-0, NaN, +-inf and x > 0
        got, want = cpu.forward(x), ref.forward(x)
        results = [(got[0], want[0], FORWARD_ULPS[dtype], want[0]),
                   (cpu.backward(g, got[1])[0], ref.backward(g, want[1])[0], GRAD_ULPS[convention][dtype],
                    ref.backward(g, want[1])[0] if convention == "torch" else alpha * g.astype(np.float64))]
        for what, (a, b, ulps, scale) in zip(("forward", "grad"), results):
            ok = _same(a, b)
            assert ok[exact].all(), (op, dtype, what, x[exact & ~ok], a[exact & ~ok], b[exact & ~ok])
            with np.errstate(invalid="ignore"):
                diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            assert (ok | (diff <= ulps * _ulp(scale, dtype))).all(), (op, dtype, what, "beyond", ulps, "ulps")


# the piecewise-linear ops stay bit for bit with the NumPy module in the wide clones: long enough
# arrays (every lane and the loop's remainder) of tie-heavy values with +-0, NaN and +-inf (slow:
# tests/test_cpu_kinds.py compares every elementwise op in the default run on short arrays)
EXACT = [o for o in OPS if o[0] not in ("elu", "celu")]


@pytest.mark.skipif(COMPILER is None, reason="no C compiler")
@pytest.mark.parametrize("op,params", [pytest.param(o, p, id=o, marks=SLOW) for o, p in EXACT])
def test_long_arrays_equal_the_numpy_module_bit_for_bit(op, params):
    cpu = symgrad.load(op, backend="cpu", convention="torch", **params)
    ref = symgrad.load(op, convention="torch", **params)
    rng = np.random.default_rng(3)
    levels = np.array([-np.inf, -6.0, -3.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 3.0, 6.0, np.inf, np.nan])
    n = 4099  # a remainder after every vector width
    for dtype in (np.float32, np.float64):
        args = [np.where(rng.random(n) < 0.5, rng.choice(levels, n), rng.normal(0, 4, n)).astype(dtype)
                for _ in cpu.INPUTS]
        g = rng.normal(0, 1, n).astype(dtype)
        (ya, sa), (yb, sb) = cpu.forward(*args), ref.forward(*args)
        assert _same(ya, yb).all(), (op, dtype, "forward")
        for a, b in zip(cpu.backward(g, sa), ref.backward(g, sb)):
            assert _same(a, b).all(), (op, dtype, "backward")


@pytest.mark.skipif(COMPILER is None, reason="no C compiler")
def test_large_outputs_start_on_a_huge_page_boundary():
    """forward's output, backward's gradients and jvp's output of 4 MiB or more start at a 2 MiB
    boundary (NumPy's own arrays start where malloc's mapping does: part of each faulted in 4 KiB
    pages), with the NumPy module's values, shape and dtype; a small one is NumPy's own (elu: the
    module the test above compiled)."""
    cpu, ref = (symgrad.load("elu", backend=b, convention="torch") for b in ("cpu", "numpy"))
    # not C order; x >= 0, where elu is x, bit for bit
    x = np.abs(np.random.default_rng(5).standard_normal((2, 1 << 19), dtype=np.float32))[:, ::-1].T
    (y, saved), (want, want_saved) = cpu.forward(x), ref.forward(x)
    (gx,), (want_gx,) = cpu.backward(y, saved), ref.backward(want, want_saved)
    t, want_t = cpu.jvp(x, saved), ref.jvp(x, want_saved)
    for got, expected in ((y, want), (gx, want_gx), (t, want_t)):
        assert got.ctypes.data % (1 << 21) == 0
        assert got.shape == expected.shape and got.dtype == expected.dtype and _same(got, expected).all()
    small, _ = cpu.forward(x[:1000])
    assert small.base is None or small.base.nbytes == small.nbytes
