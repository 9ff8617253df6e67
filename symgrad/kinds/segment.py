"""Segment and scatter max/min: windows given by an index.  Output j is the max (or min) of the
elements whose index is j (a segment), in index order, after the segment's initial element where
it takes part (scatter_max's ``input[j]`` with ``include_self``).  The segments never overlap and
their sizes are known only at run time, so the rule is derived on a representative window, as the
reductions' is, and lowered to a window kernel of the form "segments" (lower.WINDOW_FORMS)."""

from __future__ import annotations

import numpy as np

from .base import Kind, representative

# how each framework preset counts a split segment's ties and forms the weight, where it differs
# from the W-row (lower.SegmentRule reads it by the op's convention; plain policies: neither)
#   count_initial: the initial element's hit (initial == output) is counted even where it does not
#     take part: PyTorch's scatter_reduce with include_self=False counts `self == result` among the
#     ties (the tie bug: s=[3, 5], src=[3, 1], index=[0, 0] gives src[0] 0.5, not 1); JAX's
#     segment_max counts its -inf fill (a segment whose max is -inf: 1/(k+1) to each of k hits)
#   reciprocal: the weight is g * (1 / count) (JAX's scatter-max JVP), not g / count (PyTorch)
FRAMEWORK_RULES = {
    "torch": {"count_initial": True, "reciprocal": False, "nan_last": True},
    "jax": {"count_initial": True, "reciprocal": True},
}
# torch_scatter's CPU max (the pyg preset, NaN rule 'keep' from its start): each segment's scan
# starts at the dtype's lowest finite value (max; min: its largest), which an element must beat
# strictly (so NaN, -inf and lowest never win); a segment no element beats is 0 (segment_max_csr:
# 0 where empty, else that start) and sends no gradient
FRAMEWORK_RULES["pyg"] = {"beats_start": True}

SEGMENT_WINDOWS = (
    "segment j holds the elements whose index is j, in index order (row-major along dim), after "
    "the initial element where it takes part; segments never overlap and their sizes are known "
    "only at run time")


def _settings(name: str, ties: str, nan: str) -> None:
    if ties in ("first", "last") and nan not in ("dominate", "keep"):  # keep: the pyg preset's
        raise ValueError(f"{name}: with ties={ties!r} a segment follows NaN rule 'dominate': nan "
                         f"must be 'dominate', not {nan!r}")


def _describe(op: "Op", listed: int) -> list[str]:
    lines = [f"windows: {SEGMENT_WINDOWS}; derived on a representative segment of "
             f"{op.window_size()} elements (the rule is the same for every length)"]
    if "include_self" in op.params:
        lines.append("initial element: input[j] "
                     + ("takes part in segment j (include_self=True), first in its order"
                        if op.params["include_self"] else
                        "takes no part (include_self=False); an empty segment keeps it: output "
                        "input[j], its gradient g[j]"))
    else:
        lines.append(f"empty segment: {'-inf' if op.spec.extremum == 'max' else '+inf'} (the op's "
                     f"identity, as jax.ops.segment_{op.spec.extremum}), no gradient")
    return lines


def _backward(op: "Op") -> list[str]:
    return ["", "== backward ==",
            "  grad_src[e] = w_k(e) * grad_output[index[e]]  (gather form: each element reads its "
            "segment's winner or count; no scatter-add, deterministic)"]


def _docs_windows(op: "Op") -> str:
    return (f"Each output is the {op.spec.extremum} of one segment: {SEGMENT_WINDOWS}. The rule "
            f"is shown on a representative segment of {op.window_size()} elements and is the same "
            f"for every length.")


EXAMPLE_SEGMENTS = 3  # the worked example's outputs (segment_max: num_segments where given)


def _example_index(segments: int) -> np.ndarray:
    """The worked example's index: segment 0 of three elements, the others of one or two."""
    if segments >= 3:
        return np.array([0, 1, 0, 2, 0] + list(range(3, segments)))
    return np.arange(5) % max(segments, 1)


class FixedIndex:
    """A segment module with its index fixed (_example_index): the worked example's inputs are its
    float inputs (scatter: input, src; segment: data), the index shown beside them (ids: the
    segment of each element; CSR: the index is indptr, ids sorted)."""

    def __init__(self, mod):
        self.mod = mod
        self.scatter = len(mod.INPUTS) == 3
        self.names = (mod.INPUTS[0], mod.INPUTS[2]) if self.scatter else mod.INPUTS[:1]
        self.segments = mod.PARAMS.get("num_segments") or EXAMPLE_SEGMENTS
        self.ids = self.index = _example_index(self.segments)
        if "indptr" in mod.INPUTS:  # CSR offsets: the same segments, their elements in order
            self.ids = np.sort(self.ids)
            self.index = np.searchsorted(self.ids, np.arange(self.segments + 1))

    def constants(self, x) -> tuple:
        return ((self.mod.INPUTS[1], self.index),)

    def forward(self, *xs):
        if self.scatter:
            return self.mod.forward(xs[0], self.index, xs[1])
        return self.mod.forward(xs[0], self.index)

    def backward(self, g, saved):
        grads = self.mod.backward(g, saved)
        return (grads[0], grads[2]) if self.scatter else grads[:1]


def _example(op: "Op", mod):
    """Segments of the fixed index over 1-d inputs (scatter: input[j] first where it takes part),
    each listed in segment order and padded with None to the longest; a row per input."""
    m, index = mod.segments, mod.ids
    src = 1 if mod.scatter else 0
    windows = []
    for j in range(m):
        members = [(src, (int(e),)) for e in np.flatnonzero(index == j)]
        if mod.scatter and (op.params["include_self"] or not members):
            members = [(0, (j,))] + members
        windows.append(members)
    longest = max(len(w) for w in windows)
    windows = [w + [None] * (longest - len(w)) for w in windows]
    shapes = [(m,), (index.size,)] if mod.scatter else [(index.size,)]
    return (shapes, windows, (lambda e: (0, e[0], e[1][0])), (lambda o: (0, 0, o[0])), {}, (m,))


SEGMENT = Kind("segment", lowering="segment", windows="segments", runtime_windows=True, disjoint=True,
               window_size=representative, settings=_settings, describe=_describe,
               backward=_backward, docs_windows=_docs_windows, example=_example,
               example_module=FixedIndex,
               windows_doc=f"Segments: {SEGMENT_WINDOWS}.",
               representative_note=(
                   "segments are given by an index known only at run time: the rule is derived on "
                   "a representative segment of {n} elements and holds for every segment length"))
