"""The cost of symgrad.torch's operator wrapping over calling the generated module it runs directly.

    python benchmarks/torch_wrapper.py             # about 1 minute on a loaded 2-core machine
    python benchmarks/torch_wrapper.py --rounds 41 --calls 20

Needs torch (pip install torch==2.13.0, the CPU build).  Prints a table and asserts nothing.

max_pool2d, kernel 3, stride 2, padding 1, on an 8 x 64 x 56 x 56 float32 input: forward and
backward through symgrad.torch (autograd: forward, then backward into x.grad) against the forward
and backward of the module it runs for CPU tensors (the cpu backend's where a C compiler is found,
else the NumPy module: symgrad.bridge.module_for_cpu, $SYMGRAD_CPU_BACKEND) called directly on
the same data (through zero-copy views), and PyTorch's own max_pool2d for scale, on the wall
clock and in process CPU time (the fairer figure on a loaded machine).  Both sides run the cpu
backend with the thread count symgrad.torch passes it (torch.get_num_threads(): 1 here).

A sample is --calls back-to-back calls of one contender (one call, about 3-4 ms, is too short
to time alone on a loaded machine: a single preemption or cache refill moves it by percents);
a round takes one sample of every contender, in an order shuffled afresh each round
(numpy_pool.round_orders), after --warmup rounds, all in this one process.  Each contender's time
a call is the median over the rounds, printed with its interquartile range.  The overhead is
symgrad.torch / that module - 1 taken within each round (the two samples ran under the same
load), its median over the rounds printed with its interquartile range: the target is at most
10%.

For scale, the least any autograd wrapper of that module pays is timed too ("autograd.Function
floor": a bare torch.autograd.Function whose forward calls the module on a zero-copy view and keeps
the input and output for backward, as every PyTorch op does, and whose backward calls the module's
backward): PyTorch's own autograd machinery (Function.apply, the engine, Tensor.backward's Python)
on caches the kernel has just filled with its arrays.  symgrad.torch's own share is
symgrad.torch / floor - 1, taken within each round the same way.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's symgrad
_CACHE = tempfile.TemporaryDirectory(prefix="symgrad-bench-")  # removed when the process exits
os.environ.setdefault("SYMGRAD_CACHE_DIR", _CACHE.name)

try:
    import torch
except ImportError:
    sys.exit("benchmarks/torch_wrapper.py needs PyTorch: pip install torch==2.13.0")

import symgrad  # noqa: E402
import symgrad.torch as st  # noqa: E402
from symgrad import bridge  # noqa: E402
from symgrad.backends.cpu import framework_threads  # noqa: E402
from numpy_pool import round_orders  # noqa: E402  (this directory is on sys.path: a script)

PARAMS = {"kernel_size": 3, "stride": 2, "padding": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10, help="calls a sample (default 10)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((8, 64, 56, 56)).astype(np.float32)
    numpy = symgrad.load("max_pool2d", **PARAMS)
    # the module symgrad.torch runs for this CPU tensor, chosen as it chooses
    module = bridge.module_for_cpu(numpy, lambda: symgrad.load("max_pool2d", backend="cpu", **PARAMS),
                                   bridge.cpu_backend_choice())
    direct = ("cpu" if module is not numpy else "NumPy") + " module"
    op = st.op("max_pool2d", **PARAMS)
    # the thread count symgrad.torch hands the cpu backend (torch.get_num_threads(), 1 here), not
    # OpenMP's default: like with like
    threads = framework_threads(module, torch.get_num_threads)
    g_np = np.ones(module.forward(x_np, **threads)[0].shape, dtype=np.float32)
    x = torch.from_numpy(x_np.copy()).requires_grad_()
    g = torch.from_numpy(g_np)

    def module_direct():
        _, saved = module.forward(x_np, **threads)
        module.backward(g_np, saved, **threads)

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            output, ctx.saved = module.forward(t.detach().numpy(), **threads)
            out = torch.from_numpy(output)
            ctx.save_for_backward(t, out)
            return out

        @staticmethod
        def backward(ctx, grad_output):
            ctx.saved_tensors  # (the version checks every op's backward makes)
            return torch.from_numpy(module.backward(grad_output.numpy(), ctx.saved, **threads)[0])

    def floor():
        x.grad = None
        Floor.apply(x).backward(g)

    def symgrad_torch():
        x.grad = None
        op(x).backward(g)

    def pytorch():
        x.grad = None
        torch.nn.functional.max_pool2d(x, **PARAMS).backward(g)

    contenders = {direct: module_direct, "autograd.Function floor": floor, "symgrad.torch": symgrad_torch,
                  "PyTorch (1 thread)": pytorch}
    clocks = {"wall": time.perf_counter, "process CPU": time.process_time}
    times = {(clock, name): [] for clock in clocks for name in contenders}
    for r, order in enumerate(round_orders(list(contenders), args.warmup + args.rounds)):
        for name in order:
            run = contenders[name]
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.calls):
                run()
            if r >= args.warmup:
                times["wall", name].append((time.perf_counter() - t0) / args.calls)
                times["process CPU", name].append((time.process_time() - c0) / args.calls)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"max_pool2d k3 s2 p1, 8x64x56x56 float32, forward + backward, a call's time: median "
          f"[interquartile range] of {args.rounds} rounds of {args.calls} calls each (torch "
          f"{torch.__version__}, 1 thread; load average {load}); process CPU time is the fairer "
          f"figure on a loaded machine")
    for clock in clocks:
        for name in contenders:
            print(f"  {clock:12s} {name:23s} {_spread(times[clock, name], 1e3, '.3f')} ms")
        ratios = {name: np.array(times[clock, name]) / np.array(times[clock, base]) - 1
                  for name, base in (("symgrad.torch", direct), ("autograd.Function floor", direct))}
        own = np.array(times[clock, "symgrad.torch"]) / np.array(times[clock, "autograd.Function floor"]) - 1
        print(f"  {clock:12s} wrapper overhead {_spread(ratios['symgrad.torch'], 100, '+.1f')}% "
              f"(symgrad.torch / {direct} - 1, each round; target <= 10%); the autograd.Function "
              f"floor's {_spread(ratios['autograd.Function floor'], 100, '+.1f')}%; symgrad.torch "
              f"over the floor {_spread(own, 100, '+.1f')}%")


def _spread(values, scale: float, spec: str) -> str:
    """The median of values and their interquartile range, scaled: "m [q1, q3]"."""
    q1, m, q3 = (format(float(v) * scale, spec) for v in np.percentile(values, [25, 50, 75]))
    return f"{m} [{q1}, {q3}]"

if __name__ == "__main__":
    main()
