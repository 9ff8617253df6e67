"""symgrad's NumPy order statistics against PyTorch's CPU kernels, one thread each (issue 29).

    python benchmarks/order.py [--runs 7]

Times, on float32 inputs drawn with ties (integers 0..99), the generated NumPy module under the
torch preset and PyTorch (torch.set_num_threads(1)): topk (k=8 of 4096 per row, 4096 rows) and
cummax over (256, 4096) along the last dim, forward and backward apart.  The two are timed
interleaved (one run of each in turn, so a load change on the machine hits both) and the median
of --runs runs is printed with the ratio symgrad / PyTorch.  cummax's values, indices and gradient
are checked against PyTorch bit for bit first; topk's values (its tied indices follow
std::partial_sort, which the preset does not reproduce: see README).  The cpu (C) backend does not
build these ops yet: the NumPy module is what there is to time.
"""

from __future__ import annotations

import argparse
import statistics
import time

CASES = [("topk", {"k": 8, "dim": -1}, (4096, 4096)), ("cummax", {"dim": -1}, (256, 4096))]


def interleaved(fns: dict, runs: int) -> dict:
    """{name: median seconds} of each function, run in turn runs times (after one warm-up each)."""
    for fn in fns.values():
        fn()
    samples = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) for name, s in samples.items()}


def torch_call(torch, name, params, t):
    if name == "topk":
        return torch.topk(t, params["k"], dim=params["dim"])
    return torch.cummax(t, params["dim"])


def run(torch, np, symgrad, name, params, shape, runs) -> None:
    module = symgrad.load(name, convention="torch", **params)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 100, size=shape).astype(np.float32)
    (y, idx), saved = module.forward(x)
    g = rng.standard_normal(y.shape).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    ty, ti = torch_call(torch, name, params, tx)
    ty.backward(torch.from_numpy(g))
    assert np.array_equal(y, ty.detach().numpy()), "values differ from PyTorch"
    if name == "cummax":
        assert np.array_equal(idx, ti.numpy()), "indices differ from PyTorch"
        assert np.array_equal(module.backward(g, saved)[0].view(np.uint32), tx.grad.numpy().view(np.uint32))
    tg = torch.from_numpy(g)
    with torch.no_grad():
        plain = torch.tensor(x)
    graph = {}

    def torch_forward():
        graph["t"] = torch.tensor(x, requires_grad=True)
        graph["y"] = torch_call(torch, name, params, graph["t"])[0]

    def torch_backward():
        torch_forward()  # (a graph is consumed by its backward: rebuilt, and its time subtracted below)
        graph["y"].backward(tg)

    times = interleaved({
        "symgrad forward": lambda: module.forward(x),
        "symgrad backward": lambda: module.backward(g, saved),
        "torch forward": torch_forward,
        "torch forward+backward": torch_backward,
        "torch forward (no_grad)": lambda: torch_call(torch, name, params, plain),
    }, runs)
    torch_bwd = times["torch forward+backward"] - times["torch forward"]
    print(f"{name}{params} on {shape} float32, median of {runs} interleaved runs:")
    for label, ours, theirs in (("forward", times["symgrad forward"], times["torch forward"]),
                                ("backward", times["symgrad backward"], torch_bwd)):
        print(f"  {label:<9} symgrad numpy {ours * 1e3:9.2f} ms   PyTorch {theirs * 1e3:9.2f} ms   "
              f"ratio {ours / theirs:6.2f}x")
    print(f"  (PyTorch forward without autograd: {times['torch forward (no_grad)'] * 1e3:.2f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    import numpy as np
    import torch

    import symgrad
    torch.set_num_threads(1)
    for name, params, shape in CASES:
        run(torch, np, symgrad, name, params, shape, args.runs)


if __name__ == "__main__":
    main()
