"""Memory of the generated NumPy modules on large inputs, measured with tracemalloc.

    PYTHONPATH=. python benchmarks/numpy_memory.py            # a few minutes on one core
    PYTHONPATH=. python benchmarks/numpy_memory.py --size 2048

NumPy reports its buffers to tracemalloc, so for each case this prints, in multiples of the
input's size: the peak of forward beyond its input, the peak of backward beyond grad_output and
the saved state (the gradient it returns included), and what stays allocated once the arrays and
the saved state are deleted (the module's own caches: the pooling modules' plan cache). It asserts
nothing.
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

import numpy as np

import symgrad


def measure(label: str, module, inputs: list) -> None:
    gc.collect()
    size = sum(x.nbytes for x in inputs)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    y, saved = module.forward(*inputs)
    forward_peak = tracemalloc.get_traced_memory()[1] - base
    g = np.ones_like(y)
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    grads = module.backward(g, saved)
    backward_peak = tracemalloc.get_traced_memory()[1] - before
    del y, saved, g, grads
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    print(f"{label:58s} input {size / 2**20:8.1f} MiB   forward peak {forward_peak / size:5.2f}x   "
          f"backward peak {backward_peak / size:5.2f}x   kept after del {kept / 2**20:8.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096, help="side of the square plane")
    n = parser.parse_args().size
    rng = np.random.default_rng(0)
    plane = rng.standard_normal((1, 1, n, n)).astype(np.float32)
    for ties in ("first", "split"):
        pool = symgrad.load("max_pool2d", kernel_size=8, stride=1, padding=4, ties=ties)
        measure(f"max_pool2d k8 s1 p4 {ties}, {n}x{n} float32", pool, [plane])
    pool = symgrad.load("max_pool2d", kernel_size=3, stride=2, padding=1)
    measure(f"max_pool2d k3 s2 p1 first, {n}x{n} float32", pool, [plane])
    batch = rng.standard_normal((32, 64, 56, 56)).astype(np.float32)  # planes smaller than a block
    for kernel, stride, padding in ((2, 2, 0), (3, 2, 1)):
        pool = symgrad.load("max_pool2d", kernel_size=kernel, stride=stride, padding=padding, ties="split")
        measure(f"max_pool2d k{kernel} s{stride} p{padding} split, (32, 64, 56, 56) float32", pool, [batch])
    del batch
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, 1)).astype(np.float32)
    for ties in ("first", "split"):
        measure(f"maximum {ties}, ({n}, {n}) with ({n}, 1) float32", symgrad.load("maximum", ties=ties),
                [a, b])
    measure(f"maximum first, ({n}, {n}) with ({n}, {n}) float32", symgrad.load("maximum"), [a, a.copy()])
    expr = symgrad.load_expr("Max(x*y, x + y, 0)", ties="split")
    measure(f"Max(x*y, x + y, 0) split, ({n}, {n}) with ({n}, 1)", expr, [a, b])


if __name__ == "__main__":
    main()
