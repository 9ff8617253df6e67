"""The window geometry (symgrad.geometry) against PyTorch's windows (adaptive, pooling with
ceil_mode, fractional) and maxout's definition, as each backend prints it."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from symgrad.backends.cuda.printer import cuda_integer_code
from symgrad.backends.numpy.printer import numpy_integer_code
from symgrad.backends.printing import PYTHON, integer_code
from symgrad.geometry import ADAPTIVE, FRACTIONAL, MAXOUT, pool

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


# ----------------------------------------------------------------------------- pooling, maxout, fractional

def _python(e, **names) -> object:
    """The NumPy backend's code of a geometry expression, compiled once."""
    return compile(numpy_integer_code(e, names), "<geometry>", "eval")


def _c_as_python(e, **names) -> object:
    """The CUDA backend's code of a geometry expression run as Python: where it is used its
    quotients have nonnegative numerators (C's / is then Python's //); conditions short-circuit in
    both languages, so a negative q is decided by q >= 0 before q % s and q / s are read."""
    code = cuda_integer_code(e, names).replace("/", "//").replace("&&", " and ").replace("||", " or ")
    return compile(code.replace("!", " not ").replace("true", "True"), "<geometry>", "eval")


def _torch_pool_holders(length, k, s, p, d, ceil_mode):
    """{window: input coordinates it holds} as PyTorch's max_pool1d sees them: row x of the batch
    is the one-hot vector of coordinate x (padding is -inf there), so window i's output is 1
    exactly where it holds x; or None where PyTorch refuses the size."""
    x = torch.eye(length, dtype=torch.float64).reshape(length, 1, length)
    try:
        y = torch.nn.functional.max_pool1d(x, k, s, p, d, ceil_mode)
    except RuntimeError:
        return None
    return [tuple(int(c) for c in torch.nonzero(y[:, 0, i] == 1).flatten()) for i in range(y.shape[-1])]


