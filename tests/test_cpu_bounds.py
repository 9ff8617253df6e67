"""The cpu backend's memory and time are bounded by its inputs and outputs, not by its parameters:
pooling with a stride far past the input (issue 28 item 21: max_pool2d kernel 2, stride 10**9,
ties "split" took 53 s and 3.9 GB for the backward of a 1x1x5x5 input).

Skipped when no C compiler is found, except under CI=true, where the compiler is required."""

from __future__ import annotations

import itertools
import os
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import symgrad

ROOT = Path(__file__).resolve().parent.parent
COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)
if COMPILER is None and os.environ.get("CI") != "true":
    pytest.skip("no C compiler (cc, gcc, clang or $CC) on this machine: the cpu backend needs one "
                "(required when CI=true)", allow_module_level=True)

LIMIT = 1 << 30  # address space of the process that runs the kernels: far more than 5x5 planes need

HUGE_STRIDE = """
    import sys, numpy as np, symgrad
    op, ties, spatial, axis = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    stride = [2] * spatial
    stride[axis] = 10 ** 9
    m = symgrad.load(op, backend="cpu", ties=ties, kernel_size=2, stride=stride)
    x = np.arange(2 * 3 * 5 ** spatial, dtype=np.float64).reshape((2, 3) + (5,) * spatial) % 3
    y, saved = m.forward(x)
    (grad,) = m.backward(np.ones_like(y), saved)
    print(repr(grad.tolist()))
"""


def _limited(code: str, *args) -> subprocess.CompletedProcess:
    """code in a fresh interpreter with LIMIT bytes of address space (an allocation sized by the
    stride fails there) and a timeout (a loop over the stride's residues is a timeout)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=60, preexec_fn=limit)


# the mask form's backward (split, all) gathered each row's elements by residue modulo the stride;
# (the stride along the last axis), allocating and visiting every residue
@pytest.mark.parametrize("op, spatial, axis, ties", [("max_pool2d", 2, 1, "split"), ("max_pool2d", 2, 1, "all")])
def test_a_stride_past_the_input_costs_no_memory_or_time(op, spatial, axis, ties):
    stride = [2] * spatial
    stride[axis] = 10 ** 9
    m = symgrad.load(op, backend="cpu", ties=ties, kernel_size=2, stride=stride)
    x = np.arange(2 * 3 * 5 ** spatial, dtype=np.float64).reshape((2, 3) + (5,) * spatial) % 3
    m.forward(x)  # compiled here, in the test's cache, not under the limit
    proc = _limited(HUGE_STRIDE, op, ties, spatial, axis)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert eval(proc.stdout) == _brute_force(x, stride, ties).tolist()


def _brute_force(x: np.ndarray, stride: list, ties: str) -> np.ndarray:
    """The gradient of ones over every window (kernel 2, no padding) from the README's definition
    of each policy: a window's winners are the elements equal to its max; split gives each
    1/count, all gives each 1, first gives the first in the window's row-major order 1."""
    grad = np.zeros_like(x)
    starts = [range(0, n - 2 + 1, s) for n, s in zip(x.shape[2:], stride)]
    for plane in itertools.product(*map(range, x.shape[:2])):
        for start in itertools.product(*starts):
            window = [plane + tuple(s + d for s, d in zip(start, offset))
                      for offset in itertools.product((0, 1), repeat=len(start))]
            best = max(x[e] for e in window)
            winners = [e for e in window if x[e] == best]
            for e in winners[:1] if ties == "first" else winners:
                grad[e] += 1 / len(winners) if ties == "split" else 1
    return grad
