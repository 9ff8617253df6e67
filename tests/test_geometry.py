"""The window geometry (symgrad.geometry) against PyTorch's windows (adaptive, pooling with
ceil_mode, fractional) and maxout's definition, as each backend prints it."""

from __future__ import annotations

import functools
import itertools
import math
import os
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from symgrad.backends.cuda.printer import cuda_integer_code
from symgrad.backends.host.printer import numpy_integer_code
from symgrad.backends.printing import PYTHON, integer_code
from symgrad.geometry import ADAPTIVE, FRACTIONAL, MAXOUT, pool

if os.environ.get("CI"):
    import torch
else:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")

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


@functools.lru_cache(maxsize=None)  # shared by the tests of the Python/CUDA and the C code
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



# ----------------------------------------------------------------------------- the cpu backend's C

COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)


def _c_program(pool_code: dict, inner: dict, adaptive: dict) -> str:
    """A C program of the cpu backend's printed window arithmetic (c_integer_code, as its pool and
    adaptive kernels name it: window p0, element k0, coordinate i0, offset q0, constants K0 S0 P0
    D0, sizes l0 o0; a row's residue r), in its 64-bit integers (C's / and % truncate toward
    zero). For each line "L K S P D O" of stdin it prints, per window, the input coordinates of
    its elements that are inside the input; per coordinate and element k0, the window that holds
    it (offset, holds, holder); per k0, the windows [first_inside, end_inside); per residue r and
    k0, the windows the row form gives (offset_at_r, shift, m_lo, m_hi); and for "A L O" the
    adaptive windows [sg_window_start, sg_window_end) of i in 0..O-1."""
    params = "const I p0, const I k0, const I i0, const I q0, const I r, const I shift, " \
             "const I l0, const I o0, const I K0, const I S0, const I P0, const I D0"
    fields = {"coordinate": pool_code["coordinate"], "inside": pool_code["inside"],
              "offset": pool_code["offset"], "holds": pool_code["holds"], "holder": pool_code["holder"],
              "first_inside": inner["first_inside"], "end_inside": inner["end_inside"],
              "offset_at_r": inner["offset_at_r"], "not_divisible": inner["not_divisible"],
              "shift_of": inner["shift"], "m_lo": inner["m_lo"], "m_hi": inner["m_hi"]}
    funcs = "\n".join(f"static I f_{name}({params}) {{ (void)p0; (void)k0; (void)i0; (void)q0; (void)r; "
                      f"(void)shift; (void)l0; (void)o0; (void)K0; (void)S0; (void)P0; (void)D0; "
                      f"return {code}; }}" for name, code in fields.items())
    call = "(p0, k0, i0, q0, r, shift, l0, o0, K0, S0, P0, D0)"
    return f"""#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
typedef int64_t I;
static I sg_min(const I a, const I b) {{ return a < b ? a : b; }}
static I sg_max(const I a, const I b) {{ return a > b ? a : b; }}
static I sg_window_start(const I i, const I out, const I length) {{ return {adaptive["start"]}; }}
static I sg_window_end(const I i, const I out, const I length) {{ return {adaptive["end"]}; }}
{funcs}
int main(void) {{
  char kind;
  while (scanf(" %c", &kind) == 1) {{
    if (kind == 'A') {{
      long long L, O;
      if (scanf("%lld %lld", &L, &O) != 2) return 1;
      for (I i = 0; i < O; ++i) printf("%lld %lld ", (long long)sg_window_start(i, O, L), (long long)sg_window_end(i, O, L));
      printf("\\n");
      continue;
    }}
    long long a[6];
    if (scanf("%lld %lld %lld %lld %lld %lld", a, a + 1, a + 2, a + 3, a + 4, a + 5) != 6) return 1;
    const I l0 = a[0], K0 = a[1], S0 = a[2], P0 = a[3], D0 = a[4], o0 = a[5];
    I p0 = 0, k0 = 0, i0 = 0, q0 = 0, r = 0, shift = 0;
    for (p0 = 0; p0 < o0; ++p0) {{
      printf("W");
      for (k0 = 0; k0 < K0; ++k0) {{
        i0 = f_coordinate{call};
        if (f_inside{call}) printf(" %lld", (long long)i0);
      }}
      printf("\\n");
    }}
    printf("H");
    for (i0 = 0; i0 < l0; ++i0)
      for (k0 = 0; k0 < K0; ++k0) {{
        q0 = f_offset{call};
        if (f_holds{call}) printf(" %lld:%lld", (long long)i0, (long long)f_holder{call});
      }}
    printf("\\nF");
    for (k0 = 0; k0 < K0; ++k0) printf(" %lld:%lld", (long long)f_first_inside{call}, (long long)f_end_inside{call});
    printf("\\nR");
    for (r = 0; r < S0; ++r)
      for (k0 = 0; k0 < K0; ++k0) {{
        q0 = f_offset_at_r{call};
        if (f_not_divisible{call}) continue;
        shift = f_shift_of{call};
        const I lo = f_m_lo{call}, hi = f_m_hi{call};
        for (I m = lo; m < hi; ++m) printf(" %lld:%lld", (long long)(r + S0 * m), (long long)(m + shift));
      }}
    printf("\\n");
  }}
  return 0;
}}
"""


