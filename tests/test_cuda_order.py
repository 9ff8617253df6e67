"""The cuda backend's order statistics (issue 29: sort, topk, cummax, cummin, kthvalue, median,
nanmedian), validated without a GPU: each generated .cu compiled by the host C++ compiler through
the CPU execution harness (tests/cuda_harness) and its CuPy loader driven through the CPU stand-in
for CuPy, against the NumPy backend's module (itself checked against a brute-force W, PyTorch and
JAX: tests/test_order.py, tests/test_median.py): forward's values and indices, every saved array,
backward and jvp, bit for bit (signs of zero included; any NaN equal to any NaN) on tie-heavy
inputs with NaN, +-inf and +-0, in float16, float32 and float64 (each compared with the NumPy
module in its own dtype) and bfloat16 (as the NumPy module's wrappers compute it).  nvcc compiles
the sources to PTX (sm_80): no atomic or reduction instruction in a backward kernel, no float64
math in a float32/16 kernel except the tie blocks' float64 sums.  A representative case of each
kernel body in the default run; every policy, preset, NaN rule and dtype with -m slow."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import cuda_harness as harness
import symgrad
from conftest import slow_run
from cuda_harness.order import assert_same_module, bits, shapes_of
from order_cases import every_case
from symgrad import backends
from symgrad.ops import resolve
from symgrad.pipeline import render


@pytest.fixture(scope="module")
def cp(tmp_path_factory, request):
    """The CPU stand-in for CuPy, importable as cupy for the module's tests."""
    if harness.find_cxx() is None:
        pytest.skip("no C++ compiler (g++, clang++ or $CXX): the CPU execution harness needs one")
    cache = tmp_path_factory.mktemp("cuda-order")
    # the default run's sources compiled at once (one translation unit: the compiler started once);
    # with -m slow every case's, in batches
    slow = slow_run(request.config)
    cases = FAST + (list(every_case()) if slow else [])
    harness.build_many([_source(name, params) for name, params in cases], cache, batch=8 if slow else len(FAST))
    fake = harness.fake_cupy(cache)
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = fake
    yield fake
    if saved is None:
        sys.modules.pop("cupy", None)
    else:
        sys.modules["cupy"] = saved


def _source(name: str, params: dict) -> str:
    """The .cu text of an op."""
    files = render(resolve(name, **params), backends.get("cuda"))
    return next(t for n, t in files.items() if n.endswith(".cu"))


# the default run's case (one source: the compiler's start and its time dominate): one rank of a
# row by the quickselect, JAX's two middle ranks, their tie blocks summed in float64 and NumPy's
# pairwise sum; every body, policy and preset with -m slow
FAST = [("median", {"dim": 1, "convention": "jax", "ties": "split"})]


@pytest.mark.parametrize("name,params", FAST, ids=lambda v: v if isinstance(v, str) else "")
def test_cuda_equals_the_numpy_module_bit_for_bit(cp, name, params):
    assert_same_module(name, params)


def test_the_comparison_can_fail(cp):
    """Against the NumPy module of another tie policy ('all': each tied element the whole
    gradient), the same cuda module's backward differs."""
    name, params = FAST[0]
    with pytest.raises(AssertionError, match="backward"):
        assert_same_module(name, params, reference=params | {"ties": "all"})


