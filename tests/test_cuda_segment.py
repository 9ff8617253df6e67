"""The CUDA backend's segment kernels (scatter_max/min, segment_max/min, segment_max_csr/min_csr;
issue 33) without a GPU: the CPU execution harness (tests/cuda_harness: the .cu compiled by the host
C++ compiler, the CuPy loader driven by the CPU stand-in) against the NumPy module (itself checked
against the definition and the frameworks in test_segment*.py), bit for bit: outputs, Saved field
for field, backward and jvp, each run twice (the same bits), on tie-heavy inputs with NaN, +-inf,
+-0 and empty segments, every policy and both presets; the bfloat16 kernels launched directly
against the NumPy module in bfloat16.  The catalog's segment .cu files go through nvcc and the PTX
atomic check of test_cuda.py with the others."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import cuda_harness as harness
import symgrad
from symgrad import naming
from symgrad.backends import cuda as cuda_backend
from symgrad.ops import resolve

VALUES = [0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan]
POLICIES = [{"ties": t} for t in ("first", "last", "split", "all")] + [
    {"convention": "torch"}, {"convention": "jax"}]
OPS = ["scatter_max", "scatter_min", "segment_max", "segment_min", "segment_max_csr", "segment_min_csr"]


# the default run's two sources (a mask under PyTorch's preset on scatter, a scan on CSR
# segments), compiled in one batch; the slow cases compile theirs when they ask
DEFAULT = [("scatter_max", {"dim": 0, "include_self": False, "convention": "torch"}),
           ("segment_max_csr", {"ties": "first"})]


def _source(op, **settings) -> str:
    spec = resolve(op, **settings)
    return symgrad.pipeline.render(spec, symgrad.backends.get("cuda"))[cuda_backend.source_name(spec)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    if harness.find_cxx() is None:
        pytest.skip("no C++ compiler (g++, clang++ or $CXX) on this machine: the CPU execution harness needs one")
    cache = tmp_path_factory.mktemp("cuda-segment")
    harness.build_many([_source(op, **settings) for op, settings in DEFAULT], cache)
    return cache


@pytest.fixture
def cp(cache, monkeypatch):
    """The CPU stand-in for CuPy, importable as cupy for the duration of a test."""
    fake = harness.fake_cupy(cache)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def _same(got, want, what):
    """Equal bits (every NaN taken as NaN), or equal values for what is not a float array."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    if want.dtype.kind == "f":
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), what
        bits = f"u{want.dtype.itemsize}"
        assert np.array_equal(got[~nan].view(bits), want[~nan].view(bits)), (what, got, want)
    else:
        assert np.array_equal(got, want), (what, got, want)


def _params(op, include_self=False):
    if op.startswith("scatter"):
        return {"dim": 0, "include_self": include_self}
    return {} if op.endswith("csr") else {"num_segments": 5}


def _inputs(op, rng, dtype, rows=False):
    """Tie-heavy forward inputs (empty segments among them) and the output's shape."""
    def tie_heavy(shape):
        return np.array(rng.choice(VALUES, size=shape), dtype=dtype)
    if op.endswith("csr"):  # 6 segments over 13 rows, some empty
        indptr = np.sort(np.concatenate([[0, 13], rng.integers(0, 14, 5)]))
        return (tie_heavy((13, 3)), indptr), (6, 3)
    if op.startswith("segment"):
        return (tie_heavy((13, 3)), rng.integers(0, 5, 13)), (5, 3)
    index = rng.integers(0, 4, (4, 9))
    if rows:  # one index per row, the same along the features (whole rows segmented)
        index = np.broadcast_to(rng.integers(0, 4, (4, 1)), (4, 9)).copy()
    return (tie_heavy((5, 9)), index, tie_heavy((4, 9))), (5, 9)


def _run(module, inputs, g, tangents):
    y, saved = module.forward(*inputs)
    return y, saved, module.backward(g, saved), module.jvp(*tangents, saved)


def _compare(numpy_mod, cuda_mod, op, dtype, rng, rows=False):
    """forward, Saved, backward and jvp as the NumPy module's, and the CUDA run twice the same."""
    inputs, out_shape = _inputs(op, rng, dtype, rows)
    g = np.array(rng.choice([1.0, -3.0, 0.0, -0.0, 7.0, 0.5], out_shape), dtype=dtype)
    tangents = [None if i.dtype.kind in "iu" else np.array(rng.choice([1.0, -2.0, 0.25, -0.0], i.shape), dtype=dtype)
                for i in inputs]
    want = _run(numpy_mod, inputs, g, tangents)
    first, second = _run(cuda_mod, inputs, g, tangents), _run(cuda_mod, inputs, g, tangents)
    for got in (first, second):
        _same(got[0], want[0], "output")
        assert got[1]._fields == want[1]._fields
        for field, a, b in zip(want[1]._fields, got[1], want[1]):
            if isinstance(b, np.ndarray):
                _same(a, b, f"saved.{field}")
            else:
                assert a == b, field
        assert len(got[2]) == len(want[2])
        for a, b in zip(got[2], want[2]):
            assert (a is None) == (b is None)
            if b is not None:
                _same(a, b, "backward")
        _same(got[3], want[3], "jvp")


