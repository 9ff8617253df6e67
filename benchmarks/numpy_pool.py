"""Speed of symgrad's generated NumPy modules against PyTorch 2.13 CPU, measured side by side.

    python benchmarks/numpy_pool.py            # about 1-2 minutes on 2 cores
    python benchmarks/numpy_pool.py --rounds 31

Needs torch (pip install torch==2.13.0, the CPU build).  It prints tables and asserts nothing.

* Every time is the median of interleaved rounds (each round runs every contender once, in an
  order shuffled afresh each round, seeded: round_orders) after warm-up rounds, all in this one
  process: symgrad's generated module, PyTorch with torch.set_num_threads(1), and PyTorch with
  its default thread count.  Ratios are symgrad / PyTorch.  Backward alone is
  torch.ops.aten.max_poolNd_with_indices_backward (1-d pooling runs as 2-d, as PyTorch does) and
  threshold_backward for relu; forward+backward is autograd (forward, then backward into x.grad).
* The bound of a backward is the least memory traffic it needs (read grad_output and the saved
  index, write grad_input), at the bandwidth of a large np.copyto measured in the same run.
* The per-window Python loop (one iteration per window: argmax, then add the gradient at the
  winner) is timed on a slice of the windows and extrapolated to all of them.
* Peak memory of backward is measured with tracemalloc (NumPy reports its buffers to it), beyond
  the gradient it returns.
* Derivation and generation cost: `symgrad generate ...` run in a fresh process, with an empty
  cache (cold) and again with the cache it filled (warm).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's symgrad
CACHE = tempfile.mkdtemp(prefix="symgrad-bench-")
os.environ["SYMGRAD_CACHE_DIR"] = CACHE

import symgrad  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    sys.exit("benchmarks/numpy_pool.py needs PyTorch: pip install torch==2.13.0")

F = torch.nn.functional
DEFAULT_THREADS = torch.get_num_threads()

POOLS = [  # (name, op, input shape, parameters)
    ("A", "max_pool2d", (8, 64, 112, 112), dict(kernel_size=2)),
    ("B", "max_pool2d", (8, 64, 56, 56), dict(kernel_size=3, stride=2, padding=1)),
    ("C", "max_pool2d", (1, 1, 512, 512), dict(kernel_size=2)),
    ("1d", "max_pool1d", (16, 64, 4096), dict(kernel_size=3, stride=2, padding=1)),
    ("3d", "max_pool3d", (2, 32, 16, 56, 56), dict(kernel_size=3, stride=2, padding=1)),
    ("3d-k2", "max_pool3d", (2, 32, 16, 56, 56), dict(kernel_size=2)),
]
ELEMENTS = 10**7


CLOCK = time.perf_counter  # --clock cpu: the thread's CPU time for one-thread contenders


def round_orders(names: list, rounds: int, seed: int = 0):
    """Each round's order of the contenders: shuffled afresh each round, seeded (a run repeats its
    orders), so that each contender follows each other one about equally often.

    A rotation of one fixed order keeps every contender's predecessor fixed, and the predecessor
    sets how cold the caches are: in cpu_pool.py's order symgrad's one-thread backward always ran
    right after PyTorch's forward+backward on all threads.  Timed by predecessor in shuffled
    rounds (case C, 60 rounds, thread CPU time): symgrad's backward took 0.168 ms after that one
    against 0.080-0.133 ms after the others (median 0.125 ms), PyTorch's 0.181-0.211 ms after
    any but its own backward (median 0.192 ms)."""
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        yield order


def timed(contenders: dict, rounds: int, warm: int = 3) -> dict:
    """{name: median seconds}; contenders: {name: (torch threads or None, function)}.

    Contenders on one thread (symgrad, PyTorch with 1 thread) use CLOCK; PyTorch with several
    threads always uses the wall clock."""
    names = list(contenders)
    times = {n: [] for n in names}
    for r, order in enumerate(round_orders(names, warm + rounds)):
        for n in order:
            threads, fn = contenders[n]
            if threads is not None:
                torch.set_num_threads(threads)
            clock = time.perf_counter if threads not in (None, 1) else CLOCK
            t = clock()
            fn()
            dt = clock() - t
            if r >= warm:
                times[n].append(dt)
    torch.set_num_threads(DEFAULT_THREADS)
    return {n: float(np.median(v)) for n, v in times.items()}


def copy_bandwidth() -> float:
    """Bytes moved per second (read + write) by a large np.copyto."""
    src = np.ones(2**24, dtype=np.float32)  # 64 MiB
    dst = np.empty_like(src)
    ts = []
    for _ in range(7):
        t = CLOCK()
        np.copyto(dst, src)
        ts.append(CLOCK() - t)
    return 2 * src.nbytes / float(np.median(ts))


def _tuple(v, d):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * d


def torch_pool_backward(d: int, params: dict, x, g, indices):
    """PyTorch's pooling backward kernel alone (1-d pooling runs as 2-d, as in PyTorch)."""
    k = _tuple(params["kernel_size"], d)
    s = _tuple(params.get("stride") or params["kernel_size"], d)
    p = _tuple(params.get("padding", 0), d)
    dil = _tuple(params.get("dilation", 1), d)
    ceil = params.get("ceil_mode", False)
    if d == 1:
        x, g, indices = x.unsqueeze(-2), g.unsqueeze(-2), indices.unsqueeze(-2)
        k, s, p, dil = (1,) + k, (1,) + s, (0,) + p, (1,) + dil
        d = 2
    op = getattr(torch.ops.aten, f"max_pool{d}d_with_indices_backward")
    return lambda: op(g, x, list(k), list(s), list(p), list(dil), ceil, indices)


