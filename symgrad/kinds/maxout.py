"""Maxout: the extremum of each group of `pieces` consecutive channels (dim 1)."""

from __future__ import annotations

from .. import geometry
from .base import Kind, window_backward


def _example(op: "Op", mod):
    p = op.params["pieces"]
    windows = [[(0, (0, g * p + j)) for j in range(p)] for g in range(2)]
    return [(1, 2 * p)], windows, (lambda e: (0, 0, e[1][1])), (lambda o: (0, 0, o[1])), {}, (1, 2)


def _docs_windows(op: "Op") -> str:
    return (f"Each output is the max of a group of {op.params['pieces']} consecutive channels, "
            f"numbered in channel order.")


MAXOUT = Kind("maxout", windows="blocks", disjoint=True,
              window_size=lambda params: params["pieces"], static=True,
              window_param="pieces", backward=window_backward, docs_windows=_docs_windows,
              example=_example,
              axes=lambda params: geometry.MAXOUT)
