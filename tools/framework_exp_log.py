"""Which exp and log PyTorch 2.13's CPU kernels run, checked bit for bit (issue 28: logsumexp).

    python tools/framework_exp_log.py            # every float16/bfloat16 value, 2**24 float32 and float64 samples
    python tools/framework_exp_log.py --all      # every one of the 2**32 float32 values too (minutes)

Not a test: it prints what it finds and asserts nothing.  What it shows (PyTorch 2.13.0+cpu, CPU
capability AVX512, an AMD EPYC):

* float32 and float64: torch.exp and torch.log of a tensor run aten's vml::vexp / vml::vlog
  (UnaryOpsKernel.cpp IMPLEMENT_COMPLEX_KERNEL, vml.h), which a build with MKL (PyTorch's wheels)
  hands to Intel MKL's VML, vmsExp/vmdExp and vmsLn/vmdLn with VML_HA, for every length and
  stride (a strided input is copied to a buffer first): not SLEEF, not glibc, not NumPy.  The
  script calls those functions from PyTorch's own libtorch_cpu.so (ctypes) and counts where
  torch differs from them (0 here) and from the correctly rounded result, NumPy's and glibc's.
  MKL's VML is closed source, and its license does not allow disassembling it, so symgrad cannot
  write its algorithm down: float32/float64 logsumexp under convention="torch" stays the
  documented exception (docs/guarantees.md).
* float16 and bfloat16: vml.h's MKL stubs take float and double only; these run Vectorized<Half>
  / <BFloat16>'s exp and log (SLEEF's u10 in float32, rounded to the dtype).  On every one of the
  65536 values of each, that equals the float32 correctly rounded result rounded to the dtype,
  which symgrad computes from NumPy's float64 exp and log (host/_lse_half_torch.py.jinja).
"""

from __future__ import annotations

import argparse
import ctypes
import os

import numpy as np
import torch

torch.set_num_threads(1)
_LIB = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
VML_HA = 0x2


def _vml(name: str, x: np.ndarray) -> np.ndarray:
    """MKL VML's function name (vmsExp, vmdLn, ...) of x, from PyTorch's own library."""
    fn = getattr(ctypes.CDLL(_LIB), name)
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    fn(x.size, x.ctypes.data, out.ctypes.data, VML_HA)
    return out


def _differ(a: np.ndarray, b: np.ndarray) -> int:
    """How many elements differ in their bits (any NaN equals any NaN)."""
    nan = np.isnan(a) & np.isnan(b)
    return int(np.count_nonzero((a.view(f"u{a.itemsize}") != b.view(f"u{b.itemsize}")) & ~nan))


def _libm(name: str, x: np.ndarray) -> np.ndarray:
    """glibc's scalar name (expf, log, ...) of each element (slow: a sample only)."""
    fn = getattr(ctypes.CDLL("libm.so.6"), name)
    ctype = ctypes.c_float if x.dtype == np.float32 else ctypes.c_double
    fn.argtypes, fn.restype = [ctype], ctype
    return np.array([fn(float(v)) for v in x], dtype=x.dtype)


def _correct(fn, x: np.ndarray, dtype) -> np.ndarray:
    """fn in float64 (NumPy's), rounded to dtype: the correctly rounded float32 result but where
    float64's result lies within its own error of a float32 midpoint."""
    with np.errstate(all="ignore"):
        return fn(x.astype(np.float64)).astype(dtype)


def halves() -> None:
    import ml_dtypes
    bits = np.arange(1 << 16, dtype=np.uint16)
    for dtype, tdtype in ((np.dtype(np.float16), torch.float16), (np.dtype(ml_dtypes.bfloat16), torch.bfloat16)):
        x = bits.view(dtype)
        for name, fn in (("exp", np.exp), ("log", np.log)):
            got = getattr(torch, name)(torch.from_numpy(bits.view(np.int16)).view(tdtype))
            got = got.view(torch.int16).numpy().view(dtype)
            with np.errstate(over="ignore"):
                model = _correct(fn, x.astype(np.float32), np.float32).astype(dtype)
            print(f"{dtype.name:8} {name}: torch differs from float32 correctly rounded, then rounded to "
                  f"{dtype.name}, on {_differ(got, model)} of 65536")


def _report(dtype, name: str, x: np.ndarray, counts: dict) -> None:
    fn = {"exp": np.exp, "log": np.log}[name]
    got = getattr(torch, name)(torch.from_numpy(x)).numpy()
    vml = "vm" + ("s" if dtype == np.float32 else "d") + {"exp": "Exp", "log": "Ln"}[name]
    with np.errstate(all="ignore"):
        rows = {vml + "(HA)": _vml(vml, x), "NumPy": fn(x)}
        if dtype == np.float32:
            rows["correctly rounded"] = _correct(fn, x, dtype)
    for what, want in rows.items():
        counts[what] = counts.get(what, 0) + _differ(got, want)


def wide(dtype, samples: int, every: bool) -> None:
    rng = np.random.default_rng(0)
    for name in ("exp", "log"):
        counts: dict = {}
        if every:
            for start in range(0, 1 << 32, 1 << 26):
                x = np.arange(start, start + (1 << 26), dtype=np.uint64).astype(np.uint32).view(np.float32)
                _report(dtype, name, x, counts)
            total = 1 << 32
        else:
            bits = rng.integers(0, 1 << (8 * np.dtype(dtype).itemsize), samples, dtype=np.uint64)
            x = bits.astype(f"u{np.dtype(dtype).itemsize}").view(dtype)
            _report(dtype, name, x, counts)
            total = samples
        few = x[:2000]
        counts["glibc (first 2000)"] = _differ(getattr(torch, name)(torch.from_numpy(few)).numpy(),
                                               _libm(name + ("f" if dtype == np.float32 else ""), few))
        print(f"{np.dtype(dtype).name:8} {name}: torch differs from " +
              ", ".join(f"{k} on {v}" for k, v in counts.items()) + f" (of {total})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every float32 value (2**32), not a sample")
    parser.add_argument("--samples", type=int, default=1 << 24, help="random bit patterns per wide dtype")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    halves()
    wide(np.float32, args.samples, args.all)
    wide(np.float64, args.samples, False)


if __name__ == "__main__":
    main()
