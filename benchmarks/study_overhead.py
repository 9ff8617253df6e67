"""What symgrad.study.TieCounter costs in a training step, in PyTorch and in JAX (CPU).

    python benchmarks/study_overhead.py [--runs 20] [--batch 64] [--every 1]

A small CNN on 1x28x28 float32 inputs: conv 8x3x3 -> symgrad relu -> symgrad max_pool2d(2) ->
linear 10, cross-entropy, one SGD step (PyTorch: eager; JAX: the step jitted, traced once inside
the counter for the counted run).  Prints the median step time without and with the counter
(counting every --every-th call of each op; the two kinds of step alternate) and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def torch_step(batch: int):
    import torch
    import symgrad.torch as st
    torch.manual_seed(0)
    conv, lin = torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.Linear(8 * 14 * 14, 10)
    relu, pool = st.op("relu"), st.op("max_pool2d", kernel_size=2)
    opt = torch.optim.SGD(list(conv.parameters()) + list(lin.parameters()), lr=0.01)
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(lin(pool(relu(conv(x))).flatten(1)), y)
        loss.backward()
        opt.step()
    return step


def jax_step(batch: int):
    import jax
    import jax.numpy as jnp
    import symgrad.jax as sj
    relu, pool = sj.op("relu"), sj.op("max_pool2d", kernel_size=2)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"conv": 0.3 * jax.random.normal(k1, (8, 1, 3, 3)), "lin": 0.01 * jax.random.normal(k2, (8 * 14 * 14, 10))}
    x, y = jax.random.normal(k3, (batch, 1, 28, 28)), jnp.arange(batch) % 10

    def loss(p):
        h = jax.lax.conv_general_dilated(x, p["conv"], (1, 1), "SAME")
        logits = pool(relu(h)).reshape(batch, -1) @ p["lin"]
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(batch), y])

    def make():
        update = jax.jit(lambda p: jax.tree_util.tree_map(lambda a, g: a - 0.01 * g, p, jax.grad(loss)(p)))
        state = {"p": params}

        def step():
            state["p"] = update(state["p"])
            jax.block_until_ready(state["p"])
        return step
    return make


def interleaved(plain, counted, runs: int, every: int) -> tuple[float, float, int]:
    """Median ms of plain and of counted steps, run alternately (the machine's load drifts)."""
    from symgrad.study import TieCounter
    plain(), counted()  # warm up (the counted step traced inside the counter in JAX)
    a, b = [], []
    c = TieCounter(every=every)
    for _ in range(runs):
        t = time.perf_counter()
        plain()
        a.append(time.perf_counter() - t)
        with c:
            t = time.perf_counter()
            counted()
            b.append(time.perf_counter() - t)
    return 1e3 * statistics.median(a), 1e3 * statistics.median(b), sum(v.calls for v in c.totals().values())


def main() -> None:
    from symgrad.study import TieCounter
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--every", type=int, default=1)
    args = ap.parse_args()
    step = torch_step(args.batch)
    results = {"torch": interleaved(step, step, args.runs, args.every)}
    make = jax_step(args.batch)
    plain = make()
    with TieCounter():
        counted = make()
        counted()  # traced inside a counter: its compiled step holds the counting callbacks
    results["jax"] = interleaved(plain, counted, args.runs, args.every)
    for name, (p, c, calls) in results.items():
        print(f"{name}: {p:.1f} ms per step, {c:.1f} ms counted (every={args.every}): x{c / p:.2f} "
              f"({calls} op calls counted in {args.runs} steps)")


if __name__ == "__main__":
    main()
