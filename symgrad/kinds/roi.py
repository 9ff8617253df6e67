"""RoI max pooling (roi_max_pool, torchvision.ops.roi_pool(input, boxes, output_size,
spatial_scale)): windows given by boxes.  Box k = (batch index, x1, y1, x2, y2) is scaled by
spatial_scale and rounded (half away from zero), at least 1x1, and cut into output_size bins; bin
(ph, pw) spans rows floor(ph * roi_h / PH) to ceil((ph + 1) * roi_h / PH) of the box (columns
alike), clipped to the input, its elements in row-major order.  Bins may overlap (within a box and
across boxes); output[k, c, ph, pw] is the max over its bin of plane (batch index, c), an empty bin
is 0 with no gradient.  A bin is a bag of the input's (N*H*W, C) rows (kinds/bag.py): the same
module, its layout from the boxes."""

from __future__ import annotations

import numpy as np

from .bag import FLOORS, LAYOUTS, _settings
from .base import Kind, representative

ROI_WINDOWS = (
    "bin (ph, pw) of box k holds the input elements of plane (batch index, c) in rows "
    "floor(ph * roi_h / PH) .. ceil((ph + 1) * roi_h / PH) - 1 of the box scaled by spatial_scale "
    "and rounded (columns alike), clipped to the input, in row-major order; bins may overlap, an "
    "empty bin is 0 with no gradient")

LAYOUTS["roi_max_pool"] = {"partial": "roi", "forward_doc": "each box's bins' max over its plane, "
                           "0 where a bin is empty", "integers": ()}
# torchvision's CPU kernel starts each bin's running max at -FLT_MAX (float32's largest negative)
FLOORS["roi_max_pool"] = {"torch": repr(float(np.finfo(np.float32).min))}

# the worked example: one box over a 4x4 plane (its bins overlap where the box's size is not a
# multiple of output_size)
EXAMPLE_SIZE, EXAMPLE_BOXES = 4, np.array([[0.0, 0.0, 0.0, 3.0, 3.0]])


def _describe(op: "Op", listed: int) -> list[str]:
    return [f"windows: {ROI_WINDOWS}; derived on a representative bin of {op.window_size()} "
            f"elements (the rule is the same for every size)"]


def _backward(op: "Op") -> list[str]:
    return ["", "== backward ==",
            "  grad_input[e] = sum over the bins b holding e of w_k(e) * grad_output[b]  (a gather "
            "per bin element, added onto the input in bin order: np.add.at, no atomics)"]


def _docs_windows(op: "Op") -> str:
    return (f"Each output is the max of one bin: {ROI_WINDOWS}. The rule is shown on a "
            f"representative bin of {op.window_size()} elements and is the same for every size.")


class FixedBoxes:
    """A roi_max_pool module with its boxes fixed (EXAMPLE_BOXES): the worked example's input is
    one (1, 1, 4, 4) plane, the boxes shown beside it."""

    names = ("input",)

    def __init__(self, mod):
        self.mod = mod

    def constants(self, x) -> tuple:
        return (("boxes", EXAMPLE_BOXES),)

    def forward(self, x):
        return self.mod.forward(x, EXAMPLE_BOXES.astype(x.dtype))

    def backward(self, g, saved):
        return self.mod.backward(g, saved)[:1]


def _example(op: "Op", mod):
    """The example's bins, read from the module's saved rows and bins, padded with None."""
    shape = (1, 1, EXAMPLE_SIZE, EXAMPLE_SIZE)
    _, saved = mod.forward(np.zeros(shape))
    bins = int(np.prod(op.params["output_size"]))
    windows = [[(0, (0, 0) + divmod(int(r), EXAMPLE_SIZE)) for r in saved.rows[saved.bag == b]]
               for b in range(bins)]
    longest = max(len(w) for w in windows)
    windows = [w + [None] * (longest - len(w)) for w in windows]
    return ([shape], windows, (lambda e: (0, e[1][2], e[1][3])), (lambda o: (0, o[2], o[3])), {},
            (1, 1) + tuple(op.params["output_size"]))


ROI = Kind("roi", lowering="bag", windows="bags", runtime_windows=True, overlaps=True,
           window_size=representative, settings=_settings, describe=_describe, backward=_backward,
           docs_windows=_docs_windows, example=_example, example_module=FixedBoxes,
           windows_doc=f"Bins: {ROI_WINDOWS}.",
           representative_note=(
               "bins are given by boxes known only at run time: the rule is derived on a "
               "representative bin of {n} elements and holds for every bin size"))
