"""The cpu backend's elementwise loaders reuse the buffers of their large outputs once nothing
refers to them (loader_elementwise.py.jinja: _buffer, REUSE), and never one that is still
referenced: a new output never shares memory with an array, view, memoryview, ctypes pointer or
tensor on an earlier one, whose values stay as they were; at most REUSE buffers of KEPT_BYTES in all
are kept.

Oracle: the NumPy module's results, compared on the bits; the memory addresses of the arrays."""

from __future__ import annotations

import ctypes
import os
import shutil
import threading

import numpy as np
import pytest

import symgrad

COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C compiler")

N = 1 << 20  # float32: 4 MiB, the loader's ALIGNED (smaller outputs are NumPy's own, never kept)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.fixture(scope="module")
def modules():
    """maximum under ties="split": the cpu module tests/test_cpu_kinds.py compiles, the NumPy one"""
    cpu = symgrad.load("maximum", backend="cpu", ties="split")
    cpu.forward(np.ones(1, np.float32), np.ones(1, np.float32))  # compiled (or read from the cache)
    return cpu, symgrad.load("maximum", ties="split")


def _inputs(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)


def _span(a):
    return a.ctypes.data, a.ctypes.data + a.nbytes


def _overlap(a, b) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def test_a_freed_buffer_is_reused_and_a_referenced_one_never(modules):
    cpu, ref = modules
    x, y = _inputs(0)
    want, saved = ref.forward(x, y)
    want_grads = ref.backward(x, saved)
    out, _ = cpu.forward(x, y)
    address = out.ctypes.data
    del out
    out, s = cpu.forward(x, y)  # freed: its buffer written over
    assert out.ctypes.data == address and np.array_equal(_bits(out), _bits(want))
    holders = {"array": lambda a: a, "view": lambda a: a[::3], "memoryview": memoryview,
               "ctypes pointer": lambda a: a.ctypes.data_as(ctypes.c_void_p)}
    for name, hold in holders.items():
        before = out.copy()
        held, kept = hold(out), out
        del out
        x2, y2 = _inputs(1)
        new, _ = cpu.forward(x2, y2)
        grads = cpu.backward(x, s)
        for a in (new, *grads):
            assert not _overlap(a, kept), name
        assert np.array_equal(_bits(kept), _bits(before)), name
        assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(grads, want_grads)), name
        del held, kept, new, grads
        out, _ = cpu.forward(x, y)
        assert np.array_equal(_bits(out), _bits(want)), name


def test_a_tensor_on_an_output_keeps_its_buffer(modules):
    torch = pytest.importorskip("torch")
    cpu, _ = modules
    x, y = _inputs(2)
    out, _ = cpu.forward(x, y)
    tensor = torch.from_numpy(out)
    before = tensor.clone()
    del out
    new, _ = cpu.forward(y, x)
    assert not _overlap(new, tensor.numpy()) and torch.equal(tensor, before)


def test_at_most_reuse_buffers_are_kept(modules, monkeypatch):
    cpu, _ = modules
    x, _ = _inputs(3)
    live = [cpu.forward(x, x)[0] for _ in range(cpu.REUSE + 3)]
    assert len(cpu._buffers) <= cpu.REUSE
    del live
    for n in (N, N + 1024, N + 2048, N + 4096, N + 8192, N):  # sizes that change
        out, _ = cpu.forward(np.resize(x, n), x[:1])
        assert len(cpu._buffers) <= cpu.REUSE and out.shape == (n,)
    monkeypatch.setattr(cpu, "REUSE", 0)
    monkeypatch.setattr(cpu, "_buffers", [])
    cpu.forward(x, x)
    cpu.forward(x, x)
    assert cpu._buffers == []


def test_the_kept_buffers_bytes_are_bounded(modules, monkeypatch):
    """No more than KEPT_BYTES are kept in all: a larger output's buffer is never kept, and free
    ones of other sizes are given up to make room."""
    cpu, _ = modules
    x, _ = _inputs(4)
    monkeypatch.setattr(cpu, "_buffers", [])
    monkeypatch.setattr(cpu, "KEPT_BYTES", 3 * N * 4)  # room for two outputs of N float32 with their padding
    for _ in range(3):
        cpu.forward(x, x)
    assert len(cpu._buffers) == 1
    big = np.resize(x, 3 * N)
    out, _ = cpu.forward(big, big)
    assert sum(n for n, _ in cpu._buffers) <= cpu.KEPT_BYTES and len(cpu._buffers) == 1
    del out
    held = [cpu.forward(x, x)[0] for _ in range(3)]
    assert sum(n for n, _ in cpu._buffers) <= cpu.KEPT_BYTES and len(cpu._buffers) == 2
    del held


def test_threads_never_share_an_output(modules):
    cpu, ref = modules
    inputs = [_inputs(10 + k) for k in range(3)]
    wants = [ref.forward(*xy)[0] for xy in inputs]
    failures = []

    def work(k):
        outs = []
        for _ in range(4):
            out, _ = cpu.forward(*inputs[k], threads=1)
            outs.append(out)
            if len(outs) > 2:
                outs.pop(0)
            if not all(np.array_equal(_bits(o), _bits(wants[k])) for o in outs):
                failures.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_a_call_passes_each_arrays_own_address(modules):
    """_address (what every kernel call passes for an array, through the buffer protocol where it
    can) is a.ctypes.data for writable, read-only, strided, empty, 0-d and offset arrays, and a
    kernel call on read-only and offset views computes what the NumPy module does."""
    cpu, numpy = modules
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    frozen = base.copy()
    frozen.flags.writeable = False
    for a in (base, frozen, base.transpose(2, 0, 1), base[:, 1:], base[1], base[0, 0, 1:2],
              np.empty((0, 3), np.float32), np.ones((), np.float32), np.broadcast_to(base[0], (2, 3, 4))):
        assert cpu._address(a) == a.ctypes.data, a.shape
    x, y = frozen[:, 1:], base[:, 1:][::-1]
    got, want = cpu.forward(x, y)[0], numpy.forward(x, y)[0]
    assert np.array_equal(_bits(got), _bits(want))
