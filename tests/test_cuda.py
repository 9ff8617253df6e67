"""The CUDA backend, validated without a GPU.

* nvcc compiles every committed .cu file for sm_80 (to PTX), and one file of each op kind for
  sm_80 and sm_90 on to machine code; in the PTX, no backward kernel has an atomic or reduction instruction and
  no float32/float16/bfloat16 kernel does float64 math;
* the CPU execution harness (tests/cuda_harness): every kernel compiled unchanged by the host C++
  compiler through a compatibility header, the launch grid run serially, the generated CuPy
  loader driven through a CPU stand-in for CuPy; compared bit for bit with the NumPy backend on
  tie-heavy inputs (with and without NaN and infinities) for every op of the test tables and of
  the catalog, every tie policy, float64, float32 and float16, both layouts, both index widths;
* float16 and bfloat16 conversions exhaustively, against NumPy's float16 and an independent
  bfloat16 rounding;
* printers, the kernel header, the loader's errors, the CLI and API for backend "cuda".

Tests that need nvcc or a C++ compiler skip, saying which, where it is missing.
"""

from __future__ import annotations

import os
import functools
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

import cuda_harness as harness
import symgrad
from conftest import POLICIES, case_id, slow_run
from cuda_harness.check import CONVENTIONS, cases, compare, every_comparison, mismatch, nan_cases
from symgrad import catalog, naming
from symgrad.indicators import Indicator, IsNan, MaxOf, MinOf
from symgrad.lower import BEST, V, Count, Quotient, Select
from symgrad.ops import OPS, resolve
from symgrad.policy import DEFAULT_NAN, NAN_RULES
from symgrad.backends import cuda as cuda_backend
from symgrad.backends.cuda.printer import cuda_code
from symgrad import backends
from symgrad.pipeline import render

ROOT = Path(__file__).resolve().parent.parent


def render_cuda(op):
    return render(op, backends.get("cuda"))


CATALOG_CU = sorted((ROOT / "generated" / "cuda").glob("*.cu"))
ARCHS = ("sm_80", "sm_90")
NO_CXX = "no C++ compiler (g++, clang++ or $CXX) on this machine: the CPU execution harness needs one"
NO_NVCC = "nvcc is not on PATH: compiling the .cu files needs the CUDA toolkit"


# ----------------------------------------------------------------------------- the cases

CASES = cases()
CASE_IDS = [case_id(op, params) for op, params, _ in CASES]


NAN_CASES = nan_cases(CASES)


def _allowed(op: str, ties) -> bool:
    """Whether the op defines the tie policy (threshold refuses 'split' and 'all')."""
    return ties is None or not OPS[op].policies or ties in OPS[op].policies


# ----------------------------------------------------------------------------- fixtures

# the default run's harness comparisons (the others with -m slow; a source the fixture did not
# compile is compiled when a test asks for it): a scan policy and a mask policy for every case,
# each preset on the first case of each op, the NaN rules under those two policies
DEFAULT_TIES = ("first", "split")


def _first_case_of_its_op(op, params) -> bool:
    return next(p for o, p, _ in CASES if o == op) is params


def _default_ties(op, params, ties) -> bool:
    """Whether the default run compares (op, params) under ties: an op with one case under both
    default policies; an op with several takes them in turn, case by case (every case under
    every policy with -m slow)."""
    if ties not in DEFAULT_TIES:
        return False
    own = [p for o, p, _ in CASES if o == op]
    return len(own) == 1 or DEFAULT_TIES[next(k for k, p in enumerate(own) if p is params) % 2] == ties


@pytest.fixture(scope="session")
def host_cache(tmp_path_factory, request):
    """The .cu sources of the cases this run compares compiled for the CPU once, in parallel, into
    a session dir."""
    if harness.find_cxx() is None:
        pytest.skip(NO_CXX)
    # $SYMGRAD_HARNESS_CACHE keeps the shared objects between sessions (keyed by a hash of the
    # source, the compatibility header, the compiler and its flags)
    cache = Path(os.environ.get("SYMGRAD_HARNESS_CACHE") or tmp_path_factory.mktemp("cuda-host"))
    slow = slow_run(request.config)
    settings = [(op, params, {"ties": t}) for op, params, _ in CASES for t in POLICIES if slow or _default_ties(op, params, t)]
    settings += [(op, params, {"convention": c}) for op, params, _ in CASES for c in CONVENTIONS
                 if slow or _first_case_of_its_op(op, params)]
    settings += [(op, params, st) for op, params, _, st in NAN_CASES if slow or st["ties"] in DEFAULT_TIES]
    sources = [next(s for n, s in render_cuda(resolve(op, **st, **params)).items() if n.endswith(".cu"))
               for op, params, st in settings if _allowed(op, st.get("ties"))]
    harness.build_many(sources, cache)
    return cache


@pytest.fixture(scope="session")
def _fake(host_cache):
    return harness.fake_cupy(host_cache)


@pytest.fixture
def fake_cupy(_fake, monkeypatch):
    """The CPU stand-in, importable as cupy for the duration of a test."""
    monkeypatch.setitem(sys.modules, "cupy", _fake)
    return _fake


@functools.cache
def _one_of_each_kind() -> frozenset[str]:
    """The name of the first committed .cu file of each op kind (each kernel template)."""
    first = {}
    for op in _cuda_entries():
        first.setdefault(op.spec.kind, cuda_backend.source_name(op))
    return frozenset(first.values())


def _archs(cu: Path) -> tuple:
    """The architectures a catalog .cu is compiled for: sm_80 (PTX) for every file, and both
    (through ptxas) for the first file of each op kind."""
    return ARCHS if cu.name in _one_of_each_kind() else ARCHS[:1]


def _nvcc_sources(config) -> list[Path]:
    """The catalog .cu files nvcc compiles: every one with -m slow, else the first of each op
    kind (one per kernel template: about a fifth of the files and of nvcc's minute)."""
    if slow_run(config):
        return CATALOG_CU
    return [cu for cu in CATALOG_CU if cu.name in _one_of_each_kind()]