POOL_CASES = [(L, k, s, p, d, ceil) for L in range(1, 10) for k in range(1, 5) for s in range(1, 5)
              for p in range(k // 2 + 1) for d in range(1, 4) for ceil in (False, True)]


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_pool_output_sizes_windows_and_holders_equal_pytorchs(ceil_mode):
    """Every field of max_pool*d's axis geometry, as both backends print it, against PyTorch over
    every length 1..9, kernel 1..4, stride 1..4, padding 0..k/2, dilation 1..3."""
    g = pool(ceil_mode)
    size = _python(g.output_size)
    coordinate, inside = _python(g.coordinate), _python(g.inside)
    holder, holds, offset = _python(g.holder), _python(g.holds), _python(g.offset)
    first, end = _python(g.first_inside), _python(g.end_inside)
    c_coordinate, c_inside = _c_as_python(g.coordinate), _c_as_python(g.inside)
    c_holder, c_holds, c_offset = _c_as_python(g.holder), _c_as_python(g.holds), _c_as_python(g.offset)
    checked = 0
    for L, k, s, p, d, _ in (c for c in POOL_CASES if c[5] == ceil_mode):
        want = _torch_pool_holders(L, k, s, p, d, ceil_mode)
        env = {"length": L, "k": k, "s": s, "p": p, "d": d, "min": min, "max": max}
        out = eval(size, env)
        if want is None:
            assert out < 1, (L, k, s, p, d)
            continue
        assert out == len(want), (L, k, s, p, d, out, len(want))
        env["out"] = out
        for code_c, code_in in ((coordinate, inside), (c_coordinate, c_inside)):
            got = []
            for i in range(out):
                cs = [eval(code_c, env | {"i": i, "j": j}) for j in range(k)]
                got.append(tuple(sorted(c for c in cs if eval(code_in, env | {"x": c}))))
            assert got == want, (L, k, s, p, d)
        # return_indices: of distinct values, PyTorch's winner is the largest at the window's coordinates
        values = torch.randperm(L, generator=torch.Generator().manual_seed(L * 1000 + k * 100 + s * 10 + p + d),
                                dtype=torch.float64).reshape(1, 1, L)
        _, index = torch.nn.functional.max_pool1d(values, k, s, p, d, ceil_mode, return_indices=True)
        assert [max(w, key=lambda c: values[0, 0, c]) for w in got if w] == [
            c for w, c in zip(got, index.flatten().tolist()) if w]  # (a window of padding only has none)
        for x, j in itertools.product(range(L), range(k)):
            for code_o, code_h, code_w in ((offset, holds, holder), (c_offset, c_holds, c_holder)):
                q = eval(code_o, env | {"x": x, "j": j})
                held = bool(eval(code_h, env | {"q": q}))
                by_j = [i for i in range(out) if eval(coordinate, env | {"i": i, "j": j}) == x]
                assert held == bool(by_j), (L, k, s, p, d, x, j)
                if held:
                    assert [eval(code_w, env | {"q": q})] == by_j
        for j in range(k):  # element j is inside the input in the windows [first, end)
            lo, hi = eval(first, env | {"j": j}), eval(end, env | {"j": j})
            assert [i for i in range(lo, hi)] == [
                i for i in range(out) if eval(inside, env | {"x": eval(coordinate, env | {"i": i, "j": j})})]
        checked += 1
    assert checked > 500


def test_maxout_windows_are_consecutive_channels():
    g = MAXOUT
    for c, k in itertools.product(range(1, 13), range(1, 5)):
        if c % k:
            continue
        env = {"length": c, "k": k}
        out = eval(_python(g.output_size), env)
        channels = np.arange(c).reshape(c // k, k)  # maxout's definition: (groups, pieces)
        assert out == c // k
        for i, j in itertools.product(range(out), range(k)):
            for code in (_python(g.coordinate), _c_as_python(g.coordinate)):
                assert eval(code, env | {"i": i, "j": j}) == channels[i, j]
        for x in range(c):
            (i,), (j,) = np.nonzero(channels == x)
            for hold, elem in ((_python(g.holder), _python(g.element)),
                               (_c_as_python(g.holder), _c_as_python(g.element))):
                assert (eval(hold, env | {"x": x}), eval(elem, env | {"x": x})) == (i, j)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fractional_starts_equal_pytorchs(dtype):
    """Fractional pooling's float sequence, printed for NumPy (arrays in the input's dtype) and
    run as its module runs it, against PyTorch's windows along the width (one-hot inputs, as
    above), for random samples."""
    arrays = replace(PYTHON, real=lambda s: f"real({s})", trunc=lambda s: f"({s}).astype(np.intp)")
    start = compile(integer_code(FRACTIONAL.start, arrays), "<start>", "eval")
    alpha = compile(integer_code(FRACTIONAL.alpha, arrays), "<alpha>", "eval")
    last = compile(integer_code(FRACTIONAL.last_start, arrays), "<last>", "eval")
    rng = np.random.default_rng(0)
    for L in range(2, 13):
        for k in range(1, min(L, 4)):
            for out in range(2, L - k + 2):
                u = rng.random(8).astype(np.float64 if dtype == torch.float64 else np.float32)
                u[0] = 0
                real = u.dtype.type
                env = {"np": np, "real": real, "length": L, "k": k, "out": out}
                env["alpha"] = eval(alpha, env)
                i = np.arange(out - 1).astype(u.dtype)
                starts = np.concatenate(
                    [eval(start, env | {"i": i[None, :], "u": u[:, None]}),
                     np.full((u.size, 1), eval(last, env))], axis=1)
                x = torch.eye(L, dtype=dtype).reshape(L, 1, 1, L)
                for n, un in enumerate(u):
                    samples = torch.tensor([[[un, 0.0]]], dtype=dtype).expand(L, 1, 2)
                    y = torch.nn.functional.fractional_max_pool2d(
                        x, (1, k), output_size=(1, out), _random_samples=samples)
                    want = [tuple(int(c) for c in torch.nonzero(y[:, 0, 0, i] == 1).flatten())
                            for i in range(out)]
                    assert want == [tuple(range(a, a + k)) for a in starts[n]], (L, k, out, un)


def test_fractional_output_size_from_a_ratio_is_pytorchs():
    code = compile(numpy_integer_code(FRACTIONAL.output_size, {"length": "n", "ratio": "r"}), "<size>", "eval")
    for n in range(1, 40):
        for r in (0.1, 0.25, 0.3, 0.5, 0.7, 0.75, 0.9):
            # torch.nn.functional.fractional_max_pool2d: int(input_size * output_ratio)
            assert eval(code, {"n": n, "r": r}) == int(n * r)