@pytest.mark.slow
@pytest.mark.parametrize("name,params", list(every_case()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_policy_and_preset_equals_the_numpy_module(cp, name, params):
    assert_same_module(name, params, shapes=shapes_of(name, params), seed=1)


def test_bfloat16_and_empty_rows(cp):
    """bfloat16 as the NumPy module's wrappers compute it (float32, rounded once); rows of no
    element and no rows."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert_same_module(*FAST[0], shapes=((0, 5), (2, 3)), dtypes=(np.float32,))
    for name, params in FAST:
        assert_same_module(name, params, shapes=((5, 7),), dtypes=(ml_dtypes.bfloat16,), seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("name,params", list(every_case()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_bfloat16_of_every_case(cp, name, params):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    shapes = ((45, 2, 2),) if params.get("k") == 40 else ((5, 7), (3, 40))
    assert_same_module(name, params, shapes=shapes, dtypes=(ml_dtypes.bfloat16,), seed=3)


@pytest.mark.slow
@pytest.mark.parametrize("name,params", [("median", {"dim": 1, "ties": "last"}), ("kthvalue", {"k": 40, "dim": 1}),
                                         ("topk", {"k": 40, "dim": 1})], ids=lambda v: v if isinstance(v, str) else "")
def test_long_rows_of_distinct_sorted_and_tied_values(cp, name, params):
    """The quickselect of one rank and the merge sort of topk on rows of 1000: distinct values,
    rows sorted ascending and descending, rows of one value."""
    want_m = symgrad.load(name, backend="numpy", **params)
    got_m = symgrad.load(name, backend="cuda", **params)
    normal = np.random.default_rng(5).standard_normal((4, 1000))
    for x in (normal, np.sort(normal), -np.sort(normal), np.ones((4, 1000)), np.round(normal * 3)):
        want, _ = want_m.forward(x.astype(np.float32))
        got, _ = got_m.forward(x.astype(np.float32))
        assert list(map(bits, got)) == list(map(bits, want))


@pytest.mark.slow
def test_harness_sees_a_wrong_kernel(cp, tmp_path, monkeypatch):
    """The comparison can fail: a .cu whose tie order is edited (equal keys ranked by index
    reversed) selects other indices than the NumPy module."""
    module = symgrad.load("topk", backend="cuda", k=3, ties="first")
    src = module.SOURCE.read_text()
    edited = src.replace("(a).at < (b).at", "(a).at > (b).at")
    edited = edited.replace("if (kept == k && (k == 0 || key >= ranked[k - 1].key))",
                            "if (kept == k && (k == 0 || key > ranked[k - 1].key))")
    edited = edited.replace("while (j > 0 && key < ranked[j - 1].key)", "while (j > 0 && key <= ranked[j - 1].key)")
    assert edited != src
    fake = tmp_path / module.SOURCE.name
    fake.write_text(edited)
    monkeypatch.setattr(module, "SOURCE", fake)
    monkeypatch.setattr(module, "_modules", {})
    x = np.array([[1.0, 1.0, 1.0, 0.0, 1.0]])
    (_, want), _ = symgrad.load("topk", k=3, ties="first").forward(x)
    (_, got), _ = module.forward(x)
    assert want.tolist() == [[0, 1, 2]] and got.tolist() != want.tolist()


def test_a_forged_saved_index_is_one_clear_error(cp):
    m = symgrad.load(FAST[0][0], backend="cuda", **FAST[0][1])
    (y, _), saved = m.forward(np.arange(12.0).reshape(3, 4))
    for bad in (-1, 4):
        forged = saved._replace(indices=np.full_like(saved.indices, bad))
        with pytest.raises(ValueError, match=r"saved.indices must hold values in \[0, 4\)"):
            m.backward(np.ones_like(y), forged)
    with pytest.raises(TypeError, match="saved.indices must have dtype int64"):
        m.backward(np.ones_like(y), saved._replace(indices=saved.indices.astype(np.int32)))


# ----------------------------------------------------------------------------- nvcc

def _sources() -> dict[str, str]:
    """{name: .cu text} of one op of each kernel body and gradient form."""
    cases = [("topk", {"k": 3, "ties": "first"}), ("sort", {"ties": "split"}), ("cummax", {"dim": 1, "ties": "last"}),
             ("cummin", {"dim": 1, "ties": "all", "nan": "zero"}), ("cummax", {"dim": 1, "convention": "jax"}),
             ("kthvalue", {"k": 2, "ties": "first"}), ("median", {"dim": 1, "convention": "jax"}),
             ("nanmedian", {"dim": None, "ties": "split"})]
    return {f"{name}_{i}.cu": _source(name, params) for i, (name, params) in enumerate(cases)}


def _ptx_entries(ptx: str) -> dict[str, str]:
    parts = re.split(r"^\.visible \.entry (\w+)\(", ptx, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


@pytest.mark.slow
def test_nvcc_compiles_every_body_and_backward_has_no_atomics(tmp_path):
    """nvcc compiles one source of each body to PTX for sm_80 without a warning; no backward
    kernel has an atomic or reduction instruction; float32/16 kernels do no float64 math except
    backward and jvp of the tie blocks (the NumPy module's float64 sums), which the header says."""
    nvcc = harness.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: compiling the .cu files needs the CUDA toolkit")
    sources = _sources()
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    procs = [(name, subprocess.Popen([nvcc, "--ptx", "-arch=compute_80", "--fmad=false", name, "-o",
                                      name[:-3] + ".ptx"], cwd=tmp_path, stderr=subprocess.PIPE, text=True))
             for name in sources]
    backward = 0
    for name, proc in procs:
        _, err = proc.communicate()
        assert proc.returncode == 0 and "warning" not in err.lower(), f"{name}: {err[-3000:]}"
        blocks = "a tie block's gradients are added in float64" in sources[name]
        for entry, body in _ptx_entries((tmp_path / (name[:-3] + ".ptx")).read_text()).items():
            if "_backward_" in entry:
                backward += 1
                assert not re.search(r"^\s*(@!?%p\d+\s+)?(atom|red)\.", body, re.M), entry
            if re.search(r"_(f32|f16|bf16)$", entry) and not (blocks and re.search(r"_(backward|jvp)_", entry)):
                assert ".f64" not in body, f"{entry} does double-precision math"
    assert backward == 4 * len(sources)