@pytest.fixture(scope="session")
def nvcc_builds(tmp_path_factory, request):
    """{.cu name: (return code, stderr, keep dir)}: the catalog .cu files of _nvcc_sources compiled by nvcc for the
    virtual architecture compute_80 (device code only), keeping the PTX; the first .cu of each op
    kind compiled for compute_80 and compute_90 and assembled by ptxas into sm_80 and sm_90
    machine code.  (Each architecture repeats nvcc's front end and ptxas was about 60% of its
    time; the PTX of one architecture shows what every source asks of the device, and one source
    of each kernel template shows that both architectures take it.)"""
    nvcc = harness.find_nvcc()
    if nvcc is None:
        pytest.skip(NO_NVCC)
    out = tmp_path_factory.mktemp("nvcc")

    def one(cu: Path):
        keep = out / cu.stem
        keep.mkdir()
        code = "{a}" if cu.name in _one_of_each_kind() else "compute_{n}"
        gencode = [f"-gencode=arch=compute_{a[3:]},code=" + code.format(a=a, n=a[3:]) for a in _archs(cu)]
        proc = subprocess.run([nvcc, "--fatbin", *gencode, "--fmad=false", "--keep", f"--keep-dir={keep}",
                               str(cu), "-o", str(keep / (cu.stem + ".fatbin"))],
                              capture_output=True, text=True, cwd=keep)
        return cu.name, (proc.returncode, proc.stderr, keep)

    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        return dict(pool.map(one, _nvcc_sources(request.config)))


def _ptx(keep: Path, cu: Path, arch: str) -> Path:
    """The PTX nvcc kept for cu and arch (named by the architecture where it made several)."""
    return keep / (f"{cu.stem}.compute_{arch[3:]}.ptx" if len(_archs(cu)) > 1 else f"{cu.stem}.ptx")


