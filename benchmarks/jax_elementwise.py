"""jit(grad) of sum(relu(x)) in JAX: symgrad.jax's native path (the jax backend's module traced
in place) against its callback path (the NumPy or cpu backend's module in a host callback, the
path every op took before) and jax.nn.relu, for x of 1M float32 on the CPU.

    python benchmarks/jax_elementwise.py [--runs 21] [--size 1000000] [--ties split]

One process; the three are timed interleaved (one call of each per round, in turn), each the
median of --runs rounds after a warm-up; prints each median and its ratio to jax.nn.relu's, and
checks that the native and callback paths give the same gradient bit for bit.  The cpu backend
follows $SYMGRAD_CPU_BACKEND as symgrad.jax.op does.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--ties", default="split")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    import symgrad.jax as sj

    x = jnp.asarray(np.random.default_rng(0).integers(-3, 4, args.size).astype(np.float32))
    native = sj.op("relu", ties=args.ties)
    callback = sj._callback_op("relu", ties=args.ties)
    funcs = {
        "symgrad.jax (native)": jax.jit(jax.grad(lambda v: native(v).sum())),
        "symgrad.jax (callback)": jax.jit(jax.grad(lambda v: callback(v).sum())),
        "jax.nn.relu": jax.jit(jax.grad(lambda v: jax.nn.relu(v).sum())),
    }
    results = {name: np.asarray(f(x)) for name, f in funcs.items()}  # compile and warm up
    same = results["symgrad.jax (native)"].tobytes() == results["symgrad.jax (callback)"].tobytes()
    samples = {name: [] for name in funcs}
    for _ in range(args.runs):
        for name, f in funcs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(x))
            samples[name].append(time.perf_counter() - t0)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    base = medians["jax.nn.relu"]
    print(f"jit(grad(sum(relu(x)))), x: {args.size} float32, ties={args.ties!r}, "
          f"{jax.devices()[0].platform}, median of {args.runs} interleaved rounds:")
    for name, m in medians.items():
        print(f"  {name:24s} {m * 1e3:9.3f} ms   {m / base:7.2f}x jax.nn.relu")
    print(f"  native == callback gradient bit for bit: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
