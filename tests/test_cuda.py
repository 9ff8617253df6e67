"""The CUDA backend, validated without a GPU.

* nvcc compiles every committed .cu file for sm_80 and sm_90; in the PTX, no backward kernel
  has an atomic or reduction instruction and no float32/float16/bfloat16 kernel does float64 math;
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
from conftest import ELEMENTWISE, POLICIES, WINDOWED, case_id
from cuda_harness.check import compare, inputs_for, mismatch
from symgrad import catalog, naming
from symgrad.indicators import Indicator, IsNan, MaxOf, MinOf
from symgrad.lower import BEST, COUNT, GRAD_OUTPUT, HIT, V, Count, Quotient, Select
from symgrad.ops import OPS, resolve
from symgrad.printers import cuda_code
from symgrad.render import render_cuda

ROOT = Path(__file__).resolve().parent.parent
CATALOG_CU = sorted((ROOT / "generated" / "cuda").glob("*.cu"))
ARCHS = ("sm_80", "sm_90")
NO_CXX = "no C++ compiler (g++, clang++ or $CXX) on this machine: the CPU execution harness needs one"
NO_NVCC = "nvcc is not on PATH: compiling the .cu files needs the CUDA toolkit"


# ----------------------------------------------------------------------------- the cases

def _key(op, params):
    return (op, repr(resolve(op, **params).params))


def _extra_shapes(op):
    kind = op.spec.kind
    if kind == "pool":
        return [(2, 2) + (5,) * op.spec.spatial]
    if kind == "maxout":
        return [(2, 2 * op.params["pieces"], 3)]
    if kind == "reduction":
        return [(3, 4, 5)]
    return [(3, 4)] * len(op.spec.inputs)


def _cases():
    """The ops of the test tables, and every other (op, parameters) of the catalog."""
    cases = [(op, params, shapes) for op, params, shapes in ELEMENTWISE]
    cases += [(op, params, [shape]) for op, params, shape in WINDOWED]
    seen = {_key(op, params) for op, params, _ in cases}
    for entry in catalog.entries():
        params = {p.name: entry.params[p.name] for p in entry.spec.params
                  if p.required or entry.params[p.name] != p.default}
        if params.get("stride") == params.get("kernel_size"):
            params.pop("stride", None)
        if _key(entry.name, params) not in seen:
            seen.add(_key(entry.name, params))
            cases.append((entry.name, params, _extra_shapes(entry)))
    return cases


CASES = _cases()
CASE_IDS = [case_id(op, params) for op, params, _ in CASES]


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def host_cache(tmp_path_factory):
    """Every .cu source of the cases compiled for the CPU once, in parallel, into a session dir."""
    if harness.find_cxx() is None:
        pytest.skip(NO_CXX)
    cache = tmp_path_factory.mktemp("cuda-host")
    sources = [next(s for n, s in render_cuda(resolve(op, ties, **params)).items() if n.endswith(".cu"))
               for op, params, _ in CASES for ties in POLICIES]
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


@pytest.fixture(scope="session")
def nvcc_builds(tmp_path_factory):
    """{.cu name: (return code, stderr, keep dir)}: every catalog .cu compiled for sm_80 and sm_90
    in one nvcc run each (device code only), side by side, keeping the PTX."""
    nvcc = harness.find_nvcc()
    if nvcc is None:
        pytest.skip(NO_NVCC)
    out = tmp_path_factory.mktemp("nvcc")

    def one(cu: Path):
        keep = out / cu.stem
        keep.mkdir()
        gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in ARCHS]
        proc = subprocess.run([nvcc, "--fatbin", *gencode, "--fmad=false", "--keep", f"--keep-dir={keep}",
                               str(cu), "-o", str(keep / (cu.stem + ".fatbin"))],
                              capture_output=True, text=True, cwd=keep)
        return cu.name, (proc.returncode, proc.stderr, keep)

    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        return dict(pool.map(one, CATALOG_CU))


def _ptx_entries(ptx: str) -> dict[str, str]:
    """{kernel name: PTX body} of every .entry."""
    parts = re.split(r"^\.visible \.entry (\w+)\(", ptx, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


# ----------------------------------------------------------------------------- nvcc

def test_every_catalog_op_has_a_cuda_module():
    for op in catalog.entries():
        assert (ROOT / "generated" / "cuda" / naming.cuda_source_name(op)).is_file()
        assert (ROOT / "generated" / "cuda" / naming.cuda_loader_name(op)).is_file()
    assert len(CATALOG_CU) == len(catalog.entries())


@pytest.mark.parametrize("cu", CATALOG_CU, ids=[p.stem for p in CATALOG_CU])
def test_nvcc_compiles_for_sm80_and_sm90(nvcc_builds, cu):
    rc, stderr, keep = nvcc_builds[cu.name]
    assert rc == 0, stderr[-4000:]
    for arch in ARCHS:
        cubin = keep / f"{cu.stem}.compute_{arch[3:]}.cubin"
        assert cubin.is_file() and cubin.stat().st_size > 0, f"no {arch} code for {cu.name}"
    assert "warning" not in stderr.lower(), stderr[-4000:]


def test_no_atomic_operation_in_any_backward_kernel(nvcc_builds):
    """In the source (every kernel, comments aside) and in the PTX of every backward kernel."""
    backward = 0
    for cu in CATALOG_CU:
        code = re.sub(r"//[^\n]*", "", cu.read_text())
        assert "atomic" not in code.lower(), cu.name
        rc, _, keep = nvcc_builds[cu.name]
        assert rc == 0
        for arch in ARCHS:
            entries = _ptx_entries((keep / f"{cu.stem}.compute_{arch[3:]}.ptx").read_text())
            for name, body in entries.items():
                if "_backward_" in name:
                    backward += 1
                    assert not re.search(r"^\s*(@%p\d+\s+)?(atom|red)\.", body, re.M), f"{name} ({arch})"
    assert backward >= 4 * len(CATALOG_CU)


def test_float_kernels_do_no_double_math(nvcc_builds):
    """No .f64 instruction in the PTX of a float32, float16 or bfloat16 kernel (and float64
    kernels do use .f64, so the check can see it)."""
    f64_seen = False
    for cu in CATALOG_CU:
        _, _, keep = nvcc_builds[cu.name]
        for name, body in _ptx_entries((keep / f"{cu.stem}.compute_80.ptx").read_text()).items():
            if re.search(r"_(f32|f16|bf16)(_|$)", name):
                assert ".f64" not in body, f"{name} does double-precision math"
            elif "_f64" in name:
                f64_seen |= ".f64" in body
    assert f64_seen


# ----------------------------------------------------------------------------- the CPU harness

def _channels_last_ok(op, shapes):
    spec = OPS[op]
    if spec.kind == "pool":
        return len(shapes[0]) == spec.spatial + 2
    return spec.kind == "maxout" and len(shapes[0]) >= 3


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shapes", CASES, ids=CASE_IDS)
def test_cpu_execution_equals_numpy_bit_for_bit(fake_cupy, monkeypatch, op, params, shapes, ties):
    rng = np.random.default_rng(sum(map(ord, f"{op}{params}{ties}")))
    module = symgrad.load(op, backend="cuda", ties=ties, **params)
    problems = []
    for specials in (False, True):  # tie-heavy, then with NaN and +-inf too
        inputs = inputs_for(rng, op, shapes, specials)
        for dtype in (np.float64, np.float32, np.float16):
            problems += compare(fake_cupy, op, params, ties, inputs, dtype, module=module)
    if _channels_last_ok(op, shapes):
        for dtype in (np.float32, np.float16):
            problems += compare(fake_cupy, op, params, ties, inputs, dtype, "channels_last", module=module)
    if OPS[op].kind == "elementwise" and len(shapes) == 1:
        problems += compare(fake_cupy, op, params, ties, inputs, np.float32, "strided", module=module)
    if OPS[op].kind != "reduction":  # the 64-bit index kernels
        monkeypatch.setattr(module, "INDEX32_LIMIT", 0)
        problems += compare(fake_cupy, op, params, ties, inputs, np.float32, module=module)
        if _channels_last_ok(op, shapes):
            problems += compare(fake_cupy, op, params, ties, inputs, np.float64, "channels_last", module=module)
    else:  # reductions in several passes
        monkeypatch.setattr(module, "CHUNK", 2)
        for dtype in (np.float64, np.float16):
            problems += compare(fake_cupy, op, params, ties, inputs, dtype, module=module)
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
    assert not mismatch(y, y32.astype(np.float16))
    with np.errstate(over="ignore"):
        assert not mismatch(gx, gx32.astype(np.float16))


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
    host = harness.build(render_cuda(spec)[naming.cuda_source_name(spec)], host_cache)
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
