"""torch_scatter's CPU max (PyTorch Geometric's rule; issue 33): a brute-force oracle written here
from torch_scatter's source (rusty1s/pytorch_scatter 648dda3: csrc/cpu/reducer.h,
scatter_cpu.cpp, segment_csr_cpu.cpp and the ScatterMax/SegmentMaxCSR autograd functions;
torch_scatter has no wheel for torch 2.13), against symgrad's segment_max and segment_max_csr.

reducer.h: the running value starts at numeric_limits<T>::lowest() (max; min: max()) and an
element takes over only where it is strictly greater (new_val > val), its position saved as the
arg: the first of tied elements wins, a NaN never takes over, nor does an element equal to
lowest or -inf.  scatter_cpu: an output no element took over keeps lowest and is then set to 0
(masked_fill(out == lowest, 0)), arg src.size(dim).  segment_csr_cpu: an empty segment is 0,
arg src.size(dim); a non-empty segment no element took over keeps lowest, and its arg is the
previous segment's (args is not reset per segment).  Backward: zeros(src.size(dim) + 1) scattered
with grad_out at arg and narrowed: the gradient goes to the arg (none for src.size(dim))."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from test_segment import _same_bits, _tie_heavy


def _update(val, arg, new, e, ext):
    """reducer.h's update: (value, arg) after element e."""
    if (new > val) if ext == "max" else (new < val):
        return new, e
    return val, arg


def _init(dtype, ext):
    info = np.finfo(dtype)
    return dtype(info.min) if ext == "max" else dtype(info.max)


def torch_scatter_scatter(src, index, dim_size, g, ext="max"):
    """torch_scatter.scatter_max(src, index, 0, dim_size=dim_size) on (E, K) src and (E,) index,
    and the gradient to src for grad_out g."""
    e_count, k_count = src.shape
    out = np.full((dim_size, k_count), _init(src.dtype.type, ext), dtype=src.dtype)
    arg = np.full((dim_size, k_count), e_count, dtype=np.int64)
    for e in range(e_count):
        for k in range(k_count):
            j = index[e]
            out[j, k], arg[j, k] = _update(out[j, k], arg[j, k], src[e, k], e, ext)
    out[out == _init(src.dtype.type, ext)] = 0
    return out, _scattered(arg, g, src.shape)


def torch_scatter_segment_csr(src, indptr, g, ext="max", beaten_only=False):
    """torch_scatter.segment_max_csr(src, indptr) on (E, K) src, and the gradient to src (with
    beaten_only: from the segments an element took over only, the others' stale args left out)."""
    e_count, k_count = src.shape
    n = len(indptr) - 1
    out = np.zeros((n, k_count), dtype=src.dtype)
    arg = np.full((n, k_count), e_count, dtype=np.int64)
    args = [0] * k_count  # std::vector<int64_t> args(K): zeros, never reset
    for j in range(n):
        vals = [_init(src.dtype.type, ext)] * k_count
        for e in range(indptr[j], indptr[j + 1]):
            for k in range(k_count):
                vals[k], args[k] = _update(vals[k], args[k], src[e, k], e, ext)
        if indptr[j + 1] > indptr[j]:  # write(): count > 0
            out[j], arg[j] = vals, args
            if beaten_only:
                arg[j] = np.where(np.array(vals) == _init(src.dtype.type, ext), e_count, args)
    return out, _scattered(arg, g, src.shape)


def _scattered(arg, g, shape):
    """zeros(E + 1, K).scatter_(0, arg, g).narrow(0, 0, E)."""
    grad = np.zeros((shape[0] + 1, shape[1]), dtype=g.dtype)
    for j in range(arg.shape[0]):
        for k in range(arg.shape[1]):
            grad[arg[j, k], k] = g[j, k]
    return grad[:-1]