def _ptx_entries(ptx: str) -> dict[str, str]:
    """{kernel name: PTX body} of every .entry."""
    parts = re.split(r"^\.visible \.entry (\w+)\(", ptx, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


# ----------------------------------------------------------------------------- nvcc

def _cuda_entries() -> list:
    """The catalog's ops the cuda backend builds."""
    from symgrad import backends
    return [op for op in catalog.entries() if backends.get("cuda").builds(op)]


def test_every_catalog_op_has_a_cuda_module():
    for op in _cuda_entries():
        assert (ROOT / "generated" / "cuda" / cuda_backend.source_name(op)).is_file()
        assert (ROOT / "generated" / "cuda" / cuda_backend.loader_name(op)).is_file()
    assert len(CATALOG_CU) == len(_cuda_entries())


@pytest.mark.parametrize("cu", [cu if cu.name in _one_of_each_kind() else pytest.param(cu, marks=pytest.mark.slow)
                                for cu in CATALOG_CU], ids=[p.stem for p in CATALOG_CU])
def test_nvcc_compiles_for_sm80_and_sm90(nvcc_builds, cu):
    rc, stderr, keep = nvcc_builds[cu.name]
    assert rc == 0, stderr[-4000:]
    for arch in _archs(cu):
        ptx = _ptx(keep, cu, arch)
        assert ptx.is_file() and ".entry" in ptx.read_text(), f"no {arch} PTX for {cu.name}"
        if cu.name in _one_of_each_kind():
            cubin = keep / f"{cu.stem}.compute_{arch[3:]}.cubin"
            assert cubin.is_file() and cubin.stat().st_size > 0, f"no {arch} machine code for {cu.name}"
    assert "warning" not in stderr.lower(), stderr[-4000:]


def test_one_source_of_every_kind_is_assembled_to_machine_code():
    kinds = {op.spec.kind for op in _cuda_entries()}
    assert len(_one_of_each_kind()) == len(kinds) >= 8, sorted(kinds)
    assert {len(_archs(cu)) for cu in CATALOG_CU if cu.name in _one_of_each_kind()} == {len(ARCHS)}


def test_no_atomic_operation_in_the_source():
    """No kernel of any committed .cu file (comments aside) names an atomic operation, except
    the claim kernel of unpooling (an atomicMax, whose result does not depend on the order)."""
    for cu in CATALOG_CU:
        code = re.sub(r"//[^\n]*", "", cu.read_text())
        if cu.name.startswith("max_unpool"):
            claim = re.search(r"void claim_kernel\(.*?\n}\n", code, re.S)
            assert claim and "atomicMax(" in claim.group(0), cu.name
            code = code.replace(claim.group(0), "")
        assert "atomic" not in code.lower(), cu.name
        assert re.search(r"\w+_backward_\w+\(", code), cu.name


def test_no_atomic_instruction_in_any_backward_kernel(nvcc_builds):
    """In the PTX nvcc makes (sm_80, and sm_90 for one file of each kind): no atom or red
    instruction in a backward kernel."""
    backward = 0
    compiled = [cu for cu in CATALOG_CU if cu.name in nvcc_builds]
    for cu in compiled:
        rc, _, keep = nvcc_builds[cu.name]
        assert rc == 0
        for arch in _archs(cu):
            entries = _ptx_entries(_ptx(keep, cu, arch).read_text())
            for name, body in entries.items():
                if "_backward_" in name:
                    backward += 1
                    assert not re.search(r"^\s*(@!?%p\d+\s+)?(atom|red)\.", body, re.M), f"{name} ({arch})"
    assert backward >= 4 * (len(compiled) + len(_one_of_each_kind()))  # every dtype, each arch


def test_float_kernels_do_no_double_math(nvcc_builds):
    """No .f64 instruction in the PTX of a float32, float16 or bfloat16 kernel (and float64
    kernels do use .f64, so the check can see it), except the backward and jvp kernels of an
    order statistic's tie blocks, which add a block's gradients in float64 as the NumPy module
    does (their .cu says so)."""
    f64_seen = False
    for cu in (cu for cu in CATALOG_CU if cu.name in nvcc_builds):
        _, _, keep = nvcc_builds[cu.name]
        blocks = "a tie block's gradients are added in float64" in cu.read_text()
        for name, body in _ptx_entries(_ptx(keep, cu, ARCHS[0]).read_text()).items():
            if blocks and re.search(r"_(backward|jvp)_", name):
                continue
            if re.search(r"_(f32|f16|bf16)(_|$)", name):
                assert ".f64" not in body, f"{name} does double-precision math"
            elif "_f64" in name:
                f64_seen |= ".f64" in body
    assert f64_seen


# ----------------------------------------------------------------------------- the CPU harness

@pytest.mark.parametrize("op,params,shapes,ties", [
    (*c, t) if _default_ties(c[0], c[1], t) else pytest.param(*c, t, marks=pytest.mark.slow)
    for c in CASES for t in POLICIES], ids=[f"{i}-{t}" for i in CASE_IDS for t in POLICIES])
def test_cpu_execution_equals_numpy_bit_for_bit(fake_cupy, monkeypatch, op, params, shapes, ties):
    if not _allowed(op, ties):
        pytest.skip(f"{op} refuses ties={ties!r}")
    problems = every_comparison(fake_cupy, op, params, shapes, ties, monkeypatch.setattr)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("op,params,shapes", [c if _first_case_of_its_op(c[0], c[1])
                                              else pytest.param(*c, marks=pytest.mark.slow) for c in CASES],
                         ids=CASE_IDS)
def test_cpu_execution_equals_numpy_under_each_framework_convention(fake_cupy, monkeypatch, op, params,
                                                                    shapes, convention):
    """A preset's NaN rule and padding (JAX: -inf that takes part) reach the CUDA kernels."""
    problems = every_comparison(fake_cupy, op, params, shapes, {"convention": convention},
                                monkeypatch.setattr)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("op,params,shapes,settings", [c if c[3]["ties"] in DEFAULT_TIES
                                                       else pytest.param(*c, marks=pytest.mark.slow)
                                                       for c in NAN_CASES],
                         ids=[case_id(op, params) + "-" + "-".join(str(v) for v in st.values() if v)
                              for op, params, _, st in NAN_CASES])
def test_cpu_execution_equals_numpy_under_every_nan_rule(fake_cupy, monkeypatch, op, params, shapes,
                                                         settings):
    problems = every_comparison(fake_cupy, op, params, shapes, settings, monkeypatch.setattr)
    assert not problems, "\n".join(problems[:10])


def test_harness_sees_a_wrong_kernel(fake_cupy, tmp_path, monkeypatch):
    """The comparison can fail: a .cu whose take expression is edited (first -> last) differs."""
    module = symgrad.load("max_pool1d", backend="cuda", ties="first", kernel_size=3)
    src = module.SOURCE.read_text()
    edited = src.replace("(v > best) || (sg_isnan(v) && !sg_isnan(best))", "sg_isnan(v) || (v >= best)")
    assert edited != src
    fake_source = tmp_path / module.SOURCE.name
    fake_source.write_text(edited)
    monkeypatch.setattr(module, "SOURCE", fake_source)
    monkeypatch.setattr(module, "_modules", {})
    x = np.array([[1.0, 1.0, 0.0, 2.0, 2.0, 2.0]])
    problems = compare(fake_cupy, "max_pool1d", {"kernel_size": 3}, "first", [x], np.float64, module=module)
    assert any("saved index differs" in p for p in problems)


def test_loader_compiles_without_fma_contraction(fake_cupy):
    module = symgrad.load("relu", backend="cuda")
    module.forward(np.ones(3))
    assert "--fmad=false" in module.NVRTC_OPTIONS
    assert fake_cupy.RawModule.compiled and all("--fmad=false" in o for o in fake_cupy.RawModule.compiled)


# ----------------------------------------------------------------------------- 16-bit types

HALVES = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _reference(op, inputs32, g32, **params):
    """The NumPy module's output and gradients in float32."""
    m = symgrad.load(op, **params)
    with np.errstate(invalid="ignore", over="ignore"):
        y, saved = m.forward(*inputs32)
        return y, m.backward(g32, saved)


# every float16 value: loaded into float exactly (relu), results rounded to nearest even
# (a 3-way split: g/3; overlapping windows: g[i-1] + g[i], overflowing to inf)
EXHAUSTIVE = [("relu", {}, lambda n: n), ("max_pool1d", {"ties": "split", "kernel_size": 3}, lambda n: 3 * n),
              ("max_pool1d", {"ties": "all", "kernel_size": 2, "stride": 1}, lambda n: n + 1)]


@pytest.mark.parametrize("op,params,length", EXHAUSTIVE, ids=["relu", "split3", "overlap2"])
def test_float16_conversions_exhaustive(fake_cupy, op, params, length):
    g = HALVES.reshape(1, -1)
    x = g[:, ::-1].copy() if op == "relu" else np.zeros((1, length(g.size)), np.float16)
    module = symgrad.load(op, backend="cuda", **params)
    y, saved = module.forward(x)
    (gx,) = module.backward(g, saved)
    y32, (gx32,) = _reference(op, [x.astype(np.float32)], g.astype(np.float32), **params)
    # relu's forward without a convention is NumPy's float16 maximum, which returns the first of
    # equal values (+0 of 0 and -0), where float32's returns the second (README, Framework conventions)
    y_want = np.maximum(np.float16(0), x) if op == "relu" else y32.astype(np.float16)
    assert not mismatch(y, y_want)
    with np.errstate(over="ignore"):
        assert not mismatch(gx, gx32.astype(np.float16))


# constants that float16 cannot hold, under both presets: float16 kernels take them rounded to
# float16, and round each product and sum, where the preset computes float16 in float16 (jax;
# torch's clamp), and compute in float32 where it does (torch's leaky_relu)
HALF_CONSTANTS = [("leaky_relu", {}, "jax"), ("clamp", {"min": -0.1, "max": 0.3}, "torch")]


@pytest.mark.parametrize("op,params,convention", HALF_CONSTANTS, ids=[f"{o}-{c}" for o, _, c in HALF_CONSTANTS])
def test_float16_constants_as_the_numpy_module_under_each_preset(fake_cupy, op, params, convention):
    """Every float16 value (and every one as a gradient) through the CUDA module equals the NumPy
    module in float16 bit for bit, forward, backward and jvp, under each preset."""
    x = HALVES.reshape(1, -1)
    g = np.roll(HALVES, 7).reshape(1, -1)
    numpy_module = symgrad.load(op, convention=convention, **params)
    module = symgrad.load(op, backend="cuda", convention=convention, **params)
    with np.errstate(all="ignore"):
        y_ref, saved_ref = numpy_module.forward(x)
        (gx_ref,) = numpy_module.backward(g, saved_ref)
        t_ref = numpy_module.jvp(g, saved_ref)
    y, saved = module.forward(x)
    (gx,) = module.backward(g, saved)
    assert not mismatch(y, y_ref)
    assert not mismatch(gx, gx_ref)
    assert not mismatch(module.jvp(g, saved), t_ref)


def _bf16_round(f32: np.ndarray) -> np.ndarray:
    """bfloat16 bits of float32 values, rounded to nearest even: by scaling each value's
    mantissa to 8 significant bits in float64 (an oracle independent of the kernels' bit trick)."""
    with np.errstate(invalid="ignore"):
        f = f32.astype(np.float64)
    out = np.empty(f.shape, dtype=np.float64)
    tiny = np.abs(f) < 2.0**-126  # the subnormal range: a fixed step of 2^-133
    with np.errstate(invalid="ignore", over="ignore"):
        out[tiny] = np.round(f[tiny] / 2.0**-133) * 2.0**-133
        m, e = np.frexp(f[~tiny])
        out[~tiny] = np.ldexp(np.round(m * 256) / 256, e)
        bits = (out.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    bits[np.isnan(f32)] = 0x7FC0
    return bits


def test_bfloat16_oracle_agrees_with_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (an extra check)")
    f = np.random.default_rng(0).normal(scale=1e3, size=100_000).astype(np.float32)
    f[:4] = [3.0e38, -1e-39, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8]
    assert np.array_equal(_bf16_round(f), f.astype(ml_dtypes.bfloat16).view(np.uint16))


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _same_bf16(got: np.ndarray, want: np.ndarray) -> bool:
    nan = (got & 0x7FFF) > 0x7F80
    return bool(np.array_equal(nan, (want & 0x7FFF) > 0x7F80) and np.array_equal(got[~nan], want[~nan]))


@pytest.mark.parametrize("op,params,length", EXHAUSTIVE, ids=["relu", "split3", "overlap2"])
def test_bfloat16_kernels_exhaustive(host_cache, op, params, length):
    """The bfloat16 kernels, every value (called directly: CuPy has no bfloat16 arrays)."""
    g = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    x = g[::-1].copy() if op == "relu" else np.zeros(length(g.size), np.uint16)
    spec = resolve(op, **params)
    host = harness.build(render_cuda(spec)[cuda_backend.source_name(spec)], host_cache)
    name = naming.module_name(spec)
    out, grad = np.empty(g.size, np.uint16), np.empty_like(x)
    if op == "relu":
        n = (np.int32(x.size),)
        host.launch(f"{name}_forward_bf16_i32", (256,), (256,), (x, out, *n))
        host.launch(f"{name}_backward_bf16_i32", (256,), (256,), (g, x, grad, *n))
    else:
        sizes = (np.int32(1), np.int32(1), np.int32(x.size), np.int32(g.size))
        count = np.empty(g.size, np.uint8)
        saved = (count,) if params["ties"] == "split" else ()
        host.launch(f"{name}_forward_bf16_nchw_i32", (256,), (256,), (x, out, *saved, *sizes))
        host.launch(f"{name}_backward_bf16_nchw_i32", (256,), (256,), (g, x, out, *saved, grad, *sizes))
    y32, (gx32,) = _reference(op, [_bf16_to_f32(x)[None]], _bf16_to_f32(g)[None], **params)
    assert _same_bf16(out, _bf16_round(y32[0]))
    assert _same_bf16(grad, _bf16_round(gx32[0]))


# bfloat16 under a preset that computes it in bfloat16 (the NumPy module's _output_bf16: jax's
# leaky_relu, torch's clamp with a bound bfloat16 cannot hold): the bfloat16 kernels round each
# constant, product and sum to bfloat16 as the NumPy module does
BF16_CONSTANTS = [("leaky_relu", {"negative_slope": 0.3}, "jax"), ("clamp", {"min": -0.1, "max": 0.3}, "torch")]


@pytest.mark.parametrize("op,params,convention", BF16_CONSTANTS, ids=[f"{o}-{c}" for o, _, c in BF16_CONSTANTS])
def test_bfloat16_kernels_as_the_numpy_module_under_each_preset(host_cache, op, params, convention):
    """Every bfloat16 value (and every one as a gradient and a tangent) through the bfloat16
    kernels equals the NumPy module in bfloat16 bit for bit, forward, backward and jvp."""
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (the NumPy module's bfloat16)")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    x = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    g = np.roll(x, 7)
    spec = resolve(op, convention=convention, **params)
    host = harness.build(render_cuda(spec)[cuda_backend.source_name(spec)], host_cache)
    name, n = naming.module_name(spec), np.int32(x.size)
    out, grad, tangent = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    host.launch(f"{name}_forward_bf16_i32", (256,), (256,), (x, out, n))
    host.launch(f"{name}_backward_bf16_i32", (256,), (256,), (g, x, grad, n))
    host.launch(f"{name}_jvp_bf16_i32", (256,), (256,), (g, x, tangent, np.int32(1), n))
    numpy_module = symgrad.load(op, convention=convention, **params)
    with np.errstate(all="ignore"):
        y_ref, saved = numpy_module.forward(x.view(bf16))
        (gx_ref,) = numpy_module.backward(g.view(bf16), saved)
        t_ref = numpy_module.jvp(g.view(bf16), saved)
    for got, want in [(out, y_ref), (grad, gx_ref), (tangent, t_ref)]:
        assert _same_bf16(got, want.view(np.uint16))


# ----------------------------------------------------------------------------- the source

X, Y = sp.symbols("x y", real=True)


@pytest.mark.parametrize("expr,real_type,want", [
    (sp.Ge(X, Y), "float", "x >= y"),
    (sp.Gt(X, 0), "float", "x > 0.0f"),
    (sp.Gt(X, 0), "double", "x > 0.0"),
    (sp.Eq(X, Y, evaluate=False), "float", "x == y"),
    (sp.Or(sp.Gt(X, Y), IsNan(X)), "float", "sg_isnan(x) || (x > y)"),
    (sp.And(sp.Gt(X, Y), sp.Not(IsNan(Y))), "double", "!sg_isnan(y) && (x > y)"),
    (Select(sp.Gt(X, 0), Y, 0), "float", "(x > 0.0f) ? y : 0.0f"),
    (Quotient(X, Count(sp.Gt(X, 0), sp.Ge(Y, 0))), "float", "(x) / ((float)(x > 0.0f) + (float)(y >= 0.0f))"),
    (MaxOf(X, Y), "float", "(sg_isnan(x) || x > y) ? x : y"),
    (MinOf(X, sp.Float(0.1, 17)), "float", "(sg_isnan(x) || x < 0.1f) ? x : 0.1f"),
    (MinOf(X, sp.Float(0.1, 17)), "double", "(sg_isnan(x) || x < 0.1) ? x : 0.1"),
    (sp.Float(0.01, 17) * X, "float", "0.01f*x"),
    (sp.Integer(6), "float", "6.0f"),
    (sp.Float(1e-5, 17), "float", "1e-05f"),
    (sp.Float(1e300, 17), "float", "sg_inf_f()"),
    (sp.Float(-1e300, 17), "float", "-sg_inf_f()"),
    (sp.Float(1e300, 17), "double", "1e+300"),
])
def test_cuda_printer(expr, real_type, want):
    assert cuda_code(expr, real_type) == want


def test_maxof_is_numpys_maximum_not_fmax():
    """MaxOf/MinOf propagate NaN and return the second of two equal values (+0 and -0), as
    np.maximum and np.minimum do: evaluated here by Python with the printed expression."""
    def run(code, a, b):
        code = code.replace("sg_isnan", "math.isnan").replace("||", "or")
        cond, rest = code.split(" ? ")
        then, other = rest.split(" : ")
        import math
        env = {"x": a, "y": b, "math": math}
        return eval(then, env) if eval(cond, env) else eval(other, env)

    for a, b in [(np.nan, 1.0), (1.0, np.nan), (0.0, -0.0), (-0.0, 0.0), (2.0, 1.0), (1.0, 2.0)]:
        for fold, ref in ((MaxOf, np.maximum), (MinOf, np.minimum)):
            got, want = run(cuda_code(fold(X, Y), "double"), a, b), ref(a, b)
            assert mismatch(np.array([got]), np.array([want])) == "", (fold, a, b)


def test_float_literals_are_numpys_float32_values():
    """A float kernel's literal is the Python float cast to float32, as NumPy uses it."""
    for v in (0.1, 0.01, 1 / 3, 2.0**-140, 3.4028234663852886e38, 0.30000000000000004, -7.5):
        text = cuda_code(sp.Float(v, 17), "float")
        assert text.endswith("f") and np.float32(text[:-1]) == np.float32(v), (v, text)
        assert float(cuda_code(sp.Float(v, 17), "double")) == v


def test_templates_write_no_value_comparison():
    """The tie policy and the NaN rule reach the .cu only as printed expressions: no template
    compares the values (v, best, extremum) or calls sg_isnan itself."""
    for path in (ROOT / "symgrad" / "backends" / "cuda" / "templates").glob("*.jinja"):
        text = re.sub(r".*bool sg_isnan\(const (float|double) v\) \{ return v != v; \}\n", "", path.read_text())
        assert not re.search(r"\b(v|best|extremum|raw)\s*(<=|>=|==|!=|<|>)", text), path.name
        assert "sg_isnan(" not in text, path.name


def test_policy_expressions_flow_into_the_cuda_source(monkeypatch):
    """Change the lowered selection (the 'first' scan made non-strict, the hit rule without
    NaN): the .cu carries exactly what the printer makes of the changed expressions."""
    from symgrad import lower as lowering
    from symgrad import pipeline, policy
    real_lower = lowering.lower

    def changed(d):
        k = real_lower(d)
        sel = k.selection
        if sel.form == "scan":
            sel = type(sel)(**{**sel.__dict__, "take": policy.nan_aware(Indicator(sp.Ge(V, BEST)))})
        else:
            sel = type(sel)(**{**sel.__dict__, "hit": sp.Eq(V, sp.Symbol("extremum", real=True), evaluate=False)})
        return type(k)(**{**k.__dict__, "selection": sel})

    monkeypatch.setattr(lowering, "lower", changed)
    pipeline._build.cache_clear()
    monkeypatch.setattr(pipeline, "_build", pipeline._build.__wrapped__)  # build again, changed
    src = render_cuda(resolve("max_pool2d", "first", kernel_size=2))["max_pool2d_k2x2_first.cu"]
    assert "return sg_isnan(v) || (v >= best);" in src and "(v > best)" not in src
    src = render_cuda(resolve("amax", "split"))["amax_split.cu"]
    assert "return v == extremum;" in src and "sg_isnan(v) || (v == extremum)" not in src


def _normalize(signature: str) -> str:
    s = " ".join(signature.replace("__restrict__", "").split())
    s = re.sub(r"\bconst (int|long long) ", r"\1 ", s)
    return s.replace("( ", "(").replace(" ,", ",")


def test_header_documents_every_kernel():
    """The header's generic signatures, expanded over DT, LAYOUT and IX, are the kernels."""
    types = {"f16": "sg_half", "bf16": "sg_bfloat16", "f32": "float", "f64": "double"}
    for cu in CATALOG_CU:
        text = cu.read_text()
        actual = {_normalize(f"{name}({', '.join(p.declaration for p in params)})")
                  for name, params in harness.kernels(text).items()}
        documented = set()
        # (unpooling's claim kernel takes no values, so it has no <DT> variants)
        for line in re.findall(r"^//   (\w+_<DT>\S*\(.*\)|\w+_claim\(.*\))$", text, re.M):
            for dt, t in types.items():
                for layout in ("nchw", "nhwc"):
                    for ix, i in (("i32", "int"), ("i64", "long long")):
                        sig = line.replace("<DT>", dt).replace("<LAYOUT>", layout).replace("<IX>", ix)
                        sig = re.sub(r"\bT\b", t, sig)
                        sig = re.sub(r"\bI\b", i, sig)
                        documented.add(_normalize(sig))
        assert actual and actual <= documented, (cu.name, sorted(actual - documented)[:3])
        assert "Saved state:" in text and "gather form" in text


def test_generation_is_deterministic():
    op = resolve("max_pool3d", "split", kernel_size=2)
    assert render_cuda(op) == render_cuda(resolve("max_pool3d", "split", kernel_size=(2, 2, 2), stride=2))


# ----------------------------------------------------------------------------- the loader

def test_loader_imports_without_cupy_and_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy fails
    module = symgrad.load("max_pool2d", backend="cuda", kernel_size=2)
    with pytest.raises(ModuleNotFoundError, match=r"max_pool2d: the CUDA backend needs CuPy, which is "
                                                  r"not installed.*pip install cupy-cuda12x"):
        module.forward(np.ones((1, 1, 2, 2)))


def test_loader_imports_neither_sympy_nor_cupy():
    path = ROOT / "generated" / "cuda" / "max_pool2d_k3x3_s2x2_p1x1_first_cuda.py"
    code = (f"import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('m', {str(path)!r})\n"
            f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"assert m.SOURCE.is_file() and m.INDEX_DTYPE.__name__ == 'uint8'\n"
            f"bad = [k for k in sys.modules if k.split('.')[0] in ('sympy', 'jinja2', 'symgrad', 'cupy')]\n"
            f"assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("op,params,shape", [
    ("relu", {}, (2, 3)), ("maximum", {}, (2, 3)), ("max_pool2d", {"kernel_size": 2}, (1, 2, 4, 4)),
    ("maxout", {"pieces": 2}, (2, 4)), ("amax", {"dim": 1}, (2, 3))])
def test_loader_rejects_bad_inputs(fake_cupy, op, params, shape):
    module = symgrad.load(op, backend="cuda", **params)
    n = len(getattr(module, "INPUTS", ("x",)))
    x = np.ones(shape)
    with pytest.raises(TypeError, match=r"must be a cupy.ndarray of float16.*got dtype int64"):
        module.forward(*[np.ones(shape, dtype=np.int64)] * n)
    with pytest.raises(TypeError, match=r"must be a cupy.ndarray.*got builtins.list"):
        module.forward(*[x.tolist()] * n)
    y, saved = module.forward(*[x] * n)
    with pytest.raises(ValueError, match=r"grad_output must have the forward output's shape"):
        module.backward(np.ones(y.shape + (1,)), saved)
    with pytest.raises(TypeError, match=r"saved must be the Saved value"):
        module.backward(np.ones(y.shape), tuple(saved))


def test_loader_rejects_host_arrays_with_a_hint(monkeypatch, _fake):
    class Device(np.ndarray):  # a device array type that numpy arrays are not
        pass

    cp = type(sys)("cupy")
    cp.__dict__.update(_fake.__dict__)
    cp.ndarray = Device
    monkeypatch.setitem(sys.modules, "cupy", cp)
    module = symgrad.load("relu", backend="cuda")
    with pytest.raises(TypeError, match=r"x must be a cupy.ndarray.*copy it to the GPU with cupy.asarray, "
                                        r"got numpy.ndarray"):
        module.forward(np.ones(3))


def test_loader_errors_match_the_numpy_module(fake_cupy):
    pool = symgrad.load("max_pool1d", backend="cuda", kernel_size=2, dilation=3, padding=1, stride=1)
    with pytest.raises(ValueError, match="only padding"):
        pool.forward(np.ones((1, 2)))
    with pytest.raises(ValueError, match=r"x must have 2 dims \(C, \*spatial\) or 3 dims"):
        symgrad.load("max_pool1d", backend="cuda", kernel_size=2).forward(np.ones(4))
    with pytest.raises(ValueError, match=r"dim 2 is out of range"):
        symgrad.load("amax", backend="cuda", dim=2).forward(np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"inputs must broadcast together"):
        symgrad.load("maximum", backend="cuda").forward(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match=r"multiple of pieces=2"):
        symgrad.load("maxout", backend="cuda", pieces=2).forward(np.ones((1, 3)))


@pytest.mark.parametrize("op,params,shape", [
    ("max_pool2d", {"kernel_size": 2}, (0, 3, 4, 4)), ("maxout", {"pieces": 2}, (0, 4, 2)),
    ("amax", {"dim": 1}, (0, 3)), ("relu", {}, (0, 3))])
def test_zero_size_batch(fake_cupy, op, params, shape):
    module = symgrad.load(op, backend="cuda", **params)
    y, saved = module.forward(np.ones(shape))
    (g,) = module.backward(np.ones(y.shape), saved)
    assert g.shape == shape and y.size == 0


def test_saved_state_is_one_byte_per_output_for_first_and_last(fake_cupy):
    for ties in ("first", "last"):
        pool = symgrad.load("max_pool2d", backend="cuda", ties=ties, kernel_size=3, stride=2, padding=1)
        y, saved = pool.forward(np.ones((2, 3, 9, 9), np.float16))
        assert saved.index.dtype == np.uint8 and saved.index.nbytes == y.size
        assert set(saved._fields) == {"index", "layout", "input_shape", "output_shape", "dtype"}


def test_index_width_switches_at_2_to_the_31():
    module = symgrad.load("max_pool2d", backend="cuda", kernel_size=2)
    assert module._index_type(2**31 - 1) == ("i32", np.int32)
    assert module._index_type(10, 2**31) == ("i64", np.int64)


def test_mixed_dtypes_and_broadcasting_follow_numpy(fake_cupy):
    a = np.array([[0.0], [1.0], [2.0]], dtype=np.float32)
    b = np.array([1.0, 1.0, np.nan, 0.0], dtype=np.float64)
    for ties in POLICIES:
        m_cuda = symgrad.load("maximum", backend="cuda", ties=ties)
        m_np = symgrad.load("maximum", ties=ties)
        y, saved = m_cuda.forward(a, b)
        yn, sn = m_np.forward(a, b)
        g = np.arange(12, dtype=np.float64).reshape(3, 4)
        got, want = m_cuda.backward(g, saved), m_np.backward(g, sn)
        assert not mismatch(y, yn)
        for u, w in zip(got, want):
            assert not mismatch(u, w)


# ----------------------------------------------------------------------------- CLI and API

def _cli(args, cache):
    env = dict(os.environ, SYMGRAD_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "symgrad", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_generates_cuda_and_all(tmp_path):
    out = tmp_path / "out"
    r = _cli(["generate", "max_pool2d", "--kernel-size", "2", "--backend", "all", "--out", out], tmp_path)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ["max_pool2d_k2x2_first.c", "max_pool2d_k2x2_first.cu", "max_pool2d_k2x2_first.py",
                     "max_pool2d_k2x2_first_cpu.py", "max_pool2d_k2x2_first_cuda.py",
                     "max_pool2d_k2x2_first_jax.py", "max_pool2d_k2x2_first_torch.py"]
    cu = (out / "max_pool2d_k2x2_first.cu").read_text()
    assert cu.startswith("// Generated by symgrad") and "--backend cuda" in cu.splitlines()[1]
    r = _cli(["generate", "max_pool2d", "--kernel-size", "2", "--backend", "cuda", "--out", out, "--check"], tmp_path)
    assert r.returncode == 0 and r.stdout.count("up to date") == 2, r.stdout + r.stderr
    (out / "max_pool2d_k2x2_first.cu").write_text(cu.replace("K0 = 2", "K0 = 3"))
    r = _cli(["generate", "max_pool2d", "--kernel-size", "2", "--backend", "cuda", "--out", out, "--check"], tmp_path)
    assert r.returncode == 1 and "K0 = 3" in r.stdout
    r = _cli(["generate", "relu", "--backend", "opencl", "--out", out], tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "opencl" in r.stderr


def test_api_generate_cuda_refuses_before_writing(tmp_path):
    (tmp_path / "relu_first.cu").write_text("// mine\n")
    with pytest.raises(ValueError, match=r"refusing to overwrite .*relu_first.cu"):
        symgrad.generate("relu", tmp_path, backend="cuda")
    assert not (tmp_path / "relu_first_cuda.py").exists()
    path = symgrad.generate("relu", tmp_path, backend="cuda", force=True)
    assert path.name == "relu_first_cuda.py" and (tmp_path / "relu_first.cu").read_text().startswith("// Generated")


def test_load_cuda_generates_into_the_cache_and_repairs_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    module = symgrad.load("clamp", backend="cuda", min=0.25)  # not in the catalog: the cache
    assert module.SOURCE.is_file() and str(module.SOURCE).startswith(str(tmp_path))
    assert "0.25f" in module.SOURCE.read_text()
    key = naming.key(resolve("clamp", min=0.25), "cuda")
    module.SOURCE.unlink()
    monkeypatch.delitem(symgrad.api._LOADED, key)
    again = symgrad.load("clamp", backend="cuda", min=0.25)
    assert again.SOURCE.is_file() and again.SOURCE == module.SOURCE


def test_benchmark_script_explains_itself_and_what_it_needs():
    script = ROOT / "benchmarks" / "cuda_pool.py"
    r = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--channels-last" in r.stdout
    if "cupy" in sys.modules or __import__("importlib").util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the missing-CuPy message is not shown")
    r = subprocess.run([sys.executable, str(script), "--runs", "1"], capture_output=True, text=True)
    assert r.returncode != 0 and "needs CuPy" in r.stderr and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- forged saved values

FORGED = [
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, [(2, 3, 7, 6)]),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "ties": "split"}, [(2, 3, 7, 6)]),
    ("adaptive_max_pool2d", {"output_size": (3, 4)}, [(2, 3, 7, 6)]),
    ("fractional_max_pool2d", {"kernel_size": 2, "output_size": (3, 4)}, [(2, 3, 7, 6), (2, 3, 2)]),
    ("maxout", {"pieces": 2}, [(2, 4, 3)]),
    ("amax", {"dim": 1}, [(3, 4, 5)]),
    ("amax", {"dim": 1, "ties": "split"}, [(3, 4, 5)]),
    ("maximum", {}, [(3, 4), (4,)]),
    ("maximum", {}, [(3, 1), (4,)]),
    ("relu", {}, [(3, 4)]),
    ("max_unpool2d", {"kernel_size": 2}, None),
    ("logsumexp", {"dim": -1}, [(3, 4)]),
]


@pytest.mark.parametrize("op,params,shapes", FORGED, ids=[f"{o}-{i}" for i, (o, _, _) in enumerate(FORGED)])
def test_forged_saved_values_are_refused_before_a_kernel_reads_them(fake_cupy, op, params, shapes):
    """Issue 16: a forged or mutated saved value makes the CUDA loader's backward and jvp raise
    TypeError or ValueError naming a saved field (or compute, where the value is one forward could
    have saved), never launch a kernel on arrays it would read outside of."""
    from test_fuzz import _saved_mutations
    m = symgrad.load(op, backend="cuda", **params)
    rng = np.random.default_rng(16)
    if shapes is None:  # unpooling: values and their indices
        xs = [rng.normal(size=(2, 3, 2, 2)), rng.integers(0, 16, size=(2, 3, 2, 2))]
    else:
        constant = OPS[op].constant_inputs
        xs = [rng.random(s) if name in constant else rng.integers(-2, 3, size=s).astype(np.float32)
              for name, s in zip(OPS[op].inputs, shapes)]
    y, saved = m.forward(*xs)
    g = np.ones_like(y)
    tangents = [x if x.dtype.kind == "f" and name not in OPS[op].constant_inputs else None
                for name, x in zip(OPS[op].inputs, xs)]
    escapes = []
    for name, forged in _saved_mutations(saved, rng):
        for call in (lambda: m.backward(g, forged), lambda: m.jvp(*tangents, forged)):
            try:
                call()
            except (TypeError, ValueError) as exc:
                if not ("saved" in str(exc) or "grad_output" in str(exc) or "tangent" in str(exc)):
                    escapes.append(f"{name}: {type(exc).__name__} naming no saved field: {exc}"[:300])
            except Exception as exc:  # noqa: BLE001 - the point of the test
                escapes.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
    assert not escapes, escapes[:5]


@pytest.mark.parametrize("make,shapes", [
    (lambda: symgrad.load("relu", backend="cuda"), [(3, 4)]),
    (lambda: symgrad.load("maximum", backend="cuda"), [(3, 1), (4,)]),
    (lambda: symgrad.load_expr("Max(x*y, x + y, z)", backend="cuda"), [(2, 1, 4), (3, 1), (4,)]),
], ids=["relu", "maximum-broadcast", "expression"])
def test_a_forged_output_shape_of_an_elementwise_loader_is_refused(fake_cupy, make, shapes):
    """Issue 16: saved.output_shape must be the broadcast of the saved inputs' shapes, as forward
    made it; a forged one (a huge leading dim, which the inputs still broadcast to) gave the
    allocation's MemoryError (CuPy: OutOfMemoryError), or computed on a shape forward never gave."""
    m = make()
    xs = [np.ones(s, np.float32) for s in shapes]
    y, saved = m.forward(*xs)
    assert tuple(saved.output_shape) == tuple(y.shape) == np.broadcast_shapes(*shapes)
    for forged in [(1 << 40,) + y.shape, (2,) + y.shape, y.shape[:-1] + (1,)]:
        bad = saved._replace(output_shape=forged)
        g = np.broadcast_to(np.ones((), np.float32), forged)  # a grad_output of that shape, cheaply
        for call in (lambda: m.backward(g, bad), lambda: m.jvp(*xs, bad)):
            with pytest.raises(ValueError, match=r"saved\.output_shape must be \(") as caught:
                call()
            assert str(y.shape) in str(caught.value)
    assert [tuple(g.shape) for g in m.backward(np.ones_like(y), saved)] == shapes  # the real one works


# Macros another machine's headers may define under a name an input may take (not in
# symgrad/backends/cfamily/macros.py, which lists what nvcc includes on the machine it was dumped on): errno is
# a macro in every C library's errno.h, BSD in the BSDs' sys/param.h; q and w stand for any name.
FOREIGN_MACROS = {"errno": "(*__errno_location())", "BSD": "199506", "q": "1", "w": "(0)"}


def test_no_macro_can_replace_an_input_name_in_the_cu(fake_cupy, tmp_path):
    """Issue 16: an input name is the user's, and a macro of that name in some machine's headers
    (which no list dumped on this machine can know) would be replaced by the preprocessor (the old
    .cu spelled inputs as given: `const float (*__errno_location())` does not compile).  Every
    name made of an input is spelled with symgrad's prefix in the .cu, so a macro of each input's
    name and of every name the old scheme made of it, defined ahead of the file, changes nothing:
    the kernels compile and give the NumPy module's results bit for bit."""
    import importlib.util
    names = list(FOREIGN_MACROS)
    text = "Max(q*errno, BSD + w, 0) + q*w"
    symgrad.generate_expr(text, tmp_path, name="foreign", inputs=names, backend="cuda")
    cu = next(tmp_path.glob("foreign_*.cu"))
    source = cu.read_text()
    defines = "".join(f"#define {n} {v}\n" for n, v in FOREIGN_MACROS.items())
    defines += "".join(f"#define {p}_{n} 1\n" for n in names for p in ("grad", "g", "tangent"))
    cu.write_text(defines + source)
    nvcc = harness.find_nvcc()
    if nvcc is not None:  # and nvcc, with its own headers, compiles it too
        r = subprocess.run([nvcc, "--fatbin", "-gencode=arch=compute_80,code=sm_80", "-Werror", "all-warnings",
                            str(cu), "-o", str(tmp_path / "foreign.fatbin")], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    spec = importlib.util.spec_from_file_location("foreign_loader", next(tmp_path.glob("foreign_*_cuda.py")))
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    reference = symgrad.load_expr(text, inputs=names)
    rng = np.random.default_rng(16)
    xs = [rng.integers(-2, 3, size=(3, 4)).astype(np.float32) for _ in names]  # ties and zeros
    g = rng.normal(size=(3, 4)).astype(np.float32)
    y, saved = loader.forward(*xs)
    y_np, saved_np = reference.forward(*xs)
    assert y.tobytes() == y_np.tobytes()
    for got, want in zip(loader.backward(g, saved), reference.backward(g, saved_np)):
        assert got.tobytes() == want.tobytes()
    assert loader.jvp(*xs, saved).tobytes() == reference.jvp(*xs, saved_np).tobytes()
    for name in names:  # the code names each input only with the prefix
        assert not re.search(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])",
                             "\n".join(l for l in source.splitlines() if not l.lstrip().startswith("//"))), name


def test_an_adaptive_index_outside_its_own_window_is_refused(fake_cupy):
    """A window may be smaller than the box along an axis; an index inside the box but outside its
    window would make jvp read outside the input."""
    m = symgrad.load("adaptive_max_pool1d", backend="cuda", output_size=3)
    x = np.arange(8.0).reshape(1, 1, 8)  # windows [0, 3), [2, 6), [5, 8): box 4, the first has 3
    _, saved = m.forward(x)
    index = saved.index.copy()
    index[..., 0] = 3  # the box's last element: outside the first window
    with pytest.raises(ValueError, match="outside its window"):
        m.jvp(np.ones_like(x), saved._replace(index=index))
