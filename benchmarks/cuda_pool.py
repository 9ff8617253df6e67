"""symgrad's CUDA max_pool2d against PyTorch's, side by side on one GPU.

    python benchmarks/cuda_pool.py [--runs 50] [--batch 10] [--channels-last]

Needs CuPy (pip install ".[cuda]" from the checkout) and PyTorch with CUDA in the same environment.  For
N=64, C=64, 112x112 inputs, kernel 2 stride 2 and kernel 3 stride 2 padding 1, float32 and
float16, it times forward and backward of symgrad (tie policy first, PyTorch's convention) and of
PyTorch's max_pool2d_with_indices[_backward] on the same tensors and the same CUDA stream, with
CUDA events: each sample is `--batch` back-to-back calls (so host overhead between launches is
hidden as it is in training), the median of `--runs` samples is reported.  It prints

* the time of each and the ratio symgrad / PyTorch (below 1: symgrad is faster);
* the achieved memory bandwidth of each, counting the bytes each must move (every tensor read or
  written once), as a share of the device's copy bandwidth measured here with a large
  device-to-device copy;
* the bytes each saves per output for backward (symgrad: a uint8 window-local index; PyTorch:
  an int64 index);

and checks that both give the same output and, with integer gradients, the same gradient.
"""

from __future__ import annotations

import argparse
import statistics
import sys


def _need():
    try:
        import cupy as cp
    except ImportError as exc:
        sys.exit(f'cuda_pool.py needs CuPy: pip install ".[cuda]" from the checkout ({exc})')
    try:
        import torch
    except ImportError as exc:
        sys.exit(f"cuda_pool.py needs PyTorch with CUDA ({exc})")
    if not torch.cuda.is_available():
        sys.exit("cuda_pool.py: PyTorch sees no CUDA device")
    return cp, torch


def median_ms(cp, fn, runs: int, batch: int) -> float:
    """Median over runs of (time of `batch` calls) / batch, in milliseconds, by CUDA events."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(runs):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) / batch)
    return statistics.median(samples)


def copy_bandwidth(cp, runs: int) -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write counted)."""
    n = 1 << 30
    a = cp.zeros(n, dtype=cp.uint8)
    b = cp.empty_like(a)
    ms = median_ms(cp, lambda: b.data.copy_from_device_async(a.data, n), runs, 5)
    del a, b
    return 2 * n / (ms * 1e-3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="samples per measurement (median)")
    parser.add_argument("--batch", type=int, default=10, help="calls per sample")
    parser.add_argument("--channels-last", action="store_true", help="NHWC inputs instead of NCHW")
    parser.add_argument("--shape", type=int, nargs=4, default=(64, 64, 112, 112), metavar=("N", "C", "H", "W"))
    args = parser.parse_args(argv)

    cp, torch = _need()
    import symgrad

    stream = torch.cuda.current_stream()
    with cp.cuda.ExternalStream(stream.cuda_stream):  # one stream for both libraries
        bw = copy_bandwidth(cp, args.runs)
        print(f"device: {torch.cuda.get_device_name()}; measured copy bandwidth {bw / 1e9:.0f} GB/s")
        print(f"input {tuple(args.shape)} {'channels-last' if args.channels_last else 'NCHW'}; "
              f"median of {args.runs} samples of {args.batch} calls; symgrad ties='first'")
        header = (f"{'config':<14}{'dtype':<9}{'pass':<9}{'symgrad ms':>11}{'torch ms':>10}{'ratio':>7}"
                  f"{'symgrad BW':>12}{'torch BW':>10}{'saved B/out':>13}  match")
        print(header)
        print("-" * len(header))
        for k, s, p in ((2, 2, 0), (3, 2, 1)):
            module = symgrad.load("max_pool2d", backend="cuda", ties="first", kernel_size=k, stride=s, padding=p)
            for dtype in (torch.float32, torch.float16):
                run_config(cp, torch, module, args, k, s, p, dtype, bw)
    return 0


def run_config(cp, torch, module, args, k, s, p, dtype, bw):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(0, 8, tuple(args.shape), device="cuda", generator=gen).to(dtype)  # with ties
    if args.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    xc = cp.from_dlpack(x)
    aten = torch.ops.aten
    K, S, P, D = [k, k], [s, s], [p, p], [1, 1]

    y, saved = module.forward(xc)
    ty, tidx = aten.max_pool2d_with_indices(x, K, S, P, D, False)
    g = torch.randint(-4, 5, tuple(ty.shape), device="cuda", generator=gen).to(dtype)
    if args.channels_last:
        g = g.contiguous(memory_format=torch.channels_last)
    gc = cp.from_dlpack(g)
    (gx,) = module.backward(gc, saved)
    tgx = aten.max_pool2d_with_indices_backward(g, x, K, S, P, D, False, tidx)
    match = bool(cp.array_equal(y, cp.from_dlpack(ty))) and bool(cp.array_equal(gx, cp.from_dlpack(tgx)))

    item = x.element_size()
    n_in, n_out = x.numel(), ty.numel()
    ours_saved = saved.index.itemsize
    theirs_saved = tidx.element_size()
    rows = {
        "forward": (lambda: module.forward(xc),
                    lambda: aten.max_pool2d_with_indices(x, K, S, P, D, False),
                    (n_in + n_out) * item + n_out * ours_saved, (n_in + n_out) * item + n_out * theirs_saved),
        "backward": (lambda: module.backward(gc, saved),
                     lambda: aten.max_pool2d_with_indices_backward(g, x, K, S, P, D, False, tidx),
                     (n_out + n_in) * item + n_out * ours_saved, (n_out + n_in) * item + n_out * theirs_saved),
    }
    for name, (ours, theirs, ours_bytes, theirs_bytes) in rows.items():
        t_ours = median_ms(cp, ours, args.runs, args.batch)
        t_theirs = median_ms(cp, theirs, args.runs, args.batch)
        share_ours = ours_bytes / (t_ours * 1e-3) / bw
        share_theirs = theirs_bytes / (t_theirs * 1e-3) / bw
        print(f"{f'k{k} s{s} p{p}':<14}{str(dtype).replace('torch.', ''):<9}{name:<9}{t_ours:>11.3f}"
              f"{t_theirs:>10.3f}{t_ours / t_theirs:>7.2f}{share_ours:>11.0%} {share_theirs:>9.0%}"
              f"{f'{ours_saved} vs {theirs_saved}':>13}  {'yes' if match else 'NO'}")


if __name__ == "__main__":
    sys.exit(main())
