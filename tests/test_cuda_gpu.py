"""The CUDA backend on a GPU (marker ``gpu``): runs only where CuPy imports and sees a device.

* the comparisons of the CPU harness (tests/test_cuda.py), on the device: every op of the test
  tables and the catalog, every policy, both framework presets and every NaN rule, bit for bit
  against the NumPy backend;
* backward is bitwise reproducible run to run (overlapping windows, non-integer gradients);
* PyTorch CUDA, where its convention is one of symgrad's policies (see tests/test_torch.py),
  with integer gradients so that sums are exact whatever their order; the bfloat16 kernels
  against PyTorch's bfloat16 pooling;
* the GPU kernels of the CuPy loader take and return device arrays (no host round trip);
* the order statistics (tests/order_cases.py's cases) against the NumPy module.

Run them with `python -m pytest -m gpu` on a machine with a GPU and `pip install ".[cuda]" from the checkout`.
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from conftest import POLICIES, case_id
from cuda_harness.check import CONVENTIONS, cases, every_comparison, nan_cases, to_device
from cuda_harness.order import assert_same_module, shapes_of as order_shapes
from order_cases import every_case as every_order_case

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy", reason='CuPy is not installed: the GPU tests need it (pip install ".[cuda]" from the checkout)')
try:
    DEVICES = cp.cuda.runtime.getDeviceCount()
except Exception as exc:  # no driver, no device
    pytest.skip(f"CuPy sees no GPU ({exc})", allow_module_level=True)
if DEVICES == 0:
    pytest.skip("CuPy sees no GPU", allow_module_level=True)

CASES = cases()
NAN_CASES = nan_cases(CASES)


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shapes", CASES, ids=[case_id(op, params) for op, params, _ in CASES])
def test_device_equals_numpy_bit_for_bit(monkeypatch, op, params, shapes, ties):
    problems = every_comparison(cp, op, params, shapes, ties, monkeypatch.setattr)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("op,params,shapes", CASES, ids=[case_id(op, params) for op, params, _ in CASES])
def test_device_equals_numpy_under_each_framework_convention(monkeypatch, op, params, shapes, convention):
    """The presets' kernels (their NaN rule, padding, signs of zero, float16 arithmetic) on the device."""
    problems = every_comparison(cp, op, params, shapes, {"convention": convention}, monkeypatch.setattr)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("op,params,shapes,settings", NAN_CASES,
                         ids=[case_id(op, params) + "-" + "-".join(str(v) for v in st.values() if v)
                              for op, params, _, st in NAN_CASES])
