"""symgrad's NumPy adaptive_max_pool2d against PyTorch's CPU kernel, on one core each.

    python benchmarks/adaptive_numpy.py [--runs 7] [--shape 16 64 56 56] [--out 7 7]

Times forward and backward of the generated NumPy module (PyTorch's convention: tie policy first,
the last NaN wins) and of torch.nn.functional.adaptive_max_pool2d (torch.set_num_threads(1)) on
the same float32 input, the median of --runs runs, and checks that both give the same output
and gradient bit for bit.  Prints each time and the ratio symgrad / PyTorch, and the bytes each
keeps per output for backward (symgrad: a window-box index in the smallest unsigned type;
PyTorch: an int64 index).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--shape", type=int, nargs=4, default=[16, 64, 56, 56], metavar=("N", "C", "H", "W"))
    p.add_argument("--out", type=int, nargs=2, default=[7, 7], metavar=("OH", "OW"))
    args = p.parse_args()
    try:
        import torch
    except ImportError as exc:
        sys.exit(f"adaptive_numpy.py needs PyTorch (CPU) to compare with ({exc})")
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import symgrad

    torch.set_num_threads(1)
    out = tuple(args.out)
    module = symgrad.load("adaptive_max_pool2d", convention="torch", output_size=out)
    rng = np.random.default_rng(0)
    x = rng.normal(size=tuple(args.shape)).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)

    def ours():
        y, saved = module.forward(x)
        return y, saved, module.backward(g, saved)[0]

    def theirs():
        tx.grad = None
        y = torch.nn.functional.adaptive_max_pool2d(tx, out)
        y.backward(torch.from_numpy(g))
        return y

    y, saved = module.forward(x)
    g = rng.normal(size=y.shape).astype(np.float32)
    times = {}
    for name, fn in (("symgrad", ours), ("pytorch", theirs)):
        fn()  # warm up
        samples = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        times[name] = statistics.median(samples)
    y, saved, gx = ours()
    ty = theirs()
    same = np.array_equal(y, ty.detach().numpy()) and np.array_equal(gx, tx.grad.numpy())
    print(f"adaptive_max_pool2d {tuple(args.shape)} -> {out}, float32, forward + backward, "
          f"median of {args.runs}:")
    print(f"  symgrad (NumPy) {times['symgrad'] * 1e3:9.2f} ms")
    print(f"  PyTorch (CPU)   {times['pytorch'] * 1e3:9.2f} ms   ratio {times['symgrad'] / times['pytorch']:.2f}")
    print(f"  saved per output: symgrad {saved.index.itemsize} byte(s) ({saved.index.dtype}), PyTorch 8 bytes (int64)")
    print(f"  same output and gradient bit for bit: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
