"""symgrad's NumPy adaptive_max_pool2d against PyTorch's CPU kernel, on one core each.

    python benchmarks/adaptive_numpy.py [--runs 7] [--shape 16 64 56 56 --out 7 7]

Without --shape, runs the default configurations: the one above, global pooling
8x64x56x56 -> 1, 8x64x56x56 -> (2, 3) and 8x512x14x14 -> 7.  Times forward and backward of the
generated NumPy module (PyTorch's convention: tie policy first, the last NaN wins), with the
strategy it picks per input shape and with each strategy forced (STRATEGY = "box": one pass per
window-box element over all windows; "window": one whole-row call per output window), and of
torch.nn.functional.adaptive_max_pool2d (torch.set_num_threads(1)) on the same float32 input,
the median of --runs runs, and checks that every variant gives PyTorch's output and gradient bit
for bit.  Prints each time and its ratio to PyTorch's, and the bytes each keeps per output for
backward (symgrad: a window-box index in the smallest unsigned type; PyTorch: an int64 index).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

CONFIGS = [((16, 64, 56, 56), (7, 7)), ((8, 64, 56, 56), (1, 1)), ((8, 64, 56, 56), (2, 3)),
           ((8, 512, 14, 14), (7, 7))]


def median_time(fn, runs: int) -> float:
    fn()  # warm up
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def run(torch, np, symgrad, shape: tuple, out: tuple, runs: int) -> bool:
    module = symgrad.load("adaptive_max_pool2d", convention="torch", output_size=out)
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    y, saved = module.forward(x)
    g = rng.normal(size=y.shape).astype(np.float32)

    def ours():
        y, saved = module.forward(x)
        return y, saved, module.backward(g, saved)[0]

    def theirs():
        tx.grad = None
        y = torch.nn.functional.adaptive_max_pool2d(tx, out)
        y.backward(torch.from_numpy(g))
        return y

    torch_time = median_time(theirs, runs)
    ty = theirs().detach().numpy()
    tgx = tx.grad.numpy().copy()
    print(f"adaptive_max_pool2d {shape} -> {out}, float32, forward + backward, median of {runs}:")
    print(f"  PyTorch (CPU, 1 thread)   {torch_time * 1e3:9.2f} ms")
    same_all = True
    for strategy in (None, "box", "window"):
        module.STRATEGY = strategy
        t = median_time(ours, runs)
        y, saved, gx = ours()
        same = np.array_equal(y, ty) and np.array_equal(gx, tgx)
        same_all &= same
        label = "symgrad (NumPy) " + ("picked" if strategy is None else f"{strategy:6s}")
        print(f"  {label:25s} {t * 1e3:9.2f} ms   ratio {t / torch_time:6.2f}   "
              f"same output and gradient bit for bit: {same}")
    module.STRATEGY = None
    print(f"  saved per output: symgrad {saved.index.itemsize} byte(s) ({saved.index.dtype}), "
          f"PyTorch 8 bytes (int64)")
    return same_all


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--shape", type=int, nargs=4, metavar=("N", "C", "H", "W"))
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
    configs = [(tuple(args.shape), tuple(args.out))] if args.shape else CONFIGS
    ok = True
    for shape, out in configs:
        ok &= run(torch, np, symgrad, shape, out, args.runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