def _modules(op, policy, include_self=False):
    params = _params(op, include_self)
    return symgrad.load(op, backend="numpy", **policy, **params), symgrad.load(op, backend="cuda", **policy, **params)


def _default(op, include_self, policy, dtype) -> bool:
    settings = {**_params(op, include_self), **policy}
    return dtype == np.float32 and (op, settings) in [(o, {**_params(o, False), **st}) for o, st in DEFAULT]


# the default run: the two DEFAULT sources in float32; every op, policy, include_self and dtype with -m slow
CASES = [pytest.param(op, s, p, dt, marks=[] if _default(op, s, p, dt) else [pytest.mark.slow],
                      id=f"{op}-{'self-' if s else ''}{next(iter(p.values()))}-{np.dtype(dt).name}")
         for op in OPS for s in ((False, True) if op.startswith("scatter") else (False,))
         for p in POLICIES for dt in (np.float32, np.float64)]


@pytest.mark.parametrize("op, include_self, policy, dtype", CASES)
def test_harness_is_the_numpy_module_bit_for_bit(cp, op, include_self, policy, dtype):
    """Forward, Saved, backward and jvp equal the NumPy module's on tie-heavy inputs with NaN,
    +-inf, +-0 and empty segments, twice; scatter with element and whole-row indices."""
    numpy_mod, cuda_mod = _modules(op, policy, include_self)
    rng = np.random.default_rng(7)
    for _ in range(3):
        _compare(numpy_mod, cuda_mod, op, dtype, rng)
    if op.startswith("scatter"):
        _compare(numpy_mod, cuda_mod, op, dtype, rng, rows=True)


NAN_POLICIES = [{"ties": t, "nan": n} for n, ties in (("zero", ("split", "all")), ("nan", ("split",)),
                                                      ("each", ("split",)), ("dominate", ("all",))) for t in ties]


@pytest.mark.slow
@pytest.mark.parametrize("policy", NAN_POLICIES, ids=lambda p: f"{p['nan']}-{p['ties']}")
@pytest.mark.parametrize("op, include_self", [("scatter_max", True), ("segment_min_csr", False)])
def test_every_nan_rule_is_the_numpy_module_bit_for_bit(cp, op, include_self, policy):
    """The NaN rules a segment takes besides the presets' (zero, nan, each; pyg's keep is NumPy-only)."""
    numpy_mod, cuda_mod = _modules(op, policy, include_self)
    rng = np.random.default_rng(11)
    for dtype in (np.float32, np.float64):
        for _ in range(2):
            _compare(numpy_mod, cuda_mod, op, dtype, rng)


@pytest.mark.parametrize("op, policy, include_self", [
    ("scatter_max", {"convention": "torch"}, False),
    *[pytest.param(op, p, True, marks=pytest.mark.slow) for op in ("scatter_max", "segment_min")
      for p in ({"ties": "split"}, {"convention": "torch"}, {"ties": "last"})]],
    ids=lambda v: str(next(iter(v.values())) if isinstance(v, dict) else v))
def test_float16_is_the_numpy_module_bit_for_bit(cp, op, policy, include_self):
    """float16 (computed in float, each jvp term rounded to float16) as NumPy's float16."""
    numpy_mod, cuda_mod = _modules(op, policy, include_self)
    rng = np.random.default_rng(3)
    for _ in range(3):
        _compare(numpy_mod, cuda_mod, op, np.float16, rng)


EDGES = [("scatter_max", {"dim": 0, "include_self": False},
          (np.ones((3, 2), np.float32), np.zeros((0, 2), np.int64), np.zeros((0, 2), np.float32))),
         ("scatter_min", {"dim": 1, "include_self": True},
          (np.ones((2, 3)), np.array([[0, 2], [1, 1]]), np.array([[5.0, -0.0], [0.0, -0.0]]))),
         ("scatter_max", {"dim": -1, "include_self": False},
          (np.full((2, 3), -0.0), np.array([[0, 0], [2, 2]]), np.array([[0.0, -0.0], [-0.0, -0.0]]))),
         ("segment_max", {"num_segments": 3}, (np.zeros((0, 2), np.float32), np.zeros(0, np.int64))),
         ("segment_min", {"num_segments": 0}, (np.zeros((0,), np.float32), np.zeros(0, np.int64))),
         ("segment_max", {}, (np.array([1.0, 2.0, -0.0]), np.array([0, 3, 3]))),
         ("segment_max_csr", {}, (np.array([[-0.0], [0.0], [np.nan]]), np.array([0, 0, 2, 3, 3])))]


