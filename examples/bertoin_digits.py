"""Bertoin et al.'s bifurcation measurement (NeurIPS 2021, "Numerical influence of ReLU'(0) on
backpropagation") on scikit-learn's digits, with symgrad's relu.

    python examples/bertoin_digits.py [--widths 32 128 512] [--dtypes float16 float32 float64]
                                      [--inits 20] [--samples 1797] [--batch 32] [--out DIR]

For each width, dtype and initialisation (seed): an MLP 64 -> width -> width -> 10 with symgrad's
relu trains one epoch of SGD (batches of --batch, cross-entropy, learning rate 0.1) with
relu'(0) = 0 (ties="first", the frameworks' choice).  Before each step the batch's backward also
runs with relu'(0) = 1 (ties="last", symgrad.study.compare_torch): the initialisation
*bifurcates* if some batch of its epoch gives different parameter gradients under the two.  The
relu elements at the kink (pre-activation exactly 0) are counted by symgrad.study.TieCounter.
Prints a table per dtype and width (share of initialisations that bifurcate, batches whose
gradients differ, kink hits per epoch); with --out, writes it (bertoin_digits.md) and a bar chart
(bertoin_digits.svg) there.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DTYPES = ("float16", "float32", "float64")


@dataclass
class Row:
    dtype: str
    width: int
    inits: int
    bifurcated: int  # initialisations with a batch whose gradients differ
    differing_batches: int  # over all initialisations
    batches: int
    kink_hits: int  # relu elements exactly at 0, over all initialisations

    @property
    def share(self) -> float:
        return self.bifurcated / self.inits


def digits(samples: int, dtype):
    import torch
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data[:samples] / 16.0, dtype=dtype)
    return x, torch.tensor(d.target[:samples])


def mlp(width: int, seed: int, dtype):
    import torch
    torch.manual_seed(seed)  # the same initial weights (rounded to dtype) for every dtype
    layers = [torch.nn.Linear(64, width), torch.nn.Linear(width, width), torch.nn.Linear(width, 10)]
    return torch.nn.Sequential(*layers).to(dtype)


def epoch(width: int, dtype: str, seed: int, samples: int, batch: int) -> tuple[int, int, int]:
    """(batches whose gradients differ, batches, kink hits) of one initialisation's epoch."""
    import torch
    import symgrad.torch as st
    from symgrad.study import TieCounter, compare_torch
    dt = getattr(torch, dtype)
    relu = st.op("relu", ties="first")
    x, y = digits(samples, dt)
    model = mlp(width, seed, dt)
    order = np.random.default_rng(seed).permutation(len(x))
    differing = n = 0
    counter = TieCounter()
    for start in range(0, len(x), batch):
        idx = torch.from_numpy(order[start:start + batch])
        xb, yb = x[idx], y[idx]

        def loss():
            h = relu(model[1](relu(model[0](xb))))
            return torch.nn.functional.cross_entropy(model[2](h), yb)
        with counter, torch.no_grad():  # the kinks this batch's forward meets
            loss()
        # b = first: the gradients left in the model are relu'(0) = 0's
        differing += compare_torch(model, loss, a="last", b="first").differ
        n += 1
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    hits = sum(c.at_tie for c in counter.totals().values())
    return differing, n, hits


def measure(widths, dtypes, inits: int, samples: int, batch: int) -> list[Row]:
    rows = []
    for dtype in dtypes:
        for width in widths:
            runs = [epoch(width, dtype, seed, samples, batch) for seed in range(inits)]
            print(f"{dtype} width {width}: (differing batches, batches, kink hits) per seed {runs}",
                  file=sys.stderr, flush=True)
            rows.append(Row(dtype, width, inits, sum(d > 0 for d, _, _ in runs), sum(d for d, _, _ in runs),
                            sum(n for _, n, _ in runs), sum(h for _, _, h in runs)))
    return rows


def table(rows: list[Row]) -> str:
    out = ["| dtype | width | initialisations | bifurcated (share) | batches whose gradients differ | "
           "kink hits per epoch |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.dtype} | {r.width} | {r.inits} | {r.bifurcated} ({100 * r.share:.0f}%) | "
                   f"{r.differing_batches} of {r.batches} | {r.kink_hits / r.inits:.1f} |")
    return "\n".join(out) + "\n"


def svg(rows: list[Row]) -> str:
    """Bars: the share of initialisations that bifurcate, per dtype (colour) and width (group)."""
    widths = sorted({r.width for r in rows})
    dtypes = [d for d in DTYPES if any(r.dtype == d for r in rows)]
    colours = {"float16": "#d62728", "float32": "#1f77b4", "float64": "#2ca02c"}
    bar, gap, h, left, top = 22, 30, 200, 50, 20
    group = bar * len(dtypes) + gap
    W = max(left + group * len(widths) + 20, 600)  # room for the legend and the caption
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h + 90}" font-family="sans-serif" '
             f'font-size="12">',
             f'<line x1="{left}" y1="{top + h}" x2="{W - 10}" y2="{top + h}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="black"/>']
    for tick in (0, 50, 100):
        y = top + h - h * tick / 100
        parts.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{tick}%</text>')
    for g, width in enumerate(widths):
        x0 = left + gap / 2 + g * group
        for k, dtype in enumerate(dtypes):
            r = next((r for r in rows if r.width == width and r.dtype == dtype), None)
            share = r.share if r else 0.0
            bh = max(h * share, 1)
            parts.append(f'<rect x="{x0 + k * bar}" y="{top + h - bh}" width="{bar - 2}" height="{bh}" '
                         f'fill="{colours[dtype]}"><title>{dtype}, width {width}: {100 * share:.0f}%</title></rect>')
        parts.append(f'<text x="{x0 + bar * len(dtypes) / 2}" y="{top + h + 16}" text-anchor="middle">width {width}</text>')
    for k, dtype in enumerate(dtypes):
        parts.append(f'<rect x="{left + k * 90}" y="{top + h + 34}" width="12" height="12" fill="{colours[dtype]}"/>'
                     f'<text x="{left + k * 90 + 16}" y="{top + h + 45}">{dtype}</text>')
    parts.append(f'<text x="{left}" y="{top + h + 75}">share of initialisations whose first epoch meets a '
                 f'batch where relu\'(0)=0 and =1 differ</text>')
    return "\n".join(parts + ["</svg>"]) + "\n"


def main(argv=None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    ap.add_argument("--inits", type=int, default=20)
    ap.add_argument("--samples", type=int, default=1797)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = measure(args.widths, args.dtypes, args.inits, args.samples, args.batch)
    print(table(rows), end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bertoin_digits.md").write_text(table(rows))
        (args.out / "bertoin_digits.svg").write_text(svg(rows))
    return rows


if __name__ == "__main__":
    main()
