"""Speed of symgrad's cpu backend (compiled C kernels) against PyTorch 2.13 CPU, side by side.

    python benchmarks/cpu_pool.py              # about a minute on 2 cores
    python benchmarks/cpu_pool.py --rounds 21
    python benchmarks/cpu_pool.py --clock cpu --cases B C   # on a machine shared with other work

Needs torch (the CPU build) and a C compiler.  It prints tables and asserts nothing.

* Every time is the median of interleaved rounds after warm-up rounds, all in this one process
  (numpy_pool.timed): the cpu module with threads=1 and with its default (OpenMP's: the
  process's cores), PyTorch with torch.set_num_threads(1) and with its default.  Ratios are
  symgrad / PyTorch at the same thread count.  Backward alone is
  torch.ops.aten.max_pool2d_with_indices_backward against the module's backward (each allocates
  its gradient); forward+backward is the module's forward then backward against autograd
  (forward, then backward into x.grad).
* The bound of backward is the least memory traffic it needs (read grad_output and the 1-byte
  saved index, write grad_x) at the bandwidth of a large np.copyto measured in the same run.
* --floors adds two contenders that do no arithmetic (benchmarks/write_floor.c, compiled with the
  cpu backend's compiler and flags): write grad_x with ordinary stores, or with memset, and read
  grad_output and the index.  Ordinary stores read each line before writing it (read for
  ownership), as every kernel that writes through the cache does; memset fills whole lines.  The
  first is the floor of a backward that writes with ordinary stores, its share of the bound the
  most such a backward reaches on this machine.
* Compilation on first use and loading from the cache are timed in fresh processes, after
  `import symgrad`: symgrad.load (derive and generate, or read the cached module) and loading the
  library (compile and write it, or read, verify and load the cached one), with an empty cache,
  then again in a new process that finds the module and its library in the cache.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import numpy_pool as npb  # noqa: E402  (this checkout's symgrad, torch, the timing helpers)

import symgrad  # noqa: E402

torch = npb.torch
F = torch.nn.functional
POOLS = [  # (name, input shape, max_pool2d parameters)
    ("A", (8, 64, 112, 112), dict(kernel_size=2)),
    ("B", (8, 64, 56, 56), dict(kernel_size=3, stride=2, padding=1)),
    ("C", (1, 1, 512, 512), dict(kernel_size=2)),
]


def torch_forward_backward(x, params):
    xt = torch.from_numpy(x).requires_grad_(True)

    def run():
        xt.grad = None
        y = F.max_pool2d(xt, params["kernel_size"], params.get("stride"), params.get("padding", 0))
        y.backward(torch.ones_like(y))
    return run


def write_floors(cc: str, workdir: str):
    """(floor_stores, floor_memset) of benchmarks/write_floor.c, compiled with the cpu backend's
    compiler and flags."""
    from symgrad.backends.cpu import CFLAGS
    lib = Path(workdir) / "write_floor.so"
    subprocess.run([cc, *CFLAGS, str(HERE / "write_floor.c"), "-o", str(lib)], check=True)
    so = ctypes.CDLL(str(lib))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    so.floor_stores.argtypes = [p, i64, p, p, i64, ctypes.c_float]
    so.floor_memset.argtypes = [p, i64, p, p, i64]
    return so.floor_stores, so.floor_memset


def floor_contenders(floors, x, g, index) -> dict:
    stores, fill = floors

    def run(fn, *zero):
        def call():
            out = np.empty_like(x)  # allocated per call, as the backward's gradient
            fn(out.ctypes.data, out.size, g.ctypes.data, index.ctypes.data, g.size, *zero)
            return out
        return call
    return {"floor stores": (None, run(stores, 0.0)), "floor memset": (None, run(fill))}


def speed(rounds: int, bw: float, cases, floors=None, dtype=np.float32) -> list:
    rows = []
    for name, shape, params in POOLS:
        if name not in cases:
            continue
        m = symgrad.load("max_pool2d", backend="cpu", **params)
        x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
        y, saved = m.forward(x)
        g = np.ones_like(y)
        xt = torch.from_numpy(x)
        yt, it = F.max_pool2d_with_indices(xt, params["kernel_size"], params.get("stride"), params.get("padding", 0))
        torch_bwd = npb.torch_pool_backward(2, params, xt, torch.ones_like(yt), it)
        t = npb.timed({
            "bwd cpu 1": (None, lambda: m.backward(g, saved, threads=1)),
            # a thread count other than 1 (PyTorch's default, set and unused): timed by the wall clock
            "bwd cpu n": (npb.DEFAULT_THREADS, lambda: m.backward(g, saved)),
            "bwd torch 1": (1, torch_bwd),
            "bwd torch n": (npb.DEFAULT_THREADS, torch_bwd),
            "f+b cpu 1": (None, lambda: m.backward(g, m.forward(x, threads=1)[1], threads=1)),
            "f+b cpu n": (npb.DEFAULT_THREADS, lambda: m.backward(g, m.forward(x)[1])),
            "f+b torch 1": (1, torch_forward_backward(x, params)),
            "f+b torch n": (npb.DEFAULT_THREADS, torch_forward_backward(x, params)),
            **(floor_contenders(floors, x, g, saved.index) if floors else {}),
        }, rounds)
        bound = (g.nbytes + saved.index.nbytes + x.nbytes) / bw
        rows.append((name, t, bound))
    return rows


def first_use() -> list:
    """(seconds to load and first call with an empty cache: compiles; the same from the cache),
    each in a fresh process."""
    code = ("import sys, time; sys.path.insert(0, {root!r}); import numpy as np, symgrad; t = time.perf_counter(); "
            "m = symgrad.load('max_pool2d', backend='cpu', kernel_size=2); t1 = time.perf_counter(); "
            "m.library(); t2 = time.perf_counter(); print(t1 - t, t2 - t1)").format(root=str(HERE.parent))
    out = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, SYMGRAD_CACHE_DIR=cache)
        for _ in range(2):
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            out.append(tuple(float(v) for v in r.stdout.split()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: time the one-thread contenders by the calling thread's CPU time (a "
                         "machine shared with other work); the default-thread ones stay on the wall clock")
    ap.add_argument("--cases", nargs="+", choices=[c[0] for c in POOLS], default=[c[0] for c in POOLS])
    ap.add_argument("--no-first-use", action="store_true", help="skip timing compilation and the cache")
    ap.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                    help="the input's dtype (float16: PyTorch's float16 CPU kernels against symgrad's)")
    ap.add_argument("--floors", action="store_true",
                    help="also time writing grad_x with ordinary stores and with memset, reading the inputs "
                         "(no arithmetic: the floors of a backward)")
    args = ap.parse_args()
    if args.floors and args.dtype != "float32":
        ap.error("--floors writes and reads float32 (use it with --dtype float32)")
    if args.clock == "cpu":
        npb.CLOCK = time.thread_time
    print(npb.machine())
    print(f"load average at start: {os.getloadavg()[0]:.2f}; clock: "
          + ("wall" if args.clock == "wall" else "thread CPU time for 1 thread, wall for default threads"))
    print(f"OpenMP/PyTorch default threads: {os.cpu_count()} cores, torch {npb.DEFAULT_THREADS} threads")
    bw = npb.copy_bandwidth()
    print(f"np.copyto bandwidth: {bw / 1e9:.1f} GB/s (read + write)\n")
    print(f"max_pool2d {args.dtype}, ties=first (PyTorch's), NCHW; median of interleaved rounds, ms "
          "(ratio = symgrad / PyTorch at the same thread count)")
    print("| case | backward 1 thread: cpu / torch (ratio) | backward default threads | "
          "fwd+bwd 1 thread | fwd+bwd default threads | backward bound (share of it, 1 thread) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as workdir:
        floors = None
        if args.floors:
            cc = symgrad.load("max_pool2d", backend="cpu", kernel_size=2).compiler()
            if cc is None:
                sys.exit("--floors needs a C compiler (cc, gcc or clang; or $CC)")
            floors = write_floors(cc, workdir)
        rows = speed(args.rounds, bw, args.cases, floors, np.dtype(args.dtype))
    for name, t, bound in rows:
        def cell(kind, n):
            a, b = t[f"{kind} cpu {n}"], t[f"{kind} torch {n}"]
            return f"{a * 1e3:.2f} / {b * 1e3:.2f} ({a / b:.2f})"
        print(f"| {name} | {cell('bwd', 1)} | {cell('bwd', 'n')} | {cell('f+b', 1)} | {cell('f+b', 'n')} | "
              f"{bound * 1e3:.2f} ({bound / t['bwd cpu 1']:.0%}) |")
    for name, t, bound in rows if floors else ():
        print(f"{name}: floors, 1 thread: ordinary stores + reads {t['floor stores'] * 1e3:.2f} ms "
              f"({bound / t['floor stores']:.0%} of the bound), memset + reads {t['floor memset'] * 1e3:.2f} ms "
              f"({bound / t['floor memset']:.0%})")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if args.no_first_use:
        return
    (load0, first), (load1, cached) = first_use()
    print(f"\nfirst use, empty cache (fresh process, after import symgrad): symgrad.load {load0:.2f} s "
          f"(derive + generate), then compile + write the library {first:.2f} s")
    print(f"from the cache (fresh process, after import symgrad): symgrad.load {load1 * 1e3:.1f} ms, "
          f"then read, verify and load the library {cached * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