# the edges the DEFAULT sources take (no src rows; empty segments, tied zeros and NaN in CSR rows)
DEFAULT_EDGES = [("scatter_max", {"convention": "torch", "dim": 0, "include_self": False}, EDGES[0][2]),
                 ("segment_max_csr", {"ties": "first"}, EDGES[-1][2])]


@pytest.mark.parametrize("policy", [
    *[pytest.param(p, marks=pytest.mark.slow) for p in
      ({"ties": "last"}, {"ties": "split"}, {"convention": "torch"}, {"convention": "jax"})], None],
    ids=lambda p: next(iter(p.values())) if p else "default")
def test_empty_segments_dim_size_and_another_dim_are_the_numpy_module(cp, policy):
    """No src rows, no segments, empty segments between used ones, the size from the ids, dim 1 and
    -1, tied zeros: forward, Saved, backward and jvp as the NumPy module's (policy None: the
    DEFAULT sources' edges, in the default run)."""
    edges = DEFAULT_EDGES if policy is None else [(op, {**params, **policy}, x) for op, params, x in EDGES]
    for op, params, inputs in edges:
        numpy_mod = symgrad.load(op, backend="numpy", **params)
        cuda_mod = symgrad.load(op, backend="cuda", **params)
        want, got = numpy_mod.forward(*inputs), cuda_mod.forward(*inputs)
        _same(got[0], want[0], op)
        for a, b in zip(got[1], want[1]):
            if isinstance(b, np.ndarray):
                _same(a, b, op)
            else:
                assert a == b, op
        g = np.full(want[0].shape, 3.0, want[0].dtype)
        for a, b in zip(cuda_mod.backward(g, got[1]), numpy_mod.backward(g, want[1])):
            assert (a is None) == (b is None), op
            if b is not None:
                _same(a, b, op)
        tangents = [None if i.dtype.kind in "iu" else np.full(i.shape, -2.0, i.dtype) for i in inputs]
        _same(cuda_mod.jvp(*tangents, got[1]), numpy_mod.jvp(*tangents, want[1]), op)


def _bf16_launch(host, name, policy, x, ids, g, t, k):
    """The segment_max bf16 kernels on bits: forward, backward, jvp (one column)."""
    e = x.size
    order = np.argsort(ids, kind="stable").astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(ids, minlength=k))]).astype(np.int64)
    initial = np.full(k, 0xFF80, np.uint16)  # -inf
    taking = np.zeros(k, np.uint8)
    out, saved = np.empty(k, np.uint16), np.empty(k, np.int64)
    sizes = (np.int64(k), np.int64(1))
    host.launch(f"{name}_forward_bf16", (4,), (64,), (initial, x, order, offsets, taking, out, saved, *sizes))
    scan = policy.get("ties") in ("first", "last")
    reads = (saved,) if scan else (taking, x, initial, out, saved)
    grad_src, grad_initial, tangent = np.empty(e, np.uint16), np.empty(k, np.uint16), np.empty(k, np.uint16)
    host.launch(f"{name}_backward_bf16", (4,), (64,), (g, ids.astype(np.int64), *reads, grad_src, grad_initial,
                                                      np.int64(k), np.int64(e), np.int64(1)))
    host.launch(f"{name}_jvp_bf16", (4,), (64,), (t, np.zeros(k, np.uint16), order, offsets, *reads, tangent, *sizes))
    return out, grad_src, tangent


@pytest.mark.parametrize("policy", [{"ties": "first"}, *[pytest.param(p, marks=pytest.mark.slow) for p in
                                                         ({"ties": "split"}, {"ties": "all"}, {"ties": "last"})]],
                         ids=lambda p: next(iter(p.values())))
