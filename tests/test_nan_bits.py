"""Which NaN a reduction returns (issue 32 item 3): of a row holding several NaNs (both signs,
float32/float64 payloads too), the output is its winning NaN's bits, the same on the NumPy and
cpu backends: the row's first NaN (row-major along the reduced dims) under first, split, all and
the presets, its last under last (the scan's winner is the last NaN).  PyTorch's and XLA's own
NaN depend on their SIMD lanes (neither first nor last on most rows: docs/conventions.md).

Oracle: a loop over each row in the test, from that rule."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
# NaNs of both signs (float16: the quiet NaN of each sign, which the C kernels store; float32 and
# float64: payloads too)
NANS = {np.float16: [0x7E00, 0xFE00], np.float32: [0x7FC00000, 0xFFC00000, 0x7FC00001, 0xFFC00002],
        np.float64: [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000003]}
SHAPES = [((3, 5), -1), ((4, 17), -1), ((2, 40), -1), ((33, 3), 0), ((5, 6), None), ((3, 4, 9), (0, 2))]
VARIANTS = [{"ties": "first"}, {"ties": "last"}, {"ties": "split"}, {"ties": "all"}, {"convention": "torch"},
            {"convention": "jax"}]


def _input(shape, dtype, rng) -> np.ndarray:
    x = rng.standard_normal(shape).astype(dtype)
    bits = x.reshape(-1).view(UINT[np.dtype(dtype).itemsize])
    where = rng.random(x.size) < 0.3
    bits[where] = rng.choice(NANS[dtype], size=int(where.sum()))
    return x


def _want(x: np.ndarray, dim, last: bool) -> np.ndarray:
    """Each row's first (last) NaN's bits where the row holds one, by a loop; 0 elsewhere."""
    dims = tuple(range(x.ndim)) if dim is None else tuple(d % x.ndim for d in np.atleast_1d(dim))
    kept = [d for d in range(x.ndim) if d not in dims]
    rows = np.transpose(x, kept + list(dims)).reshape(-1, int(np.prod([x.shape[d] for d in dims])))
    out = np.zeros(len(rows), UINT[x.itemsize])
    for r, row in enumerate(rows):
        at = [k for k in range(len(row)) if np.isnan(row[k])]
        if at:
            out[r] = row[at[-1] if last else at[0]:][:1].view(out.dtype)[0]
    return out


def _check(backend: str, variant: dict, dtype) -> None:
    rng = np.random.default_rng(7)
    for shape, dim in SHAPES:
        module = symgrad.load("amax", backend=backend, dim=dim, **variant)
        x = _input(shape, dtype, rng)
        got = np.ascontiguousarray(module.forward(x)[0]).reshape(-1).view(UINT[x.itemsize])
        want = _want(x, dim, variant.get("ties") == "last")
        nan = want != 0
        assert nan.any() and np.array_equal(got[nan], want[nan]), (variant, shape, dim, got, want)


def _cases(default: set) -> list:
    """Every variant x dtype, those outside default slow."""
    return [pytest.param(v, d, marks=() if (v.get("ties") or v["convention"], d.__name__) in default
                         else pytest.mark.slow, id=f"{'-'.join(v.values())}-{d.__name__}")
            for v in VARIANTS for d in (np.float16, np.float32, np.float64)]


@pytest.mark.parametrize("variant,dtype", _cases({("torch", "float16")}))
def test_numpy_module_returns_the_winning_nan(variant, dtype):
    _check("numpy", variant, dtype)


@pytest.mark.slow  # (each variant's C library compiles)
@pytest.mark.parametrize("variant,dtype", _cases(set()))
def test_cpu_module_returns_the_winning_nan(variant, dtype):
    _check("cpu", variant, dtype)


# ----------------------------------------------------------------------------- pooling and segments
# The same rule for windows: a window holding NaNs outputs its winning NaN's bits, the window's
# first NaN in window order (row-major over the window's box, padding left out), its last under
# ties='last' and under the torch preset (PyTorch's pooling kernels: a NaN takes over from the
# running max, so its index, and the output, is the window's last NaN).  Segments: the segment's
# winning NaN in segment order (scatter_max's input[j] where include_self, then src in index
# order): its last under ties='last' (the gradient goes to it) and under the torch preset
# (PyTorch's scatter_reduce amax on the CPU: each NaN src takes over, so the last NaN in index
# order), its first elsewhere (JAX's segment_max returns a NaN by its SIMD lanes: the policy's
# rule), on every backend (the cuda kernels through tests/cuda_harness).  Oracle: loops over each window's elements from the op's
# definition (pooling's boxes; adaptive's floor/ceil bounds; fractional's starts, the NumPy module's
# _windows, equal to the cpu kernel's in tests/test_cpu_fractional_starts.py).

def _pool_boxes(kind: str, length: int, out: int, params: dict) -> list:
    """Each output position's input range along one spatial axis."""
    if kind == "adaptive":
        return [range(i * length // out, -(-(i + 1) * length // out)) for i in range(out)]
    k, s, p = params["kernel_size"], params.get("stride", params["kernel_size"]), params.get("padding", 0)
    return [range(max(i * s - p, 0), min(i * s - p + k, length)) for i in range(out)]


def _window_bits(planes: np.ndarray, boxes_of, last: bool) -> np.ndarray:
    """Each output's winning NaN's bits (0 where its window holds none), by a loop: planes
    (P, *spatial); boxes_of(p) the per-axis input ranges of plane p's outputs."""
    import itertools
    out = []
    for p in range(planes.shape[0]):
        for box in itertools.product(*boxes_of(p)):
            values = [planes[p][at] for at in itertools.product(*box)]
            at = [k for k, v in enumerate(values) if np.isnan(v)]
            out.append(values[at[-1] if last else at[0]].view(UINT[planes.itemsize]) if at else 0)
    return np.array(out, dtype=UINT[planes.itemsize])


POOLS = [("max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 17)),
         ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 9, 10)),
         ("max_pool3d", {"kernel_size": 2}, (1, 2, 4, 5, 4)),
         ("adaptive_max_pool2d", {"output_size": (3, 4)}, (2, 3, 7, 9)),
         ("fractional_max_pool2d", {"kernel_size": 2, "output_size": (3, 4)}, (2, 3, 7, 9))]
# (backend, op, variant) in the default run; the rest slow
POOLS_DEFAULT = {("numpy", "max_pool2d", "torch"), ("numpy", "max_pool2d", "last"), ("numpy", "adaptive_max_pool2d", "split"),
                 ("numpy", "fractional_max_pool2d", "jax"), ("numpy", "max_pool1d", "first")}


def _pool_cases(backend: str) -> list:
    return [pytest.param(op, params, shape, v, marks=() if (backend, op, next(iter(v.values()))) in POOLS_DEFAULT
                         else pytest.mark.slow, id=f"{op}-{'-'.join(v.values())}")
            for op, params, shape in POOLS for v in VARIANTS]


def _check_pool(backend: str, op: str, params: dict, shape: tuple, variant: dict) -> None:
    rng = np.random.default_rng(11)
    module = symgrad.load(op, backend=backend, **params, **variant)
    for dtype in (np.float32, np.float64):
        x = _input(shape, dtype, rng)
        planes = x.reshape((-1,) + shape[2:])
        if op.startswith("fractional"):
            u = rng.random(shape[:2] + (len(shape) - 2,)).astype(dtype)
            y = np.ascontiguousarray(module.forward(x, u)[0])
            starts = symgrad.load(op, **params, **variant)._windows(x.shape, y.shape, u)
            boxes_of = lambda p: [[range(s, s + params["kernel_size"]) for s in st[p]] for st in starts]  # noqa: E731
        else:
            y = np.ascontiguousarray(module.forward(x)[0])
            kind = "adaptive" if op.startswith("adaptive") else "pool"
            boxes = [_pool_boxes(kind, n, o, params) for n, o in zip(shape[2:], y.shape[2:])]
            boxes_of = lambda p: boxes  # noqa: E731
        want = _window_bits(planes, boxes_of, variant.get("ties") == "last" or variant.get("convention") == "torch")
        got = y.reshape(-1).view(want.dtype)
        nan = want != 0
        assert nan.any() and np.array_equal(got[nan], want[nan]), (op, variant, dtype, np.flatnonzero(got[nan] != want[nan])[:5])


@pytest.mark.parametrize("op,params,shape,variant", _pool_cases("numpy"))
def test_numpy_pooling_returns_the_winning_nan(op, params, shape, variant):
    _check_pool("numpy", op, params, shape, variant)


@pytest.mark.slow  # (each module's C library compiles)
@pytest.mark.parametrize("op,params,shape,variant", _pool_cases("cpu"))
def test_cpu_pooling_returns_the_winning_nan(op, params, shape, variant):
    _check_pool("cpu", op, params, shape, variant)


def _segment_last(variant: dict) -> bool:
    """The winning NaN of a segment is its last (in segment order): under ties='last' (the
    gradient goes to it) and under the torch preset (PyTorch's scatter_reduce: a NaN src takes
    over, in index order on the CPU); its first elsewhere."""
    return variant.get("ties") == "last" or variant.get("convention") == "torch"


def _segment_bits(values: list, last: bool) -> int:
    at = [k for k, v in enumerate(values) if np.isnan(v)]
    return int(values[at[-1] if last else at[0]].view(UINT[values[0].itemsize])) if at else 0


def _forward(backend: str, op: str, arrays: tuple, **settings) -> np.ndarray:
    """The module's forward output on the NumPy arrays, as a NumPy array (torch: CPU tensors;
    jax: jitted, in float64 where asked)."""
    module = symgrad.load(op, backend=backend, **settings)
    if backend == "torch":
        import torch
        return module.forward(*map(torch.from_numpy, arrays))[0].numpy()
    if backend == "jax":
        import jax
        jax.config.update("jax_enable_x64", True)
        return np.asarray(jax.jit(module.forward)(*map(jax.numpy.asarray, arrays))[0])
    return np.asarray(module.forward(*arrays)[0])


def _check_segments(backend: str, variant: dict, dtype, ops=("segment_max", "scatter_max", "segment_max_csr",
                                                             "scatter_min")) -> None:
    rng = np.random.default_rng(13)
    last = _segment_last(variant)
    for op in ops:
        data, ids = _input((40, 3), dtype, rng), rng.integers(0, 6, 40)
        if op == "segment_max":
            y = _forward(backend, op, (data, ids), num_segments=6, **variant)
            rows = [[[data[i, c] for i in range(40) if ids[i] == j] for c in range(3)] for j in range(6)]
        elif op == "segment_max_csr":
            indptr = np.sort(np.concatenate([[0, 40], rng.integers(0, 41, 5)]))
            y = _forward(backend, op, (data, indptr), **variant)
            rows = [[list(data[indptr[j]:indptr[j + 1], c]) for c in range(3)] for j in range(6)]
        else:  # scatter: input[j] first (include_self), then src in index order
            initial, index = _input((6, 3), dtype, rng), rng.integers(0, 6, (40, 3))
            y = _forward(backend, op, (initial, index, data), dim=0, **variant)
            rows = [[[initial[j, c]] + [data[i, c] for i in range(40) if index[i, c] == j] for c in range(3)]
                    for j in range(6)]
        want = np.array([[_segment_bits(col, last) for col in row] for row in rows], dtype=UINT[data.itemsize])
        got = np.ascontiguousarray(y).view(want.dtype)
        nan = want != 0
        assert nan.any() and np.array_equal(got[nan], want[nan]), (op, variant, dtype, got[nan], want[nan])


def _segment_cases(default: set) -> list:
    return [pytest.param(v, d, marks=() if (next(iter(v.values())), d.__name__) in default else pytest.mark.slow,
                         id=f"{'-'.join(v.values())}-{d.__name__}")
            for v in VARIANTS for d in (np.float32, np.float64)]


@pytest.mark.parametrize("variant,dtype", _segment_cases({("first", "float32"), ("torch", "float64"),
                                                          ("last", "float32")}))
def test_numpy_segments_return_the_winning_nan(variant, dtype):
    _check_segments("numpy", variant, dtype)


@pytest.mark.slow  # (each module's C library compiles)
@pytest.mark.parametrize("variant,dtype", _segment_cases(set()))
def test_cpu_segments_return_the_winning_nan(variant, dtype):
    _check_segments("cpu", variant, dtype)


@pytest.mark.parametrize("variant,dtype", _segment_cases({("last", "float64"), ("split", "float32")}))
def test_torch_segments_return_the_winning_nan(variant, dtype):
    pytest.importorskip("torch")
    _check_segments("torch", variant, dtype)


@pytest.mark.parametrize("variant,dtype", _segment_cases({("torch", "float32")}))
def test_jax_segments_return_the_winning_nan(variant, dtype):
    pytest.importorskip("jax")
    _check_segments("jax", variant, dtype)


def test_cpu_segments_under_last_return_the_last_nan():
    """The default run's cpu case (the C fold keeps the segment's last NaN under 'last')."""
    _check_segments("cpu", {"ties": "last"}, np.float32, ops=("scatter_max",))


@pytest.mark.parametrize("variant", [pytest.param(v, marks=() if v == {"ties": "last"} else pytest.mark.slow,
                                                  id="-".join(v.values())) for v in VARIANTS])
def test_cuda_segments_return_the_winning_nan(variant, tmp_path_factory, monkeypatch):
    """The CUDA kernels through the CPU execution harness (tests/cuda_harness)."""
    import sys

    import cuda_harness as harness
    from symgrad.backends import cuda as cuda_backend
    from symgrad.ops import resolve
    if harness.find_cxx() is None:
        pytest.skip("no C++ compiler: the CPU execution harness needs one")
    ops = {"segment_max": {"num_segments": 6}, "scatter_max": {"dim": 0}}
    specs = [resolve(op, **params, **variant) for op, params in ops.items()]
    cache = tmp_path_factory.mktemp("cuda-nan-bits")
    harness.build_many([symgrad.pipeline.render(s, symgrad.backends.get("cuda"))[cuda_backend.source_name(s)]
                        for s in specs], cache)
    monkeypatch.setitem(sys.modules, "cupy", harness.fake_cupy(cache))
    _check_segments("cuda", variant, np.float32, ops=tuple(ops))
