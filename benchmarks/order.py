"""symgrad's order statistics (the cpu backend's C kernels and the NumPy module) against
PyTorch's CPU kernels, one thread each (issue 29).

    python benchmarks/order.py [--runs 7]

Times, on float32 inputs drawn with ties (integers 0..99), the generated modules under the torch
preset (the cpu backend with threads=1) and PyTorch (torch.set_num_threads(1)): topk (k=8 of 4096
per row, 4096 rows) and cummax over (256, 4096) along the last dim, forward and backward apart.
They are timed interleaved (one run of each in turn, so a load change on the machine hits all)
in process CPU time (time.process_time: the time this process ran, not the time it waited for
a core on a loaded machine), and the median of --runs runs is printed with the ratio
symgrad / PyTorch, against PyTorch with autograd set up (forward on a leaf that requires grad;
backward = forward+backward less forward) and without (the bare op under no_grad; the backward's
own ATen kernel, cummaxmin_backward or value_selecting_reduction_backward, on the saved indices).  cummax's values, indices and gradient are checked against PyTorch bit for bit
first; topk's values (its tied indices follow std::partial_sort, which the preset does not
reproduce: see README).
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
            t0 = time.process_time()
            fn()
            samples[name].append(time.process_time() - t0)
    return {name: statistics.median(s) for name, s in samples.items()}


def torch_call(torch, name, params, t):
    if name == "topk":
        return torch.topk(t, params["k"], dim=params["dim"])
    return torch.cummax(t, params["dim"])


def no_grad(torch, call, name, params, t):
    with torch.no_grad():
        return call(torch, name, params, t)


def torch_backward_kernel(torch, name, params, g, x, indices):
    """PyTorch's backward without autograd: the ATen kernel its autograd formula calls."""
    if name == "topk":
        return torch.ops.aten.value_selecting_reduction_backward(g, params["dim"], indices, x.shape, True)
    return torch.ops.aten.cummaxmin_backward(g, x, indices, params["dim"])


def run(torch, np, symgrad, name, params, shape, runs) -> None:
    modules = {backend: symgrad.load(name, convention="torch", backend=backend, **params)
               for backend in ("cpu", "numpy")}
    modules["cpu"].THREADS = 1
    rng = np.random.default_rng(0)
    x = rng.integers(0, 100, size=shape).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    ty, ti = torch_call(torch, name, params, tx)
    g = rng.standard_normal(ty.shape).astype(np.float32)
    ty.backward(torch.from_numpy(g))
    saves = {}
    for backend, module in modules.items():
        (y, idx), saves[backend] = module.forward(x)
        assert np.array_equal(y, ty.detach().numpy()), f"{backend}: values differ from PyTorch"
        if name == "cummax":
            assert np.array_equal(idx, ti.numpy()), f"{backend}: indices differ from PyTorch"
            grad = module.backward(g, saves[backend])[0]
            assert np.array_equal(grad.view(np.uint32), tx.grad.numpy().view(np.uint32)), f"{backend}: gradient"
    tg = torch.from_numpy(g)
    plain = torch.from_numpy(x)
    graph = {}

    def torch_forward():
        graph["t"] = torch.from_numpy(x).requires_grad_()  # (no copy: the op's own time)
        graph["y"] = torch_call(torch, name, params, graph["t"])[0]

    def torch_backward():
        torch_forward()  # (a graph is consumed by its backward: rebuilt, and its time subtracted below)
        graph["y"].backward(tg)

    times = interleaved({
        "cpu forward": lambda: modules["cpu"].forward(x),
        "cpu backward": lambda: modules["cpu"].backward(g, saves["cpu"]),
        "numpy forward": lambda: modules["numpy"].forward(x),
        "numpy backward": lambda: modules["numpy"].backward(g, saves["numpy"]),
        "torch forward": torch_forward,
        "torch forward+backward": torch_backward,
        "torch forward (no_grad)": lambda: no_grad(torch, torch_call, name, params, plain),
        "torch backward (kernel)": lambda: torch_backward_kernel(torch, name, params, tg, plain, ti),
    }, runs)
    torch_bwd = times["torch forward+backward"] - times["torch forward"]
    print(f"{name}{params} on {shape} float32, median process CPU time of {runs} interleaved runs:")
    for label, theirs in (("forward", times["torch forward"]), ("backward", torch_bwd)):
        for backend in ("cpu", "numpy"):
            ours = times[f"{backend} {label}"]
            print(f"  {label:<9} symgrad {backend:<5} {ours * 1e3:9.2f} ms   PyTorch {theirs * 1e3:9.2f} ms   "
                  f"ratio {ours / theirs:6.2f}x   (PyTorch with autograd set up)")
    for label, theirs in (("forward", times["torch forward (no_grad)"]),
                          ("backward", times["torch backward (kernel)"])):
        ours = times[f"cpu {label}"]
        print(f"  {label:<9} symgrad cpu   {ours * 1e3:9.2f} ms   PyTorch {theirs * 1e3:9.2f} ms   "
              f"ratio {ours / theirs:6.2f}x   (PyTorch without autograd: the bare kernel)")


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