def test_bfloat16_kernels_are_the_numpy_module_in_bfloat16(cache, policy):
    """The bfloat16 kernels (CuPy has no bfloat16 arrays: launched on bits) equal the NumPy module
    run in bfloat16 (widened to float32 and rounded once) on tie-heavy values: forward, backward,
    jvp; jvp's terms summed in float32 unrounded, as that module sums them."""
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (the NumPy module's bfloat16)")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(5)
    k, e = 6, 40
    x = np.array(rng.choice(VALUES + [3.0, 1.0 / 3.0], e), np.float32).astype(bf16)
    indptr = np.sort(np.concatenate([[0, e, e], rng.integers(0, e, k - 2)]))  # the last segment empty
    ids = np.repeat(np.arange(k), np.diff(indptr))
    g = np.array(rng.choice([1.0, -3.0, 0.1, 7.0], k), np.float32).astype(bf16)
    t = np.array(rng.choice([1.0 / 3.0, -2.0, 0.1, 5.0], e), np.float32).astype(bf16)
    spec = resolve("segment_max_csr", **policy)
    host = harness.build(_source("segment_max_csr", **policy), cache)
    got = _bf16_launch(host, naming.module_name(spec), policy, x.view(np.uint16), ids, g.view(np.uint16),
                       t.view(np.uint16), k)
    numpy_mod = symgrad.load("segment_max_csr", **policy)
    with np.errstate(all="ignore"):
        y, saved = numpy_mod.forward(x, indptr)
        (grad, _) = numpy_mod.backward(g, saved)
        tangent = numpy_mod.jvp(t, None, saved)
    for a, b, what in zip(got, (y, grad, tangent), ("forward", "backward", "jvp")):
        _same(a.view(bf16).astype(np.float32), b.astype(np.float32), what)


def test_cuda_builds_the_segments_and_refuses_pyg_in_one_line(cp):
    """--backend all writes segment .cu files; the pyg preset (torch_scatter's start) is refused
    naming the NumPy backend, as the cpu backend does; jvp refuses an index tangent."""
    cuda = symgrad.backends.get("cuda")
    assert cuda.builds(resolve("scatter_max", ties="split"))
    assert not cuda.builds(resolve("segment_max", convention="pyg", num_segments=3))
    with pytest.raises(ValueError, match="backend='numpy'"):
        symgrad.load("segment_max", backend="cuda", convention="pyg", num_segments=3)
    _, cuda_mod = _modules("segment_max_csr", {"ties": "first"})
    y, saved = cuda_mod.forward(np.ones((3, 2)), np.array([0, 1, 3]))
    with pytest.raises(ValueError, match="tangent_indptr must be None"):
        cuda_mod.jvp(np.ones((3, 2)), np.ones(3), saved)
    with pytest.raises(ValueError, match="saved"):  # a winner past src's rows: never read
        cuda_mod.jvp(np.ones((3, 2)), None, saved._replace(winner=np.full((2, 2), 7)))
    with pytest.raises(TypeError, match="integers"):
        cuda_mod.forward(np.ones((3, 2)), np.array([0.0, 1.0, 3.0]))
    with pytest.raises(ValueError, match="indptr must ascend"):
        cuda_mod.forward(np.ones((3, 2)), np.array([0, 2, 1]))
    with pytest.raises(ValueError, match="saved"):  # a key past the segments
        cuda_mod.backward(np.ones((2, 2)), saved._replace(key=np.array([0, 1, 2])))
    with pytest.raises(TypeError, match="backend='numpy'"):  # JAX's 1 / count in float16
        _modules("segment_max", {"convention": "jax"})[1].forward(np.ones(3, np.float16), np.array([0, 0, 1]))


@pytest.mark.slow
def test_nvcc_compiles_every_variant_without_atomics_in_backward(tmp_path):
    """Every segment op under every policy, preset and NaN rule, rendered and compiled by nvcc for
    compute_80 (PTX, no warning): no backward kernel has an atom or red instruction (the catalog's
    segment files get the same check, sm_80 and sm_90, in test_cuda.py)."""
    import re
    import subprocess
    from test_cuda import _ptx_entries
    nvcc = harness.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: compiling the .cu files needs the CUDA toolkit")
    sources = {}
    for op in OPS:
        for policy in POLICIES + NAN_POLICIES:
            spec = resolve(op, **_params(op, True), **policy)
            sources[cuda_backend.source_name(spec)] = _source(op, **_params(op, True), **policy)
    backward = 0
    for name, text in sources.items():
        cu = tmp_path / name
        cu.write_text(text)
        proc = subprocess.run([nvcc, "--ptx", "-arch=compute_80", "--fmad=false", str(cu), "-o",
                               str(cu.with_suffix(".ptx"))], capture_output=True, text=True)
        assert proc.returncode == 0 and "warning" not in proc.stderr.lower(), (name, proc.stderr[-2000:])
        for kernel, body in _ptx_entries(cu.with_suffix(".ptx").read_text()).items():
            if "_backward_" in kernel:
                backward += 1
                assert not re.search(r"^\s*(@!?%p\d+\s+)?(atom|red)\.", body, re.M), kernel
    assert backward == 4 * len(sources) >= 4 * 60
