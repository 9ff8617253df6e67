"""The window geometry (symgrad.geometry) against PyTorch's definition of its adaptive windows,
and as each backend prints it."""

from __future__ import annotations

import math

import numpy as np

from symgrad.backends.cuda.printer import cuda_integer_code
from symgrad.backends.numpy.printer import numpy_integer_code
from symgrad.geometry import ADAPTIVE

FIELDS = ("start", "end", "first_holder", "end_holder")
# each backend's printed code, run as Python on nonnegative ints (C's / is then Python's //)
PRINTED = {
    "numpy": {f: numpy_integer_code(getattr(ADAPTIVE, f)) for f in FIELDS},
    "cuda": {f: cuda_integer_code(getattr(ADAPTIVE, f)).replace("/", "//") for f in FIELDS},
}


def _pytorch_windows(length: int, out: int) -> list[tuple[int, int]]:
    """AdaptiveMaxPooling.h: start_index = floor(i * length / out), end_index = ceil((i + 1) *
    length / out), in exact integer arithmetic."""
    return [((k * length) // out, -((-(k + 1) * length) // out)) for k in range(out)]


def test_adaptive_windows_and_their_holders_as_each_backend_prints_them():
    for length in range(1, 30):
        for out in range(1, 30):
            want = _pytorch_windows(length, out)
            assert ADAPTIVE.windows(length, out) == want
            for backend, code in PRINTED.items():
                def run(field, i):
                    return np.asarray(eval(code[field], {}, {"i": i, "length": length, "out": out}))
                windows = np.arange(out)
                assert list(zip(run("start", windows), run("end", windows))) == want, backend
                coords = np.arange(length)
                first, end = run("first_holder", coords), run("end_holder", coords)
                for c in range(length):
                    holders = [k for k, (a, b) in enumerate(want) if a <= c < b]
                    assert holders == list(range(first[c], end[c])), (backend, length, out, c)


def test_windows_match_float_arithmetic_where_it_is_exact():
    """PyTorch's formula as written with floats, for sizes where floats are exact."""
    for length in range(1, 20):
        for out in range(1, 20):
            assert ADAPTIVE.windows(length, out) == [
                (math.floor(k * length / out), math.ceil((k + 1) * length / out)) for k in range(out)]
