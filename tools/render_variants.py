"""Render every variant of every op into a folder, one file per rendered file, to diff the
generated code before and after a change to the generator:

    python tools/render_variants.py OUT [--backend NAME ...]
    diff -r OUT_BEFORE OUT_AFTER

A variant is an op x parameter set x tie policy x NaN rule x argument order (elementwise) x
framework preset x backend; combinations an op refuses (resolve() raises) are skipped and
listed in OUT/refused.txt.  Folder per variant: <backend>/<op>/<settings>/<file name>.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from symgrad import backends, expr, policy
from symgrad.backends import common
from symgrad.ops import OPS, ORDERS, resolve
from symgrad.pipeline import render

PARAMS = {
    "clamp": [{"min": 0}, {"min": -1.0, "max": 1.0}, {"max": 2}],
    "hardtanh": [{}, {"min_val": -2, "max_val": 3.5}],
    "leaky_relu": [{}, {"negative_slope": 0.0}, {"negative_slope": 0.2}],
    "amax": [{}, {"dim": -1}, {"dim": (0, 2), "keepdim": True}, {"dim": 0}],
    "amin": [{}, {"dim": -1}, {"dim": (0, 2), "keepdim": True}],
    "logsumexp": [{}, {"dim": -1}, {"dim": 1, "keepdim": True, "temperature": 0.5}],
    "max_pool1d": [{"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2,
                                        "ceil_mode": True, "return_indices": True}],
    "max_pool2d": [{"kernel_size": 2}, {"kernel_size": 3, "stride": 1},
                   {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0), "dilation": (1, 2),
                    "ceil_mode": True, "return_indices": True}],
    "max_pool3d": [{"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1,
                                        "ceil_mode": True, "return_indices": True}],
    "max_unpool1d": [{"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1}],
    "max_unpool2d": [{"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1}],
    "max_unpool3d": [{"kernel_size": 2}],
    "adaptive_max_pool1d": [{"output_size": 3}, {"output_size": 4, "return_indices": True}],
    "adaptive_max_pool2d": [{"output_size": (3, 2)}, {"output_size": 5, "return_indices": True}],
    "adaptive_max_pool3d": [{"output_size": 2}],
    "fractional_max_pool2d": [{"kernel_size": 2, "output_size": (3, 3)},
                              {"kernel_size": (2, 3), "output_ratio": 0.5, "return_indices": True}],
    "fractional_max_pool3d": [{"kernel_size": 2, "output_size": 2}],
    "maxout": [{"pieces": 2}, {"pieces": 3}],
    "sort": [{}, {"descending": True, "dim": 0}],
    "topk": [{"k": 2}, {"k": 3, "largest": False, "dim": 0}],
    "cummax": [{"dim": -1}],
    "kthvalue": [{"k": 2}, {"k": 1, "dim": 0, "keepdim": True}],  # (issue 29, part 2)
    "median": [{}, {"dim": -1}, {"dim": 0, "keepdim": True}],
    "nanmedian": [{}, {"dim": -1, "keepdim": True}],
    "cummin": [{"dim": 0}],
}
EXPRESSIONS = ["Max(x*y, x + y, 0)", "max(x, 0) * exp(y) - min(x, y)", "abs(x) + Min(x, 1)"]


def settings(spec):
    yield {"convention": "torch"}
    yield {"convention": "jax"}
    orders = ORDERS if spec.strategy.elementwise else ("given",)
    for ties, nan, order in itertools.product(spec.policies or policy.TIES,
                                              spec.nan_rules or policy.NAN_RULES, orders):
        yield {"ties": ties, "nan": nan, "order": order}


def label(params: dict, setting: dict) -> str:
    parts = [f"{k}={v}" for k, v in {**params, **setting}.items()]
    return ",".join(parts).replace(" ", "").replace("(", "").replace(")", "") or "default"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--backend", action="append", choices=backends.NAMES)
    args = ap.parse_args(argv)
    names = args.backend or backends.NAMES
    # the header's generator hash covers every file of the package, so it changes with any edit:
    # the variants name a fixed one, so that a diff shows the code
    common.generator_hash = lambda: "(not hashed)"
    refused, count = [], 0
    jobs = []
    for name, spec in OPS.items():
        for params, setting in itertools.product(PARAMS.get(name, [{}]), list(settings(spec))):
            try:
                op = resolve(name, setting.get("ties"), nan=setting.get("nan"),
                             order=setting.get("order"), convention=setting.get("convention"),
                             **params)
            except (TypeError, ValueError) as exc:
                refused.append(f"{name} {label(params, setting)}: {exc}")
                continue
            jobs.append((name, label(params, setting), op))
    for i, text in enumerate(EXPRESSIONS):
        for ties, nan in itertools.product(policy.TIES, ("dominate", "nan")):
            setting = {"ties": ties, "nan": nan}
            try:
                op, _ = expr.make_op(text, f"expr{i}", None, None, ties, None, nan)
            except (TypeError, ValueError) as exc:
                refused.append(f"expr{i} {label({}, setting)}: {exc}")
                continue
            jobs.append((f"expr{i}", label({}, setting), op))
    for name, lab, op in jobs:
        for backend in names:
            try:
                files = render(op, backends.get(backend))
            except (TypeError, ValueError) as exc:
                refused.append(f"{backend} {name} {lab}: {type(exc).__name__}: {exc}")
                continue
            for fname, source in files.items():
                path = args.out / backend / name / lab / fname
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(source)
                count += 1
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "refused.txt").write_text("\n".join(refused) + "\n")
    print(f"{len(jobs)} variants, {count} files, {len(refused)} refused combinations -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
