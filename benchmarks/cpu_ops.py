"""Every op of the cpu backend (compiled C kernels), forward and backward, against PyTorch 2.13 CPU
on one thread, side by side in one process.

    python benchmarks/cpu_ops.py               # a few minutes on 2 cores (compiles every module first)
    python benchmarks/cpu_ops.py --quick       # 1 timed second per case and direction (3 by default)
    python benchmarks/cpu_ops.py --only leaky_relu amax    # the cases whose label starts so

Needs torch (the CPU build), ml_dtypes (bfloat16) and a C compiler.  It prints one table of ratios
(symgrad / PyTorch) and asserts nothing.

* symgrad: each op loaded with backend="cpu" and convention="torch" (PyTorch's tie policy and NaN
  rule), called with threads=1; PyTorch with torch.set_num_threads(1).
* Forward is a training forward on both sides: symgrad's forward (the output and what backward
  keeps) against PyTorch's op on an input that requires grad (the output and its autograd node,
  with the index where the op keeps one).  Backward is symgrad's backward against
  torch.autograd.grad of that output (PyTorch's backward kernel and the engine's call), each
  allocating the gradients it returns.
* Backward is timed right after its own forward, as a training step runs it: each backward sample
  is one forward (untimed: symgrad's forward for its `saved`, PyTorch's forward for a fresh
  autograd graph) followed at once by the one timed backward of its output (PyTorch's graph then
  freed, no retain_graph).  Session 9's method (all four calls of a case in one shuffled round)
  ran a backward after its own forward only by chance; session 10's (each backward after an untimed
  call of itself, its operands warm in the caches) timed a backward that no training step runs.
* Forward and backward are timed apart, each as a pair (symgrad, PyTorch) in interleaved rounds:
  each round runs both once in an order shuffled afresh (seeded), after 3 warm-up calls of each,
  until --seconds of timed calls are spent (3 s; --quick 1 s; at least --rounds rounds, at most
  401), so that a 2 ms case gets hundreds of rounds.  Times are medians; a ratio is the median of
  each round's ratio (the two calls of a round share the machine's state of the moment).  The
  clock is the process's CPU time (time.process_time: a machine shared with other work slows it
  little; both contenders run in the calling thread); Python's garbage collector is off while
  the rounds run.  Why: the earlier --quick (3 rounds after one warm-up round, all four calls of
  a case in each round) gave the same code's forward ratios 1.01-1.09 (amax dim -1), 0.99-1.11
  (amin), 0.90-1.09 (amax all) and 1.03-1.37 (maxout) in 4 runs at a load average of 6.5; this one
  1.04-1.06, 1.04-1.07, 1.01-1.04 and 1.04-1.13 in 3 runs at 11-13.  Timing each contender right
  after an untimed call of itself (its operands in the caches) made maxout's rounds bimodal
  (interquartile range of the round ratios 0.85-1.8 against 0.96-1.16), so the rounds do not.
* Huge pages for both where the outputs are large: PyTorch's allocator asks for them only with
  THP_MEM_ALLOC_ENABLE=1 (set here before torch is imported; without it a 64 MB result is
  page-faulted in 4 KiB pages on every call), and NumPy (which allocates symgrad's results) asks for
  them by default (np._core.multiarray._get_madvise_hugepage(), printed).
* symgrad's elementwise loaders reuse a large output's buffer once nothing refers to it (their
  REUSE: a freed 64 MiB result is written over instead of mapped and zeroed anew, about half of a
  memory-bound op's time); PyTorch's CPU allocator maps every result afresh.  --no-reuse sets
  REUSE = 0 in each module timed: both sides then fault in every result.
* Targets (issue 28): at most 1.0x PyTorch for every op, at most 0.8x for pooling.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch is imported (numpy_pool imports it)
CACHE = os.environ.get("SYMGRAD_CACHE_DIR")  # a cache given is kept (numpy_pool sets a fresh one)

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import numpy_pool as npb  # noqa: E402  (this checkout's symgrad, torch, the timing helpers)

import symgrad  # noqa: E402
from symgrad.ops import resolve  # noqa: E402
from symgrad.pipeline import build  # noqa: E402

if CACHE:
    os.environ["SYMGRAD_CACHE_DIR"] = CACHE

torch = npb.torch
F = torch.nn.functional
try:
    import ml_dtypes
    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BFLOAT16 = None

ELEMENTS = 16 * 2**20  # the elementwise ops' input: 16M float32 (64 MiB)
NO_REUSE = False  # --no-reuse


def _pool(d: int, **p):
    return lambda x: getattr(F, f"max_pool{d}d")(x, **p)


def _adaptive(d: int, size):
    return lambda x: getattr(F, f"adaptive_max_pool{d}d")(x, size)


# (label, op, parameters, input shape, PyTorch's forward of the inputs, dtypes, kind): kind "pool"
# for the pooling ops (target 0.8x), "other" for the rest (1.0x)
POOL_A = dict(kernel_size=2)
POOL_B = dict(kernel_size=3, stride=2, padding=1)
HALVES = ("float32", "float16", "bfloat16")
CASES = [
    ("relu", "relu", {}, (ELEMENTS,), F.relu, ("float32",), "other"),
    ("leaky_relu", "leaky_relu", {}, (ELEMENTS,), lambda x: F.leaky_relu(x, 0.01), ("float32",), "other"),
    ("clamp(-1, 1)", "clamp", dict(min=-1.0, max=1.0), (ELEMENTS,), lambda x: torch.clamp(x, -1.0, 1.0),
     ("float32",), "other"),
    ("hardtanh", "hardtanh", {}, (ELEMENTS,), F.hardtanh, ("float32",), "other"),
    ("relu6", "relu6", {}, (ELEMENTS,), F.relu6, ("float32",), "other"),
    ("abs", "abs", {}, (ELEMENTS,), torch.abs, ("float32",), "other"),
    ("maximum", "maximum", {}, (ELEMENTS,), torch.maximum, ("float32",), "other"),
    ("minimum", "minimum", {}, (ELEMENTS,), torch.minimum, ("float32",), "other"),
    ("amax dim -1 4096x4096", "amax", dict(dim=-1), (4096, 4096), lambda x: torch.amax(x, -1), ("float32",), "other"),
    ("amax dim 0 4096x4096", "amax", dict(dim=0), (4096, 4096), lambda x: torch.amax(x, 0), ("float32",), "other"),
    ("amin dim -1 4096x4096", "amin", dict(dim=-1), (4096, 4096), lambda x: torch.amin(x, -1), ("float32",), "other"),
    ("amax all 4096x4096", "amax", {}, (4096, 4096), torch.amax, ("float32",), "other"),
    ("logsumexp dim -1 4096x4096", "logsumexp", dict(dim=-1), (4096, 4096), lambda x: torch.logsumexp(x, -1),
     ("float32",), "other"),
    ("maxout 4 32x256x16x16", "maxout", dict(pieces=4), (32, 256, 16, 16),
     lambda x: x.unflatten(1, (-1, 4)).amax(2), ("float32",), "other"),
    ("max_pool2d A 8x64x112x112 k2", "max_pool2d", POOL_A, (8, 64, 112, 112), _pool(2, **POOL_A), HALVES, "pool"),
    ("max_pool2d B 8x64x56x56 k3s2p1", "max_pool2d", POOL_B, (8, 64, 56, 56), _pool(2, **POOL_B), HALVES, "pool"),
    ("max_pool2d C 1x1x512x512 k2", "max_pool2d", POOL_A, (1, 1, 512, 512), _pool(2, **POOL_A), ("float32",), "pool"),
    ("max_pool1d 16x64x4096 k3s2p1", "max_pool1d", POOL_B, (16, 64, 4096), _pool(1, **POOL_B), ("float32",), "pool"),
    ("max_pool3d 2x32x16x56x56 k3s2p1", "max_pool3d", POOL_B, (2, 32, 16, 56, 56), _pool(3, **POOL_B),
     ("float32",), "pool"),
    ("adaptive_max_pool2d 8x64x56x56 -> 7x7", "adaptive_max_pool2d", dict(output_size=(7, 7)), (8, 64, 56, 56),
     _adaptive(2, (7, 7)), ("float32",), "pool"),
    ("adaptive_max_pool1d 16x64x4096 -> 100", "adaptive_max_pool1d", dict(output_size=100), (16, 64, 4096),
     _adaptive(1, 100), ("float32",), "pool"),
    ("adaptive_max_pool3d 2x32x16x28x28 -> 4x7x7", "adaptive_max_pool3d", dict(output_size=(4, 7, 7)),
     (2, 32, 16, 28, 28), _adaptive(3, (4, 7, 7)), ("float32",), "pool"),
    ("fractional_max_pool2d 8x64x48x48 k3 -> 20x20", "fractional_max_pool2d",
     dict(kernel_size=3, output_size=(20, 20)), (8, 64, 48, 48), None, ("float32",), "pool"),
    ("max_unpool2d 8x64x56x56 k2", "max_unpool2d", POOL_A, (8, 64, 56, 56), None, ("float32",), "pool"),
]
# issue 30: the elementwise activations the cpu backend builds (target 1.0x)
CASES += [
    ("rrelu", "rrelu", {}, (ELEMENTS,), lambda x: F.rrelu(x, training=False), ("float32",), "other"),
    ("softshrink", "softshrink", {}, (ELEMENTS,), lambda x: F.softshrink(x, 0.5), ("float32",), "other"),
    ("hardsigmoid", "hardsigmoid", {}, (ELEMENTS,), F.hardsigmoid, ("float32",), "other"),
    ("threshold(1, 5)", "threshold", dict(threshold=1.0, value=5.0), (ELEMENTS,),
     lambda x: F.threshold(x, 1.0, 5.0), ("float32",), "other"),
]
CASES += [("hardswish", "hardswish", {}, (ELEMENTS,), F.hardswish, ("float32",), "other"),  # issue 30
          ("elu", "elu", {}, (ELEMENTS,), F.elu, ("float32",), "other"),
          ("celu(0.5)", "celu", dict(alpha=0.5), (ELEMENTS,), lambda x: F.celu(x, 0.5), ("float32",), "other")]


def to_torch(a: np.ndarray):
    """The same memory as a tensor (bfloat16 through its bits)."""
    if BFLOAT16 is not None and a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def inputs(op: str, params: dict, shape: tuple, dtype: np.dtype, rng):
    """(symgrad's inputs, PyTorch's forward of them where it is not the case's, the index of the one
    input that requires grad (None: all do))."""
    x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    if op in ("maximum", "minimum"):
        return (x, rng.standard_normal(shape, dtype=np.float32).astype(dtype)), None, None
    if op.startswith("fractional"):
        samples = (0.99 * rng.random(shape[:2] + (2,))).astype(dtype)
        return (x, samples), (lambda t, s: F.fractional_max_pool2d(
            t, params["kernel_size"], output_size=params["output_size"], _random_samples=s)), 0
    if op.startswith("max_unpool"):
        pooled = rng.standard_normal(shape[:2] + tuple(2 * s for s in shape[2:]), dtype=np.float32)
        _, index = F.max_pool2d(torch.from_numpy(pooled), return_indices=True, **params)
        return (x, index.numpy()), (lambda t, i: F.max_unpool2d(t, i, **params)), 0
    return (x,), None, 0


def contenders(label, op, params, shape, torch_forward, dtype, rng) -> tuple:
    """(the forward pair, the backward pair): {\"symgrad\": ..., \"torch\": ...} each, a function
    (forward) or (untimed forward, timed backward taking what the forward returned) (backward)."""
    # bfloat16 where the torch preset adds overlapping windows' terms in bfloat16 as PyTorch does,
    # which the cpu backend computes for max pooling only (its b16 kernels): the NumPy module
    # elsewhere (adaptive and fractional pooling), which symgrad.torch runs then
    kernel = build(resolve(op, convention="torch", **params)).kernel
    adds = getattr(kernel, "bfloat16_adds", "float32") == "bfloat16"
    backend = "numpy" if dtype == BFLOAT16 and adds and not op.startswith("max_pool") else "cpu"
    one = {} if backend == "numpy" else {"threads": 1}
    m = symgrad.load(op, backend=backend, convention="torch", **params)
    if NO_REUSE and hasattr(m, "REUSE"):
        m.REUSE = 0
    args, special, wrt = inputs(op, params, shape, dtype, rng)
    fwd = special or torch_forward
    y, saved = m.forward(*args, **one)
    g = rng.standard_normal(y.shape, dtype=np.float32).astype(dtype)
    targs = [to_torch(a).clone() for a in args]
    grads = targs if wrt is None else [targs[wrt]]
    for t in grads:
        t.requires_grad_(True)
    with torch.no_grad():
        ref = fwd(*targs)
    assert tuple(ref.shape) == y.shape, (label, tuple(ref.shape), y.shape)
    ty = fwd(*targs)
    tg = to_torch(g)
    del y, saved, ty
    # backward: (untimed forward, timed backward of what it returned); the forward's output stays
    # alive through the backward on both sides, as in a training step
    return (
        {"symgrad": lambda: m.forward(*args, **one), "torch": lambda: fwd(*targs)},
        {"symgrad": (lambda: m.forward(*args, **one), lambda kept: m.backward(g, kept[1], **one)),
         "torch": (lambda: fwd(*targs), lambda out: torch.autograd.grad(out, grads, tg))},
    )


def sampled(pair: dict, budget: float, least: int = 7, warm: int = 3, most: int = 401) -> dict:
    """{name: [seconds of each timed round]} of two contenders ({name: function, or (setup, function):
    setup() untimed right before each timed function(setup())}) timed alone in interleaved rounds,
    each round running both once in an order shuffled afresh (seeded).

    Before the rounds each contender runs `warm` times (its buffers mapped, its code and the
    library loaded); then rounds run until `budget` seconds of the two contenders' time are spent
    (at least `least`, at most `most` rounds), so that a 2 ms case gets hundreds of rounds and a
    100 ms case about as many seconds.  Python's garbage collector is off while they run."""
    names = list(pair)
    steps = {n: f if isinstance(f, tuple) else (None, f) for n, f in pair.items()}
    for _ in range(warm):
        for n in names:
            setup, fn = steps[n]
            fn(setup()) if setup else fn()
    times = {n: [] for n in names}
    rng = random.Random(0)
    gc.collect()
    gc.disable()
    try:
        spent = 0.0
        while len(times[names[0]]) < most and (len(times[names[0]]) < least or spent < budget):
            rng.shuffle(names)
            for n in names:
                setup, fn = steps[n]
                if setup:
                    kept = setup()
                    t = time.process_time()
                    fn(kept)
                    dt = time.process_time() - t
                    del kept
                else:
                    t = time.process_time()
                    fn()
                    dt = time.process_time() - t
                times[n].append(dt)
                spent += dt
    finally:
        gc.enable()
    return times


def settled(times: dict) -> tuple:
    """(symgrad's median seconds, PyTorch's, the ratio): the median of each round's ratio, a round's
    two calls sharing the machine's state of the moment."""
    mine, theirs = np.asarray(times["symgrad"]), np.asarray(times["torch"])
    return float(np.median(mine)), float(np.median(theirs)), float(np.median(mine / theirs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="timed seconds per case and direction (rounds until spent; default 3, --quick 1)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds per case and direction, at least")
    ap.add_argument("--quick", action="store_true", help="1 timed second per case and direction")
    ap.add_argument("--only", nargs="+", metavar="LABEL", help="the cases whose label starts with one of these")
    ap.add_argument("--no-reuse", action="store_true", help="symgrad's elementwise outputs mapped afresh each call")
    args = ap.parse_args()
    global NO_REUSE
    NO_REUSE = args.no_reuse
    seconds = 1.0 if args.quick else args.seconds
    cases = [c for c in CASES if not args.only or any(c[0].startswith(o) for o in args.only)]
    print(npb.machine())
    print(f"load average at start: {os.getloadavg()[0]:.2f} (other processes share these cores)")
    print(f"huge pages: THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')} (PyTorch), "
          f"NumPy madvise hugepage {np._core.multiarray._get_madvise_hugepage()}; "
          f"/sys/kernel/mm/transparent_hugepage/enabled: "
          f"{Path('/sys/kernel/mm/transparent_hugepage/enabled').read_text().strip()}")
    print("symgrad's elementwise outputs: " + ("mapped afresh each call (--no-reuse)" if NO_REUSE
          else "a freed output's buffer reused (the loaders' REUSE)"))
    print(f"times: process CPU time, medians of interleaved shuffled rounds (forward and backward timed apart, "
          f"{seconds:g} s of timed calls each, at least {args.rounds} rounds, after 3 warm-up calls; each backward "
          "sample timed right after its own untimed forward, as a training step runs it); ratio: the "
          "median of each round's ratio; symgrad cpu backend threads=1 (bfloat16 adaptive/fractional pooling "
          "with overlapping windows: the NumPy module), convention='torch'; PyTorch torch.set_num_threads(1)\n")
    print("| case | dtype | forward ms: symgrad / torch | ratio | backward ms: symgrad / torch | ratio | target |")
    print("|---|---|---|---|---|---|---|")
    worst = {}
    for label, op, params, shape, torch_forward, dtypes, kind in cases:
        for name in dtypes:
            if name == "bfloat16" and BFLOAT16 is None:
                continue
            dtype = BFLOAT16 if name == "bfloat16" else np.dtype(name)
            pairs = contenders(label, op, params, shape, torch_forward, dtype, np.random.default_rng(0))
            torch.set_num_threads(1)
            (fs, ft, rf), (bs, bt, rb) = (settled(sampled(p, seconds, args.rounds)) for p in pairs)
            torch.set_num_threads(npb.DEFAULT_THREADS)
            target = 0.8 if kind == "pool" else 1.0
            worst[(label, name)] = max(rf, rb) / target
            mark = lambda r: f"**{r:.2f}**" if r > target else f"{r:.2f}"  # noqa: E731
            print(f"| {label} | {name} | {fs * 1e3:.3g} / {ft * 1e3:.3g} | {mark(rf)} | "
                  f"{bs * 1e3:.3g} / {bt * 1e3:.3g} | {mark(rb)} | {target} |", flush=True)
    over = [k for k, v in worst.items() if v > 1]
    print(f"\n{len(worst) - len(over)} of {len(worst)} cases within target (bold: over it)")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
