"""Max unpooling and logsumexp: not a max/min of pieces; each derives, lowers and documents by its
own rule (derive_special.py, lower.lower_special, docs_special.py)."""

from __future__ import annotations

from .. import policy as _policy
from .base import Kind, representative


def _unpool_backward(op: "Op") -> list[str]:
    return ["", "== backward ==",
            "  grad_input = W^T grad_output, a gather: grad_input[i] = grad_output.flat[indices[i]]"
            " per plane" + ("" if _policy.TIES[op.ties].winners == "each" else " for the element that stayed in its slot, 0 "
                                                        "for the others") + "; indices: None"]


def _logsumexp_backward(op: "Op") -> list[str]:
    return ["", "== backward ==", "  grad_x = grad_output * exp((x - y) / t) = grad_output * "
            "softmax(x / t); as t -> 0+ the split policy's W"]


# each output element receives at most the elements written to it
UNPOOL = Kind("unpool", special=True, scatter=True, derivation="special", lowering="scatter",
              window_size=lambda params: 1,
              backward=_unpool_backward)
LOGSUMEXP = Kind("logsumexp", special=True, derivation="special", lowering="logsumexp",
                 window_size=representative, backward=_logsumexp_backward)