def _run_c(source: str, stdin: str, tmp_path) -> list[str]:
    exe = tmp_path / "windows"
    (tmp_path / "windows.c").write_text(source)
    subprocess.run([COMPILER, "-O1", "-std=c11", "-o", str(exe), str(tmp_path / "windows.c")], check=True,
                   capture_output=True, timeout=120)
    return subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True,
                          timeout=120).stdout.splitlines()


def _torch_adaptive_windows(length: int, out: int) -> list[tuple[int, int]]:
    """(first, one past the last) input coordinate of each window of PyTorch's adaptive_max_pool1d
    (one-hot rows, as _torch_pool_holders)."""
    y = torch.nn.functional.adaptive_max_pool1d(torch.eye(length, dtype=torch.float64).reshape(length, 1, length), out)
    held = [torch.nonzero(y[:, 0, i] == 1).flatten().tolist() for i in range(out)]
    return [(h[0], h[-1] + 1) for h in held]


@pytest.mark.skipif(COMPILER is None and not os.environ.get("CI"), reason="no C compiler (cc, gcc, clang or $CC)")
def test_the_cpu_backends_c_window_arithmetic_equals_pytorchs_windows(tmp_path):
    """The cpu backend's window arithmetic (c_integer_code) compiled as C, where / and % truncate
    toward zero and numerators may be negative (padding, a row's shift), against PyTorch's windows:
    max_pool1d of one-hot rows (the coordinates each window holds) over lengths 1..9, kernel 1..4,
    stride 1..4, padding 0..k/2, dilation 1..3, with and without ceil_mode, and adaptive windows
    over lengths and outputs 1..24 (adaptive_max_pool1d's up to 8, PyTorch's formula beyond). Each C form a kernel uses is compared: the windows' inside
    coordinates, the holder of each coordinate and element, each element's windows inside the
    input, and backward's row form (each residue modulo the stride)."""
    from symgrad.backends import cpu
    from symgrad.backends.cpu.printer import c_integer_code
    from symgrad.backends.printing import pool_axis_code
    adaptive_code = {"start": c_integer_code(ADAPTIVE.start), "end": c_integer_code(ADAPTIVE.end)}
    adaptive = [(L, o) for L in range(1, 25) for o in range(1, 25)]
    checked = 0
    for ceil_mode in (False, True):
        g = pool(ceil_mode)
        source = _c_program(pool_axis_code(g, 0, c_integer_code), cpu._inner_rows(g, 0), adaptive_code)
        cases, wants = [], []
        for L, k, s, p, d, _ in (c for c in POOL_CASES if c[5] == ceil_mode):
            want = _torch_pool_holders(L, k, s, p, d, ceil_mode)
            if want is not None:
                cases.append((L, k, s, p, d, len(want)))
                wants.append(want)
        stdin = "".join(f"P {' '.join(map(str, c))}\n" for c in cases)
        if not ceil_mode:
            stdin += "".join(f"A {L} {o}\n" for L, o in adaptive)
        lines = iter(_run_c(source, stdin, tmp_path))
        for (L, k, s, p, d, out), want in zip(cases, wants):
            case = (L, k, s, p, d, ceil_mode)
            windows = [tuple(int(v) for v in next(lines).split()[1:]) for _ in range(out)]
            assert windows == want, case
            holders = [tuple(map(int, t.split(":"))) for t in next(lines).split()[1:]]
            assert sorted(holders) == sorted((x, i) for i, w in enumerate(want) for x in w), case
            spans = [tuple(map(int, t.split(":"))) for t in next(lines).split()[1:]]
            assert all(0 <= lo <= hi <= out for lo, hi in spans), case
            assert [sum(lo <= i < hi for lo, hi in spans) for i in range(out)] == [len(w) for w in want], case
            rows = [tuple(map(int, t.split(":"))) for t in next(lines).split()[1:]]
            assert sorted(rows) == sorted((x, i) for i, w in enumerate(want) for x in w), case
            checked += 1
        if not ceil_mode:
            for L, o in adaptive:
                v = [int(t) for t in next(lines).split()]
                want = _torch_adaptive_windows(L, o) if max(L, o) <= 8 else _pytorch_windows(L, o)
                assert list(zip(v[::2], v[1::2])) == want, (L, o)
        assert next(lines, None) is None
    assert checked > 1000
