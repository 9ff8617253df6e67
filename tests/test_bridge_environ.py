"""symgrad.torch reads $SYMGRAD_CPU_BACKEND and $SYMGRAD_NUM_THREADS at each call of an op
(os.environ.get): a value set, changed or removed after import and between calls is the one the
next call follows.

Oracles: which module ran the call (the NumPy module, or the cpu backend's, the one with a
compiled library), the ValueErrors bridge.cpu_backend_choice and env_threads raise for a value
they refuse, and torch.amax's output and gradient (distinct values: no tie to choose)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import symgrad.torch as st  # noqa: E402

CPU_BACKEND, NUM_THREADS = "SYMGRAD_CPU_BACKEND", "SYMGRAD_NUM_THREADS"
COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)


def _ran(op, x) -> str:
    """Which module the call ran ("numpy" or "cpu"), after checking its answer against torch's."""
    seen = []
    backend = op._backend

    def spy(tensors):
        found = backend(tensors)
        seen.append("cpu" if hasattr(found[0], "library") else "numpy")
        return found

    op._backend = spy
    try:
        t = x.clone().requires_grad_()
        y = op(t)
        y.backward(torch.arange(1.0, 1.0 + y.numel()).reshape(y.shape))
    finally:
        del op._backend
    ref = x.clone().requires_grad_()
    want = torch.amax(ref, dim=-1)
    want.backward(torch.arange(1.0, 1.0 + want.numel()).reshape(want.shape))
    assert torch.equal(y.detach(), want.detach()) and torch.equal(t.grad, ref.grad)
    assert seen and len(set(seen)) == 1, seen
    return seen[0]


@pytest.mark.skipif(COMPILER is None, reason="no C compiler: the cpu backend cannot run")
def test_a_variable_set_after_import_is_read_at_each_call(monkeypatch):
    monkeypatch.delenv(CPU_BACKEND, raising=False)
    monkeypatch.delenv(NUM_THREADS, raising=False)
    op = st.op("amax", dim=-1, convention="torch")
    x = torch.from_numpy(np.random.default_rng(0).permutation(24).reshape(4, 6).astype(np.float32))
    assert _ran(op, x) == "cpu"  # auto, with a compiler
    for value, module in (("numpy", "numpy"), ("cpu", "cpu"), (" NumPy ", "numpy"), ("", "cpu")):
        monkeypatch.setenv(CPU_BACKEND, value)
        assert _ran(op, x) == module, value
    monkeypatch.setenv(CPU_BACKEND, "gpu")
    with pytest.raises(ValueError, match=r"\$SYMGRAD_CPU_BACKEND must be one of"):
        op(x)
    monkeypatch.delenv(CPU_BACKEND)
    assert _ran(op, x) == "cpu"
    monkeypatch.setenv(NUM_THREADS, "two")  # read by the cpu module's call only where it is set
    with pytest.raises(ValueError, match=r"\$SYMGRAD_NUM_THREADS must be a positive integer"):
        op(x)
    monkeypatch.setenv(NUM_THREADS, "1")
    assert _ran(op, x) == "cpu"
    monkeypatch.delenv(NUM_THREADS)
    assert _ran(op, x) == "cpu"