def loop_backward_seconds(x: np.ndarray, g: np.ndarray, params: dict, d: int, windows: int) -> tuple:
    """Seconds of a per-window Python loop backward over all windows (timed on a slice of about
    `windows` windows), and the number of windows timed."""
    k = _tuple(params["kernel_size"], d)
    s = _tuple(params.get("stride") or params["kernel_size"], d)
    p = _tuple(params.get("padding", 0), d)
    dil = _tuple(params.get("dilation", 1), d)
    planes = x.reshape((-1,) + x.shape[-d:])
    gs = g.reshape((-1,) + g.shape[-d:])
    out = gs.shape[1:]
    rows = max(1, min(out[0], windows // max(1, math.prod(out[1:]))))
    xp = np.pad(planes[0], [(q, q) for q in p], constant_values=-np.inf)
    grad = np.zeros_like(xp)
    t = CLOCK()
    count = 0
    for o in np.ndindex((rows,) + out[1:]):
        sl = tuple(slice(oi * si, oi * si + (ki - 1) * di + 1, di) for oi, si, ki, di in zip(o, s, k, dil))
        win = xp[sl]
        j = np.unravel_index(np.argmax(win), win.shape)
        grad[tuple(oi * si + ji * di for oi, si, ji, di in zip(o, s, j, dil))] += gs[0][o]
        count += 1
    seconds = CLOCK() - t
    return seconds * gs.size / count, count


def backward_peak_extra(m, g, saved) -> int:
    """Peak bytes allocated during backward beyond the gradient it returns."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    (gx,) = m.backward(g, saved)
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    return peak - gx.nbytes


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:.3g}" if s < 0.01 else f"{s * 1e3:.1f}"


def fmt_mb(b: float) -> str:
    return f"{b / 2**20:.2f} MiB"


def pools(rounds: int, bw: float, loop_windows: int) -> list:
    rows = []
    for name, op, shape, params in POOLS:
        d = int(op[-2])
        m = symgrad.load(op, convention="torch", **params)  # PyTorch's ties and NaN rule
        rng = np.random.default_rng(0)
        x = rng.normal(size=shape).astype(np.float32)
        y, saved = m.forward(x)
        g = rng.normal(size=y.shape).astype(np.float32)
        tx, tg = torch.from_numpy(x), torch.from_numpy(g)
        ty, ti = getattr(F, f"max_pool{d}d")(tx, return_indices=True, **params)
        assert ty.shape == y.shape
        tb = torch_pool_backward(d, params, tx, tg, ti)
        txg = tx.clone().requires_grad_(True)

        def torch_fb():
            getattr(F, f"max_pool{d}d")(txg, **params).backward(tg)
            txg.grad = None

        def sg_fb():
            _, s = m.forward(x)
            m.backward(g, s)

        bwd = timed({"sg": (None, lambda: m.backward(g, saved)), "t1": (1, tb), "tn": (DEFAULT_THREADS, tb)}, rounds)
        fb = timed({"sg": (None, sg_fb), "t1": (1, torch_fb), "tn": (DEFAULT_THREADS, torch_fb)},
                   max(5, rounds // 2))
        bound = (y.size * (g.itemsize + saved.index.itemsize) + x.size * x.itemsize) / bw
        loop, timed_windows = loop_backward_seconds(x, g, params, d, loop_windows)
        plan = m._layout(x.shape)
        path = m._path(plan, x.nbytes)
        rows.append(dict(name=name, op=op, shape=shape, params=params, bwd=bwd, fb=fb, bound=bound, path=path,
                         saved=saved.index.nbytes / y.size, torch_saved=ti.element_size(),
                         loop=loop, loop_windows=timed_windows, windows=y.size,
                         extra=backward_peak_extra(m, g, saved), grad_output=g.nbytes))
    return rows


def elementwise(rounds: int, bw: float) -> list:
    rng = np.random.default_rng(1)
    a, b, g = (rng.normal(size=ELEMENTS).astype(np.float32) for _ in range(3))
    ta, tb_, tg = (torch.from_numpy(v) for v in (a, b, g))
    rows = []
    relu = symgrad.load("relu", convention="torch")
    _, s_relu = relu.forward(a)
    tar = ta.clone().requires_grad_(True)

    def relu_fb():
        _, s = relu.forward(a)
        relu.backward(g, s)

    def torch_relu_fb():
        F.relu(tar).backward(tg)
        tar.grad = None

    tbw = lambda: torch.ops.aten.threshold_backward(tg, ta, 0)  # noqa: E731
    rows.append(dict(name="relu", bwd=timed({"sg": (None, lambda: relu.backward(g, s_relu)), "t1": (1, tbw),
                                             "tn": (DEFAULT_THREADS, tbw)}, rounds),
                     fb=timed({"sg": (None, relu_fb), "t1": (1, torch_relu_fb),
                               "tn": (DEFAULT_THREADS, torch_relu_fb)}, max(5, rounds // 2)),
                     bound=3 * a.nbytes / bw))
    mx = symgrad.load("maximum", convention="torch")  # half to each at a tie
    _, s_max = mx.forward(a, b)
    tar, tbr = ta.clone().requires_grad_(True), tb_.clone().requires_grad_(True)
    ty = torch.maximum(tar, tbr)
    tmb = lambda: torch.autograd.grad(ty, (tar, tbr), tg, retain_graph=True)  # noqa: E731

    def max_fb():
        _, s = mx.forward(a, b)
        mx.backward(g, s)

    def torch_max_fb():
        torch.maximum(tar, tbr).backward(tg)
        tar.grad = tbr.grad = None

    rows.append(dict(name="maximum (split)", bwd=timed({"sg": (None, lambda: mx.backward(g, s_max)), "t1": (1, tmb),
                                                        "tn": (DEFAULT_THREADS, tmb)}, rounds),
                     fb=timed({"sg": (None, max_fb), "t1": (1, torch_max_fb),
                               "tn": (DEFAULT_THREADS, torch_max_fb)}, max(5, rounds // 2)),
                     bound=5 * a.nbytes / bw))
    return rows


def generation_costs() -> list:
    """(wall, CPU) seconds of `symgrad generate` in a fresh process: cold (empty cache), then warm.

    The CPU seconds (user + system of the child) do not count waiting for a loaded machine."""
    import resource
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, SYMGRAD_CACHE_DIR=str(Path(tmp) / "cache"), PYTHONPATH=str(ROOT))
        for label, args in [("generate max_pool3d --kernel-size 3", ["max_pool3d", "--kernel-size", "3"]),
                            ("generate --catalog (all entries)", ["--catalog"])]:
            times = []
            for _ in range(2):
                out = Path(tmp) / f"out{len(rows)}{len(times)}"
                t = time.perf_counter()
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run([sys.executable, "-m", "symgrad", "generate", *args, "--out", str(out)],
                               check=True, env=env, cwd=tmp, stdout=subprocess.DEVNULL)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                times.append((time.perf_counter() - t, after.ru_utime + after.ru_stime
                              - before.ru_utime - before.ru_stime))
            rows.append((label, times[0], times[1]))
    return rows


def scatter_profile(rounds: int) -> list:
    """Where the time of the scatter backward goes, on A, B and C: the NumPy calls of the
    generated module's _scatter, repeated here one by one with a clock around each kind."""
    rows = []
    for name, op, shape, params in POOLS[:3]:
        m = symgrad.load(op, convention="torch", **params)
        rng = np.random.default_rng(0)
        x = rng.normal(size=shape).astype(np.float32)
        y, saved = m.forward(x)
        g = rng.normal(size=y.shape).astype(np.float32)
        plan = m._layout(x.shape)
        size, count = math.prod(plan.plane_shape), math.prod(plan.out_plane)
        offsets = np.array([e.offset for e in plan.elements], dtype=np.intp)
        gf, index = g.reshape(-1), saved.index.reshape(-1)
        step = min(m.SCATTER, max(1024, g.nbytes // 32))
        if count <= step:
            per = max(1, min(plan.planes, step // count))
            origin = (plan.origin + np.arange(per, dtype=np.intp)[:, None] * size).reshape(-1)
            steps = [(b * count, min(b + per, plan.planes) * count, b * size, 0,
                      min(b + per, plan.planes) * size) for b in range(0, plan.planes, per)]
        else:
            origin = plan.origin
            steps = [(b * count + k, b * count + min(k + step, count), b * size, k,
                      (b + 1) * size if k == 0 else None)
                     for b in range(plan.planes) for k in range(0, count, step)]
        parts = {"zeros": [], "positions": [], "add.at": [], "total": []}
        positions = np.empty(min(step, plan.planes * count), dtype=np.intp)
        for _ in range(rounds):
            t0 = CLOCK()
            grad = np.empty(plan.planes * size, dtype=g.dtype)
            tz = tp = ta = 0.0
            for i0, i1, at, k, zero_to in steps:
                t = CLOCK()
                if zero_to is not None:
                    grad[at:zero_to] = 0
                t1 = CLOCK()
                position = np.take(offsets, index[i0:i1], out=positions[:i1 - i0], mode="wrap")
                position += origin[k:k + i1 - i0]
                t2 = CLOCK()
                np.add.at(grad[at:], position, gf[i0:i1])
                tz, tp, ta = tz + t1 - t, tp + t2 - t1, ta + CLOCK() - t2
            parts["zeros"].append(tz)
            parts["positions"].append(tp)
            parts["add.at"].append(ta)
            parts["total"].append(CLOCK() - t0)
        rows.append((name, y.size, {k: float(np.median(v)) for k, v in parts.items()}))
    return rows


def call_profile(rounds: int) -> list:
    """cProfile of the generated backward on A, B and C: the calls its time goes to (own time)."""
    import cProfile
    import pstats
    rows = []
    for name, op, shape, params in POOLS[:3]:
        m = symgrad.load(op, convention="torch", **params)
        x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
        y, saved = m.forward(x)
        g = np.ones_like(y)
        m.backward(g, saved)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(rounds):
            m.backward(g, saved)
        prof.disable()
        stats = pstats.Stats(prof).stats
        total = sum(v[2] for v in stats.values())
        top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:5]
        rows.append((name, m._path(m._layout(x.shape), x.nbytes), total / rounds,
                     [(fn[2] if fn[0] == "~" else f"{Path(fn[0]).name.split('_')[0]}:{fn[2]}",
                       v[2] / rounds, v[1] / rounds) for fn, v in top]))
    return rows


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} cores; Python {platform.python_version()}, "
            f"NumPy {np.__version__}, PyTorch {torch.__version__} (default threads: {DEFAULT_THREADS})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds per measurement (median)")
    ap.add_argument("--loop-windows", type=int, default=3000, help="windows timed for the Python loop")
    ap.add_argument("--profile", action="store_true", help="also: where the scatter backward's time goes")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: time symgrad and 1-thread PyTorch by the thread's CPU time (a machine "
                         "shared with other work); multi-thread PyTorch stays on the wall clock")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    print(f"# symgrad NumPy benchmark, {datetime.date.today().isoformat()}")
    print(f"machine: {machine()}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} (other processes share these cores)")
    bw = copy_bandwidth()
    print(f"large np.copyto: {bw / 1e9:.1f} GB/s (bytes read + written), the bandwidth of the bounds below")
    clock = "wall clock" if args.clock == "wall" else \
        f"CPU time of the thread for symgrad and t1, wall clock for t{DEFAULT_THREADS}"
    print(f"times: median of {args.rounds} interleaved rounds (forward+backward: {max(5, args.rounds // 2)}), "
          f"{clock}, float32; t1 = PyTorch with 1 thread, t{DEFAULT_THREADS} = default threads\n")
    rows = pools(args.rounds, bw, args.loop_windows)
    n = DEFAULT_THREADS
    print("## Pooling, backward only\n")
    print(f"| config | backward path | symgrad ms | t1 ms | ratio to t1 | t{n} ms | ratio to t{n} | share of bound "
          f"(symgrad / t1) | saved bytes per output (symgrad / torch) | speed-up over per-window loop |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        b = r["bwd"]
        cfg = f"{r['name']}: {r['op']} {'x'.join(map(str, r['shape']))} " + \
              " ".join(f"{k}={v}" for k, v in r["params"].items())
        print(f"| {cfg} | {r['path']} | {fmt_ms(b['sg'])} | {fmt_ms(b['t1'])} | **{b['sg'] / b['t1']:.2f}** | "
              f"{fmt_ms(b['tn'])} | {b['sg'] / b['tn']:.2f} | {r['bound'] / b['sg']:.0%} / {r['bound'] / b['t1']:.0%} | "
              f"{r['saved']:g} / {r['torch_saved']} | {r['loop'] / b['sg']:,.0f}x |")
    print("\n(per-window loop: timed on the first "
          + ", ".join(f"{r['name']}: {r['loop_windows']:,} of {r['windows']:,}" for r in rows)
          + " windows, extrapolated: " + ", ".join(f"{r['name']} ~{r['loop']:.1f} s" for r in rows) + ")\n")
    print("## Pooling, forward + backward\n")
    print(f"| config | symgrad ms | t1 ms | ratio to t1 | t{n} ms | ratio to t{n} |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        f = r["fb"]
        print(f"| {r['name']} | {fmt_ms(f['sg'])} | {fmt_ms(f['t1'])} | **{f['sg'] / f['t1']:.2f}** | "
              f"{fmt_ms(f['tn'])} | {f['sg'] / f['tn']:.2f} |")
    print("\n## Memory of backward (tracemalloc)\n")
    print("| config | peak extra beyond grad_input | size of grad_output | extra / grad_output |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {fmt_mb(r['extra'])} | {fmt_mb(r['grad_output'])} | "
              f"{r['extra'] / r['grad_output']:.2f} |")
    erows = elementwise(args.rounds, bw)
    print(f"\n## Elementwise, {ELEMENTS:,} float32 elements\n")
    print(f"| op | backward: symgrad ms | t1 ms | ratio to t1 | t{n} ms | ratio to t{n} | share of bound "
          f"(symgrad / t1) | fwd+bwd: symgrad ms | t1 ms | ratio to t1 | t{n} ms | ratio to t{n} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in erows:
        b, f = r["bwd"], r["fb"]
        print(f"| {r['name']} | {fmt_ms(b['sg'])} | {fmt_ms(b['t1'])} | **{b['sg'] / b['t1']:.2f}** | "
              f"{fmt_ms(b['tn'])} | {b['sg'] / b['tn']:.2f} | {r['bound'] / b['sg']:.0%} / {r['bound'] / b['t1']:.0%} | "
              f"{fmt_ms(f['sg'])} | {fmt_ms(f['t1'])} | **{f['sg'] / f['t1']:.2f}** | {fmt_ms(f['tn'])} | "
              f"{f['sg'] / f['tn']:.2f} |")
    if args.profile:
        print("\n## Profile of the scatter backward (the generated _scatter's NumPy calls, timed by kind)\n")
        print("| config | zeros ms | positions (take + add) ms | np.add.at ms | total ms | ns per window: positions / add.at |")
        print("|---|---|---|---|---|---|")
        for name, windows, p in scatter_profile(args.rounds):
            print(f"| {name} | {fmt_ms(p['zeros'])} | {fmt_ms(p['positions'])} | {fmt_ms(p['add.at'])} | "
                  f"{fmt_ms(p['total'])} | {p['positions'] / windows * 1e9:.2f} / {p['add.at'] / windows * 1e9:.2f} |")
    if args.profile:
        print("\n## Profile of backward (cProfile, own time per call of backward; under the profiler)\n")
        print("| config | path | total ms | top calls: ms (calls) |")
        print("|---|---|---|---|")
        for name, path, total, top in call_profile(max(5, args.rounds // 3)):
            print(f"| {name} | {path} | {fmt_ms(total)} | "
                  + "; ".join(f"{fn} {fmt_ms(t)} ({n:g})" for fn, t, n in top) + " |")
    print("\n## Derivation and generation (fresh process; seconds, wall / CPU)\n")
    print("| command | cold cache | warm cache | target |")
    print("|---|---|---|---|")
    for label, cold, warm in generation_costs():
        target = "< 5 s" if "max_pool3d" in label else "< 60 s"
        print(f"| symgrad {label} | {cold[0]:.2f} / {cold[1]:.2f} | {warm[0]:.2f} / {warm[1]:.2f} | {target} |")
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
