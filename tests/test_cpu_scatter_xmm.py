"""The cpu max-pool scatter backward's adds in xmm registers (sg_add_fast_b16 under SSE2's guard)
against the portable bit helpers they replace where the guard fails: the same source compiled
again with __SSE2__ undefined (its #else: the portable add) gives the same bits for every
non-NaN bfloat16 gradient, sums through +-inf, inf - inf, subnormals and rounding at each add.
The xmm adds themselves are checked against the NumPy module by test_bfloat16.py's
test_cpu_b16_scatter_every_bfloat16_gradient_as_the_numpy_module (and float16's F16C ones by
test_cpu.py's test_float16_f16c_and_portable_backward_give_the_same_bits)."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess

import numpy as np
import pytest

import symgrad

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="SSE2's guard: x86-64 only")
def test_b16_scatter_xmm_and_portable_fast_adds_give_the_same_bits(tmp_path):
    if COMPILER is None:
        pytest.skip("no C compiler: the cpu backend needs one")
    params = {"kernel_size": 3, "stride": 2, "padding": 1}
    m = symgrad.load("max_pool2d", backend="cpu", convention="torch", **params)
    source = m.SOURCE.read_text()
    assert "#if defined(__SSE2__)" in source and "_mm_add_ss" in source  # the xmm add is there to test
    portable = tmp_path / "portable.so"
    subprocess.run([COMPILER, *m.CFLAGS, "-U__SSE2__", str(m.SOURCE), "-o", str(portable)], check=True,
                   stdin=subprocess.DEVNULL, timeout=300)
    kernel = getattr(ctypes.CDLL(str(portable)), f"{m.PREFIX}_backward_b16_nchw")
    kernel.restype = ctypes.c_int
    kernel.argtypes = (ctypes.c_void_p,) * 3 + (ctypes.c_int64,) * 6 + (ctypes.c_int,)

    x = np.random.default_rng(1).integers(0, 3, size=(2, 8, 128, 130)).astype(BF16)  # ties
    y, saved = m.forward(x, threads=1)
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(BF16)
    g = np.resize(every[~np.isnan(every.astype(np.float32))], y.shape)  # no NaN: the fast adds
    g[1, 0, :, 0::2], g[1, 0, :, 1::2] = np.inf, -np.inf  # winners shared by +inf and -inf windows
    (xmm,) = m.backward(g, saved, threads=1)
    out = np.empty(x.shape, np.uint16)
    assert kernel(g.view(np.uint16).ctypes.data, saved.index.ctypes.data, out.ctypes.data,
                  *x.shape, *y.shape[2:], 1) == 0
    assert np.isnan(xmm[1, 0].astype(np.float32)).any()  # inf - inf reached a sum
    assert np.array_equal(out, xmm.view(np.uint16))