def test_device_equals_numpy_under_every_nan_rule(monkeypatch, op, params, shapes, settings):
    problems = every_comparison(cp, op, params, shapes, settings, monkeypatch.setattr)
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("op,params,shape", [
    ("max_pool3d", {"kernel_size": 3, "stride": 2, "padding": 1}, (4, 8, 17, 17, 17)),
    ("max_pool2d", {"kernel_size": 3, "stride": 1, "padding": 1}, (8, 16, 64, 64)),
    ("amax", {"dim": 1}, (64, 4096)),
])
@pytest.mark.parametrize("ties", ["first", "split"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_backward_is_bitwise_reproducible(op, params, shape, ties, dtype):
    rng = np.random.default_rng(0)
    m = symgrad.load(op, backend="cuda", ties=ties, **params)
    x = to_device(cp, rng.integers(0, 3, size=shape).astype(dtype))  # many ties
    y, saved = m.forward(x)
    g = to_device(cp, rng.normal(size=y.shape).astype(dtype))  # sums that round
    first = cp.asnumpy(m.backward(g, saved)[0]).view(np.uint8)
    for _ in range(5):
        again = cp.asnumpy(m.backward(g, saved)[0]).view(np.uint8)
        assert np.array_equal(first, again)


def test_more_than_2_to_the_31_elements():
    """A tensor of 2^31 + 1024 float16 elements (4 GiB): the 64-bit index kernels, checked at
    the far end where 32-bit indices would wrap."""
    free, _ = cp.cuda.Device().mem_info
    if free < 16 * 2**30:
        pytest.skip("needs 16 GiB of free GPU memory")
    m = symgrad.load("max_pool1d", backend="cuda", kernel_size=2)
    length = 2**30 + 512
    x = cp.zeros((1, 2, length), dtype=cp.float16)
    x[0, 1, -3] = 5  # in the last window but one, second element
    x[0, 1, -2] = 7  # first element of the last window
    y, saved = m.forward(x)
    assert y.shape == (1, 2, length // 2)
    assert float(y[0, 1, -2]) == 5 and float(y[0, 1, -1]) == 7 and int(saved.index[0, 1, -2]) == 1
    (g,) = m.backward(cp.ones_like(y), saved)
    assert float(g[0, 1, -3]) == 1 and float(g[0, 1, -4]) == 0 and float(g[0, 1, -2]) == 1
    assert float(g.sum(dtype=cp.float64)) == y.size


def test_arrays_stay_on_the_device():
    m = symgrad.load("max_pool2d", backend="cuda", kernel_size=2)
    x = cp.arange(2 * 3 * 4 * 4, dtype=cp.float32).reshape(2, 3, 4, 4)
    y, saved = m.forward(x)
    (g,) = m.backward(cp.ones_like(y), saved)
    assert isinstance(y, cp.ndarray) and isinstance(g, cp.ndarray) and isinstance(saved.index, cp.ndarray)
    assert y.device == x.device and g.device == x.device
    with pytest.raises(TypeError, match="copy it to the GPU with cupy.asarray"):
        m.forward(cp.asnumpy(x))


# ----------------------------------------------------------------------------- PyTorch CUDA

try:
    import torch
    F = torch.nn.functional
except ImportError:
    torch = F = None
TORCH_CUDA = torch is not None and torch.cuda.is_available()
needs_torch_cuda = pytest.mark.skipif(not TORCH_CUDA, reason="PyTorch with CUDA is not available")


def _torch_grads(fn, inputs, g):
    ts = [torch.tensor(x, device="cuda", requires_grad=True) for x in inputs]
    y = fn(*ts)
    y.backward(torch.tensor(g, device="cuda"))
    return y.detach().cpu().numpy(), [t.grad.cpu().numpy() for t in ts]


TORCH = [  # (op, params, ties, torch function, input shapes)
    ("max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, "first",
     lambda t: F.max_pool1d(t, 3, 2, 1), [(2, 3, 33)]),
    ("max_pool2d", {"kernel_size": 2}, "first", lambda t: F.max_pool2d(t, 2), [(2, 3, 16, 16)]),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, "first",
     lambda t: F.max_pool2d(t, 3, 2, 1), [(2, 3, 17, 17)]),
    ("max_pool3d", {"kernel_size": 3, "stride": 2, "padding": 1}, "first",
     lambda t: F.max_pool3d(t, 3, 2, 1), [(1, 2, 9, 9, 9)]),
    ("amax", {"dim": 1}, "split", lambda t: torch.amax(t, dim=1), [(8, 33)]),
    ("amin", {"dim": (0, 2)}, "split", lambda t: torch.amin(t, dim=(0, 2)), [(3, 4, 5)]),
    ("maximum", {}, "split", torch.maximum if torch is not None else None, [(3, 1), (4,)]),
    ("relu", {}, "first", lambda t: F.relu(t), [(64,)]),
    ("clamp", {"min": -1.0, "max": 2.0}, "first", lambda t: torch.clamp(t, -1.0, 2.0), [(64,)]),
    ("hardtanh", {}, "last", lambda t: F.hardtanh(t), [(64,)]),
    ("relu6", {}, "last", lambda t: F.relu6(t), [(64,)]),
    ("leaky_relu", {}, "last", lambda t: F.leaky_relu(t), [(64,)]),
    ("abs", {}, "split", lambda t: torch.abs(t), [(64,)]),
]


@needs_torch_cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op,params,ties,fn,shapes", TORCH, ids=[f"{c[0]}-{c[1]}" for c in TORCH])
def test_equals_pytorch_cuda(op, params, ties, fn, shapes, dtype):
    rng = np.random.default_rng(1)
    kinks = np.array([-2.0, -1.0, 0.0, 1.0, 2.0, 6.0])
    inputs = [(rng.choice(kinks, size=s) if op in ("relu", "clamp", "hardtanh", "relu6", "leaky_relu", "abs")
               else rng.integers(0, 3, size=s)).astype(dtype) for s in shapes]
    m = symgrad.load(op, backend="cuda", ties=ties, **params)
    y, saved = m.forward(*[to_device(cp, x) for x in inputs])
    g = rng.integers(-4, 5, size=y.shape).astype(dtype)
    grads = m.backward(to_device(cp, g), saved)
    ty, tgrads = _torch_grads(fn, inputs, g)
    np.testing.assert_array_equal(cp.asnumpy(y), ty)  # values (abs(+0) is -0 here, as in NumPy)
    for a, b in zip(grads, tgrads):
        np.testing.assert_array_equal(cp.asnumpy(a), b)


@needs_torch_cuda
def test_channels_last_and_half_equal_pytorch_cuda():
    rng = np.random.default_rng(2)
    x = torch.tensor(rng.integers(0, 3, size=(2, 8, 15, 15)), dtype=torch.float16, device="cuda")
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    y = F.max_pool2d(x, 3, 2, 1)
    g = torch.tensor(rng.integers(-4, 5, size=tuple(y.shape)), dtype=torch.float16, device="cuda")
    y.backward(g)
    m = symgrad.load("max_pool2d", backend="cuda", kernel_size=3, stride=2, padding=1)
    ours, saved = m.forward(cp.from_dlpack(x.detach()))
    assert saved.layout == "nhwc"
    (gx,) = m.backward(cp.from_dlpack(g), saved)
    np.testing.assert_array_equal(cp.asnumpy(ours), y.detach().cpu().numpy())
    np.testing.assert_array_equal(cp.asnumpy(gx), x.grad.cpu().numpy())


@needs_torch_cuda
def test_bfloat16_kernels_equal_pytorch_cuda():
    """The bf16 kernels launched on bfloat16 bits (CuPy has no bfloat16 arrays)."""
    rng = np.random.default_rng(3)
    x = torch.tensor(rng.integers(0, 3, size=(2, 4, 9, 9)), dtype=torch.bfloat16, device="cuda").requires_grad_()
    y = F.max_pool2d(x, 3, 2, 1)
    g = torch.tensor(rng.integers(-4, 5, size=tuple(y.shape)), dtype=torch.bfloat16, device="cuda")
    y.backward(g)
    m = symgrad.load("max_pool2d", backend="cuda", kernel_size=3, stride=2, padding=1)
    bits = cp.from_dlpack(x.detach().view(torch.int16)).view(cp.uint16)
    out = cp.empty(tuple(y.shape), dtype=cp.uint16)
    index = cp.empty(tuple(y.shape), dtype=cp.uint8)
    sizes = tuple(np.int32(v) for v in (2, 4, 9, 9, 5, 5))
    m._launch(cp, "forward_bf16_nchw_i32", out.size, (bits, out, index, *sizes))
    grad = cp.empty_like(bits)
    gbits = cp.from_dlpack(g.view(torch.int16)).view(cp.uint16)
    m._launch(cp, "backward_bf16_nchw_i32", grad.size, (gbits, index, grad, *sizes))
    assert np.array_equal(cp.asnumpy(out), y.detach().view(torch.int16).cpu().numpy().view(np.uint16))
    assert np.array_equal(cp.asnumpy(grad), x.grad.view(torch.int16).cpu().numpy().view(np.uint16))


@pytest.mark.parametrize("name,params", list(every_order_case()), ids=lambda v: v if isinstance(v, str) else "")
def test_order_statistics_on_the_device_equal_numpy_bit_for_bit(name, params):
    """sort, topk, cummax, cummin, kthvalue, median, nanmedian (one thread a row) on the device:
    every policy and preset, float16/32/64 (CuPy has no bfloat16 arrays), outputs, saved arrays,
    backward and jvp."""
    assert_same_module(name, params, shapes=order_shapes(name, params), seed=1, device=cp.asarray, host=cp.asnumpy)
