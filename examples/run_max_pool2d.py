"""Run a generated max_pool2d module on a small input with ties.

    python examples/run_max_pool2d.py DIR    # DIR holds a module written by `symgrad generate`
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python examples/run_max_pool2d.py DIR", file=sys.stderr)
        return 2
    paths = sorted(Path(sys.argv[1]).glob("max_pool2d_*.py"))
    if not paths:
        print(f"no generated max_pool2d module in {sys.argv[1]}", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("max_pool2d_generated", paths[0])
    pool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pool)

    x = np.array([[[1.0, 2.0, 2.0, 0.0],
                   [4.0, 4.0, 1.0, 3.0],
                   [0.0, 4.0, 2.0, 3.0],
                   [1.0, 1.0, 3.0, 3.0]]])  # (C, H, W): several ties
    y, saved = pool.forward(x)
    (grad_x,) = pool.backward(np.ones_like(y), saved)
    print(f"module: {paths[0].name}")
    print(f"op: {pool.OP}  params: {pool.PARAMS}  tie policy: {pool.TIES}")
    print("input:\n", x[0])
    print("forward:\n", y[0])
    print("saved window-local index:", saved.index.dtype, "\n", saved.index[0])
    print("backward of sum(y) (gradient each input receives):\n", grad_x[0])
    print(pool.__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
