"""Bags: windows given by offsets into a list of table rows (embedding_bag_max, PyTorch's
F.embedding_bag(input, weight, offsets, mode="max")).  Bag b holds the table rows input[i] for i
in [offsets[b], offsets[b + 1]) (a 2-d input: its row b), padding_idx's rows left out; output[b, f]
is the max of weight[input[i], f] over the bag, in index order, and an empty bag gives 0 with no
gradient.  A bag is a segment whose elements are gathered table rows: the rule is derived on a
representative bag, as the segments' is (lower.WINDOW_FORMS "bags"); the gradient of each gathered
row goes back to its table row, the rows' terms added in index order (bag order)."""

from __future__ import annotations

import numpy as np

from .base import Kind, representative

# whether a framework preset's split counts the fill among a bag's ties (lower.SegmentRule's
# count_initial): JAX's segment_max counts its -inf fill where a bag's max is -inf; PyTorch's
# embedding_bag has no split
FRAMEWORK_COUNTS = {"jax": True}

# each bag op's layout (the NumPy module's partial _<partial>_layout: its table, rows and bags
# from the op's inputs), what its forward computes, and its integer inputs
LAYOUTS = {"embedding_bag_max": {"partial": "bag", "forward_doc": "each bag's max of its table rows, 0 where empty",
                                 "integers": ("input", "offsets")}}
# where a framework's running max starts, by op and preset (C source; None: at the first element)
FLOORS: dict = {}

BAG_WINDOWS = (
    "bag b holds the table rows weight[input[i]] for i in [offsets[b], offsets[b + 1]) (a 2-d "
    "input: its row b), in index order, padding_idx's rows left out; bags never overlap, but a "
    "table row may sit in several bags (its gradient adds their terms, in index order)")

# the NaN rules a bag admits by tie policy: a scan reads NaN as symgrad does ('dominate') or as
# PyTorch's CPU kernel (at::_embedding_bag's max path: a later row takes over on a strict >, so a
# NaN never takes over and a NaN that comes first keeps the bag: 'keep', whose output is the
# winner's value, not a NaN-propagating fold); a mask as the segments'
BAG_NAN_RULES = {"first": ("dominate", "keep"), "last": ("dominate", "keep"),
                 "split": ("dominate", "zero", "nan", "each"), "all": ("dominate", "zero")}


def _settings(name: str, ties: str, nan: str) -> None:
    allowed = BAG_NAN_RULES[ties]
    if nan not in allowed:
        raise ValueError(f"{name}: with ties={ties!r} nan must be "
                         f"{' or '.join(repr(a) for a in allowed)}, not {nan!r}")


def _describe(op: "Op", listed: int) -> list[str]:
    return [f"windows: {BAG_WINDOWS}; derived on a representative bag of {op.window_size()} "
            f"elements (the rule is the same for every length)",
            "empty bag: output 0, no gradient (PyTorch's)"]


def _backward(op: "Op") -> list[str]:
    return ["", "== backward ==",
            "  grad_row[i] = w_k(i) * grad_output[bag(i)]  (gather form: each gathered row reads "
            "its bag's winner or count)",
            "  grad_weight[r] = sum over i with input[i] == r of grad_row[i]  (in index order; "
            "np.add.at, no atomics)"]


def _docs_windows(op: "Op") -> str:
    return (f"Each output row is the max of one bag: {BAG_WINDOWS}. The rule is shown on a "
            f"representative bag of {op.window_size()} elements and is the same for every length.")


# the worked example's bags: input rows [2, 0, 4 | 1, 3] of a (5, 1) table (each row in one bag)
EXAMPLE_INPUT, EXAMPLE_OFFSETS = np.array([2, 0, 4, 1, 3]), np.array([0, 3])


class FixedBags:
    """A bag module with its input and offsets fixed (EXAMPLE_INPUT, EXAMPLE_OFFSETS): the worked
    example's one float input is the table, the index lists shown beside it."""

    names = ("weight",)

    def __init__(self, mod):
        self.mod = mod

    def constants(self, weight) -> tuple:
        return (("input", EXAMPLE_INPUT), ("offsets", EXAMPLE_OFFSETS))

    def forward(self, weight):
        return self.mod.forward(EXAMPLE_INPUT, weight, EXAMPLE_OFFSETS)

    def backward(self, g, saved):
        return self.mod.backward(g, saved)[1:2]


def _example(op: "Op", mod):
    """The fixed bags over a (5, 1) table, each listed in index order, padded with None to the
    longest; the table's rows in a line."""
    ends = list(EXAMPLE_OFFSETS[1:]) + [EXAMPLE_INPUT.size]
    windows = [[(0, (int(EXAMPLE_INPUT[i]), 0)) for i in range(s, e)]
               for s, e in zip(EXAMPLE_OFFSETS, ends)]
    longest = max(len(w) for w in windows)
    windows = [w + [None] * (longest - len(w)) for w in windows]
    return ([(EXAMPLE_INPUT.size, 1)], windows, (lambda e: (0, 0, e[1][0])), (lambda o: (0, 0, o[0])), {},
            (len(windows), 1))


BAG = Kind("bag", lowering="bag", windows="bags", runtime_windows=True, overlaps=True,
           window_size=representative, settings=_settings, describe=_describe, backward=_backward,
           docs_windows=_docs_windows, example=_example, example_module=FixedBags, windows_doc=f"Bags: {BAG_WINDOWS}.",
           representative_note=(
               "bags are given by offsets known only at run time: the rule is derived on a "
               "representative bag of {n} elements and holds for every bag length"))
