"""scatter_max's backward (a symgrad backend's module, gather form) against PyTorch's scatter_reduce amax
backward, on a graph-sized input, one CPU thread.

    python benchmarks/segment.py [--runs 7] [--edges 1000000] [--segments 50000] [--features 64]
                                 [--ties split first torch] [--backend numpy cpu torch jax]
                                 [--clock wall|process]

src (edges, features) float32 with ties (values rounded to 1/4), index ids[:, None] expanded
along the features (graph pooling's form: the module's row path), input -inf (include_self).
Timed per round, interleaved (each round runs every variant once, in turn): PyTorch's backward
(torch.autograd.grad of y = input.scatter_reduce(0, index, src, "amax") with a fixed grad_output,
forward excluded) and each symgrad module's backward(g, saved) (forward run once, outside the
timing), and symgrad's forward beside PyTorch's forward.  Prints medians over --runs rounds and
ratios to PyTorch (> 1: slower than PyTorch).  --backend: the symgrad backends timed (default
numpy; cpu: the compiled kernels, one thread: forward is serial, backward threads=1; torch: the
torch backend's module on torch tensors, one intra-op thread; jax: the jax backend's module, its
forward and backward each jitted, timed to block_until_ready, XLA's CPU threads as configured);
the figures depend on the machine's load (printed with them).  --clock process times the
process's CPU time (time.process_time: every thread's, not the other processes' on a loaded
machine; leave jax out, whose XLA threads it adds up) instead of the wall clock.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--segments", type=int, default=50_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--ties", nargs="+", default=["split", "first", "torch"])
    parser.add_argument("--backend", nargs="+", default=["numpy"], choices=["numpy", "cpu", "torch", "jax"])
    parser.add_argument("--clock", choices=["wall", "process"], default="wall")
    args = parser.parse_args()

    import numpy as np
    import torch

    import symgrad

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    e, s, f = args.edges, args.segments, args.features
    src = np.round(rng.standard_normal((e, f), dtype=np.float32) * 4) / 4
    ids = rng.integers(0, s, e)
    index = np.broadcast_to(ids[:, None], (e, f))
    inp = np.full((s, f), -np.inf, dtype=np.float32)
    g = rng.standard_normal((s, f), dtype=np.float32)
    ts, ti = torch.from_numpy(src).requires_grad_(True), torch.from_numpy(inp).requires_grad_(True)
    tindex, tg = torch.from_numpy(ids)[:, None].expand(e, f), torch.from_numpy(g)

    def torch_forward():
        return ti.scatter_reduce(0, tindex, ts, "amax")

    ty = torch_forward()

    def torch_backward():
        torch.autograd.grad(ty, (ti, ts), tg, retain_graph=True)

    variants = {"torch forward": torch_forward, "torch backward": torch_backward}
    for backend in args.backend:
        threads = {"threads": 1} if backend == "cpu" else {}
        for ties in args.ties:
            settings = {"convention": "torch"} if ties == "torch" else {"ties": ties}
            mod = symgrad.load("scatter_max", backend=backend, **settings)
            forward, backward, done, arrays = _module(backend, mod, threads, (inp, index, src, g))
            _, saved = forward(*arrays[:3])
            name = f"{backend} {ties}"
            variants[f"{name} forward"] = lambda f=forward, a=arrays, d=done: d(f(*a[:3]))
            variants[f"{name} backward"] = lambda b=backward, a=arrays, s=saved, d=done: d(b(a[3], s))
    times = {name: [] for name in variants}
    clock = time.process_time if args.clock == "process" else time.perf_counter
    for _ in range(args.runs):
        for name, fn in variants.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"torch {torch.__version__}, numpy {np.__version__}, 1 thread, float32, {e} edges into {s} "
          f"segments, {f} features; median of {args.runs} interleaved rounds ({args.clock} clock); "
          f"load average {load}")
    for name, ts_ in times.items():
        med = statistics.median(ts_)
        base = statistics.median(times["torch " + name.rsplit(" ", 1)[1]])
        print(f"  {name:28s} {med * 1e3:9.1f} ms  ({med / base:5.2f}x torch)")


def _module(backend: str, mod, threads: dict, arrays: tuple) -> tuple:
    """(forward, backward, wait for a result, the arrays in the backend's type): the torch module on
    tensors, the jax module jitted (its results waited for), the others on NumPy arrays."""
    import functools
    if backend == "torch":
        import torch
        inp, index, src, g = (torch.from_numpy(a) for a in arrays)
        return mod.forward, mod.backward, (lambda r: r), (inp, index[:, :1].expand(index.shape), src, g)
    if backend == "jax":
        import jax
        import jax.numpy as jnp
        return (jax.jit(mod.forward), jax.jit(mod.backward), jax.block_until_ready,
                tuple(jnp.asarray(a) for a in arrays))
    return (functools.partial(mod.forward, **threads), functools.partial(mod.backward, **threads),
            (lambda r: r), arrays)


if __name__ == "__main__":
    main()