def _finite_ties(rng, shape, dtype):
    """Ties, +-0 and no NaN or -inf: where torch_scatter's rule is a tie policy."""
    return np.array(rng.choice([0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf], size=shape), dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ext", ["max", "min"])
def test_torch_scatter_is_ties_first_on_nonempty_segments_without_nan_or_inf(dtype, ext):
    """On segments that are not empty and hold no NaN and no -inf (max; +inf for min), torch_scatter's
    CPU scatter_max and segment_max_csr are symgrad's ties='first' bit for bit: output, and the whole
    gradient to the first maximum."""
    rng = np.random.default_rng(21)
    scatter = symgrad.load(f"segment_{ext}", ties="first", num_segments=4)
    csr = symgrad.load(f"segment_{ext}_csr", ties="first")
    for _ in range(20):
        src = _finite_ties(rng, (10, 3), dtype)
        if ext == "min":
            src = -src
        ids = np.concatenate([np.arange(4), rng.integers(0, 4, 6)])
        g = np.array(rng.choice([1.0, -3.0, 0.5], (4, 3)), dtype=dtype)
        want, want_grad = torch_scatter_scatter(src, ids, 4, g, ext)
        y, saved = scatter.forward(src, ids)
        _same_bits(y, want)
        _same_bits(scatter.backward(g, saved)[0], want_grad)
        order = np.argsort(ids, kind="stable")
        indptr = np.searchsorted(ids[order], np.arange(5))
        want, want_grad = torch_scatter_segment_csr(src[order], indptr, g, ext)
        y, saved = csr.forward(src[order], indptr)
        _same_bits(y, want)
        _same_bits(csr.backward(g, saved)[0], want_grad)


def _pyg_inputs(rng, dtype, ext):
    """Tie-heavy rows with NaN, +-inf, +-0 and the dtype's start value (lowest; min: largest)."""
    start = _init(dtype, ext)
    pool = [0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan, start]
    return np.array(rng.choice(pool, size=(12, 2)), dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ext", ["max", "min"])
def test_pyg_preset_is_torch_scatter_scatter_max(dtype, ext):
    """convention='pyg': segment_max/min is torch_scatter.scatter_max/min(src, ids, 0,
    dim_size=num_segments) bit for bit, empty segments and NaN/-inf/lowest-only ones included."""
    rng = np.random.default_rng(22)
    mod = symgrad.load(f"segment_{ext}", convention="pyg", num_segments=6)
    for _ in range(20):
        src, ids = _pyg_inputs(rng, dtype, ext), rng.integers(0, 6, 12)
        g = np.array(rng.choice([1.0, -3.0, 0.5], (6, 2)), dtype=dtype)
        want, want_grad = torch_scatter_scatter(src, ids, 6, g, ext)
        y, saved = mod.forward(src, ids)
        _same_bits(y, want)
        _same_bits(mod.backward(g, saved)[0], want_grad)


@pytest.mark.parametrize("ext", ["max", "min"])
def test_pyg_preset_is_torch_scatter_segment_csr_but_its_stale_arg(ext):
    """convention='pyg': segment_max_csr is torch_scatter.segment_max_csr's output bit for bit, and
    its gradient where a segment has a winner; a non-empty segment no element beats sends none
    (torch_scatter: to the previous segment's winner, test_where_torch_scatter_is_no_tie_policy)."""
    rng = np.random.default_rng(23)
    mod = symgrad.load(f"segment_{ext}_csr", convention="pyg")
    for _ in range(20):
        src, indptr = _pyg_inputs(rng, np.float32, ext), np.sort(rng.integers(0, 13, 7))
        indptr[0], indptr[-1] = 0, 12
        g = np.array(rng.choice([1.0, -3.0, 0.5], (6, 2)), dtype=np.float32)
        want, _ = torch_scatter_segment_csr(src, indptr, g, ext)
        y, saved = mod.forward(src, indptr)
        _same_bits(y, want)
        _, want_grad = torch_scatter_segment_csr(src, indptr, g, ext, beaten_only=True)
        _same_bits(mod.backward(g, saved)[0], want_grad)


def test_pyg_preset_refusals_are_one_line():
    for kw, error, what in (({"backend": "cuda"}, ValueError, "backend='numpy'"),
                            ({"ties": "last"}, ValueError, "ties 'first'"),
                            ({"nan": "dominate"}, ValueError, "nan 'keep'")):
        with pytest.raises(error, match=what) as err:
            symgrad.load("segment_max_csr", convention="pyg", **kw)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="covers segment_max"):
        symgrad.load("scatter_max", convention="pyg")
    with pytest.raises(ValueError, match="convention='pyg'"):
        symgrad.load("segment_max", ties="first", nan="keep", num_segments=2)
    with pytest.raises(TypeError, match="float32 or float64"):
        symgrad.load("segment_max_csr", convention="pyg").forward(np.zeros(2, np.float16), np.array([0, 2]))


def test_where_torch_scatter_is_no_tie_policy():
    """What no symgrad policy or preset reproduces (docs/python.md names it): an empty segment is 0
    (symgrad: the identity), a NaN never wins (symgrad's segments: NaN dominates), a segment of
    -inf is 0 with no gradient, and segment_csr sends the gradient of a non-empty segment that no
    element took over to the previous segment's winner."""
    f32 = np.float32
    src = np.array([[1.0], [np.nan], [np.nan], [-np.inf], [3.0], [3.0]], dtype=f32)
    g = np.array([[1.0], [2.0], [4.0], [8.0], [16.0]], dtype=f32)
    ids = np.array([0, 0, 2, 3, 4, 4])  # segment 1 empty, 2 all NaN, 3 all -inf
    out, grad = torch_scatter_scatter(src, ids, 5, g)
    assert out.ravel().tolist() == [1.0, 0.0, 0.0, 0.0, 3.0]
    assert grad.ravel().tolist() == [1.0, 0.0, 0.0, 0.0, 16.0, 0.0]
    y, saved = symgrad.load("segment_max", ties="first", num_segments=5).forward(src, ids)
    assert np.isnan(y[0, 0]) and y[1, 0] == -np.inf and y[3, 0] == -np.inf
    out, grad = torch_scatter_segment_csr(src, np.array([0, 2, 2, 3, 4, 6]), g)
    assert out[:, 0].tolist() == [1.0, 0.0, np.finfo(f32).min, np.finfo(f32).min, 3.0]
    # segments 2 and 3 (no element took over) send 4 and 8 to row 0, segment 0's winner, written last
    assert grad.ravel().tolist() == [8.0, 0.0, 0.0, 0.0, 16.0, 0.0]


@pytest.mark.slow  # (a cpu module's compile: 2.5 s)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["segment_max_csr", "segment_max", "segment_min", "segment_min_csr"])
def test_cpu_pyg_preset_is_torch_scatter_and_the_numpy_module(op, dtype):
    """The cpu backend's pyg preset: output and gradient as torch_scatter's (the oracle above; csr:
    its gradient where a segment has a winner), and forward, Saved, backward and jvp as the NumPy
    module's bit for bit, on rows with NaN, +-inf, +-0 and the start value, empty segments included;
    float16 refused as by the NumPy module."""
    ext, csr = op.split("_")[1], op.endswith("csr")
    params = {} if csr else {"num_segments": 6}
    cpu = symgrad.load(op, convention="pyg", backend="cpu", **params)
    with pytest.raises(TypeError, match="float32 or float64"):
        cpu.forward(np.zeros(2, np.float16), np.array([0, 2]) if csr else np.array([0, 1]))
    numpy_mod = symgrad.load(op, convention="pyg", backend="numpy", **params)
    rng = np.random.default_rng(24)
    for _ in range(10):
        src = _pyg_inputs(rng, dtype, ext)
        index = np.sort(rng.integers(0, 13, 7)) if csr else rng.integers(0, 6, 12)
        if csr:
            index[0], index[-1] = 0, 12
        g = np.array(rng.choice([1.0, -3.0, 0.5], (6, 2)), dtype=dtype)
        want, _ = (torch_scatter_segment_csr(src, index, g, ext) if csr else
                   torch_scatter_scatter(src, index, 6, g, ext))
        want_grad = (torch_scatter_segment_csr(src, index, g, ext, beaten_only=True)[1] if csr else
                     torch_scatter_scatter(src, index, 6, g, ext)[1])
        (y, saved), (y_np, saved_np) = cpu.forward(src, index), numpy_mod.forward(src, index)
        _same_bits(y, want)
        _same_bits(y, y_np)
        assert all(np.array_equal(a, b) for a, b in zip(saved, saved_np) if isinstance(b, np.ndarray))
        _same_bits(cpu.backward(g, saved)[0], want_grad)
        tangent = np.array(rng.choice([1.0, -2.0, 0.25], src.shape), dtype=dtype)
        _same_bits(cpu.jvp(tangent, None, saved), numpy_mod.jvp(tangent, None, saved_np))
