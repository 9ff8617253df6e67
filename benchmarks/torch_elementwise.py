"""symgrad.torch's elementwise ops on the torch backend against PyTorch's own, on one CPU thread.

    python benchmarks/torch_elementwise.py [--runs 21] [--size 1000000] [--ops relu hardtanh ...]

One process, one thread on every side (torch.set_num_threads(1); the compiled C kernels follow
it), float32 input of --size elements.  Each timing is one training-step-like forward + backward:
y = op(x); y.backward(g).  Timed, interleaved round by round (each round runs every variant once,
in turn) and reported as medians over --runs rounds:

* torch.compile (Inductor, fullgraph): symgrad's op (the torch backend's module inside an
  autograd.Function, traced and fused) against PyTorch's op, each compiled the same way;
* eager: symgrad's old path (today's eager CPU path: the compiled C kernels through the
  registered operators; the NumPy module without a C compiler), symgrad's new path (the torch
  backend's module in the autograd.Function, called eagerly) and PyTorch's op.

Prints each median and its ratio to PyTorch's op in the same mode.  The figures depend on the
machine's load: run it on a quiet machine and quote the load with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

OPS = {
    "relu": ({}, "relu"),
    "hardtanh": ({}, "hardtanh"),
    "leaky_relu": ({}, "leaky_relu"),
    "maximum": ({}, "maximum"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--ops", nargs="+", default=["relu"], choices=sorted(OPS))
    parser.add_argument("--ties", default="split")
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    import symgrad.torch as st

    torch.set_num_threads(1)
    theirs = {"relu": torch.relu, "hardtanh": F.hardtanh, "leaky_relu": F.leaky_relu,
              "maximum": torch.maximum}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, float32, "
          f"{args.size} elements, median of {args.runs} interleaved rounds; "
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for name in args.ops:
        params, op_name = OPS[name]
        ours = st.op(op_name, ties=args.ties, **params)
        native = ours._native[0]  # the new path, called eagerly
        n_inputs = len(ours.inputs)
        gen = torch.Generator().manual_seed(0)
        xs = [torch.randn(args.size, generator=gen).requires_grad_(True) for _ in range(n_inputs)]
        g = torch.randn(args.size, generator=gen)

        def step(fn):
            def run():
                for x in xs:
                    x.grad = None
                fn(*xs).backward(g)
            return run

        variants = {
            "compile: symgrad (torch backend)": step(torch.compile(lambda *t: ours(*t), fullgraph=True)),
            "compile: torch": step(torch.compile(lambda *t: theirs[name](*t), fullgraph=True)),
            "eager: symgrad old path (C kernels)": step(ours),
            "eager: symgrad new path (torch backend)": step(native.apply),
            "eager: torch": step(theirs[name]),
        }
        for run in variants.values():  # warm up: compile, load, first calls
            run()
            run()
        samples = {k: [] for k in variants}
        for _ in range(args.runs):
            for label, run in variants.items():
                t0 = time.perf_counter()
                run()
                samples[label].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in samples.items()}
        print(f"\n{name} (ties={args.ties!r}), forward + backward:")
        for label, t in med.items():
            base = med["compile: torch"] if label.startswith("compile") else med["eager: torch"]
            print(f"  {label:42s} {t * 1e3:8.3f} ms   {t / base:5.2f}x torch")
        print(f"  eager new path / old path: {med['eager: symgrad new path (torch backend)'] / med['eager: symgrad old path (C kernels)']:.2f}")


if __name__ == "__main__":
    main()
