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
