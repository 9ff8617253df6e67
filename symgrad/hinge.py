"""F.hinge_embedding_loss and F.multi_margin_loss (p=1) (issue 30): compositions at the host level
of a derived elementwise module, as aminmax.py composes amin and amax.

Both losses select by the target's value, an integer or a +-1 label, never a number the gradient
flows through, so in the W-matrix view the target's comparisons are indicators with no tie (the
target gets no gradient) and the one kink is a hinge max(0, v) of the input:

* ``hinge_embedding_loss(input, target, margin=1.0)``: PyTorch's (aten) arithmetic
  ``where(target != 1, clamp_min(margin - input, 0), 0) + where(target != -1, input, 0)``, i.e.
  ``[t != 1] max(0, margin - x) + [t != -1] x``.  The hinge max(0, margin - x) is
  ``margin_ranking_loss(input, 0, 1; margin)`` (max(0, margin - 1 * (x - 0)), the same value and
  gradient bit for bit under each preset): its generated module, loaded with the caller's
  backend, policy, NaN rule and convention, computes the kink; the selection and the sum are
  NumPy.  backward(grad_output, saved) returns (grad_input, None): the target has no gradient.
* ``multi_margin_loss(input, target, p=1, margin=1.0, weight=None)``: a row op, input (N, C) or
  (C,), target the class index per row: per row (1/C) sum_{i != y} w[y] max(0, z_i), z_i =
  (margin - x[y]) + x[i].  The kink max(0, z) is relu's generated module (a row kind does not
  exist): its weight k(z) (its backward of ones) picks the hinges that are active, and the rest -
  the row sums, the target column's gradient, the reduction - is NumPy in the framework's order
  (multi_margin.py).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from . import losses as _losses

OPS = ("hinge_embedding_loss", "multi_margin_loss")
PARAMS = {"hinge_embedding_loss": ("margin", "reduction"),
          "multi_margin_loss": ("p", "margin", "weight", "reduction")}
KINKS = {"hinge_embedding_loss": "margin_ranking_loss", "multi_margin_loss": "relu"}
FILES = {"hinge_embedding_loss": "hinge.py", "multi_margin_loss": "multi_margin.py"}
HOST_BACKENDS = ("numpy", "cpu")  # the backends whose modules take and return NumPy arrays
NOT_A_MODULE = ("{op} is composed at the host level (symgrad/{file}) of {kink}'s generated "
                "module, loaded only: symgrad.load({op!r}, ...); derive, generate or check {kink!r}")


def not_a_module(op: str) -> str:
    """The one line that derive/generate of a composed loss raise."""
    return NOT_A_MODULE.format(op=op, kink=KINKS[op], file=FILES[op])


def _check_margin(op: str, margin: object) -> float:
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real):
        raise TypeError(f"{op}: margin must be a real number, got {margin!r}")
    return float(margin)


@dataclass(frozen=True)
class HingeSaved:
    """What hinge_embedding_loss's backward and jvp read (output_shape and dtype, as
    losses.Reduced reads them)."""

    kink: object  # the margin_ranking_loss module's Saved
    margin_term: np.ndarray  # target != 1
    input_term: np.ndarray  # target != -1
    output_shape: tuple
    dtype: np.dtype


class HingeEmbedding:
    """F.hinge_embedding_loss(input, target, margin) with reduction='none' (see the module)."""

    OP = "hinge_embedding_loss"
    INPUTS = ("input", "target")

    def __init__(self, kink):
        self.kink = kink
        self.__name__ = f"hinge_embedding_loss of {kink.__name__}"  # (losses.Reduced names it)
        self.__doc__ = (f"hinge_embedding_loss as where(target != 1, {kink.__name__}(input, 0, 1), 0) "
                        f"+ where(target != -1, input, 0) (symgrad.hinge).")

    def __repr__(self) -> str:
        return f"<symgrad {self.__name__}>"

    def forward(self, input, target):
        """Return (the elementwise loss; saved)."""
        x = np.asarray(input)
        t = np.asarray(target)
        if t.dtype.kind not in "biuf" and t.dtype.name != "bfloat16":
            raise TypeError(f"hinge_embedding_loss: target must be a real array, got {t.dtype}")
        try:
            t = np.broadcast_to(t, x.shape)
        except ValueError:
            raise ValueError(f"hinge_embedding_loss: target's shape {t.shape} does not broadcast "
                             f"to input's {x.shape}") from None
        zero = np.zeros_like(x)
        v, kink = self.kink.forward(x, zero, np.ones_like(x))
        margin_term, input_term = t != 1, t != -1
        with np.errstate(invalid="ignore"):  # (+inf + -inf: NaN, as the frameworks)
            y = np.where(margin_term, v, zero) + np.where(input_term, x, zero)
        return y, HingeSaved(kink, margin_term, input_term, x.shape, x.dtype)

    def backward(self, grad_output, saved):
        """(grad_input, None): where(target != -1, g, 0) plus the hinge's backward of
        where(target != 1, g, 0), added as autograd adds them."""
        saved = _saved(saved)
        g = np.asarray(grad_output)
        zero = np.zeros(saved.output_shape, saved.dtype)
        grad = self.kink.backward(np.where(saved.margin_term, g, zero), saved.kink)[0]
        with np.errstate(invalid="ignore"):
            return np.where(saved.input_term, g, zero).astype(saved.dtype) + grad, None

    def jvp(self, tangent_input, tangent_target, saved):
        """The loss's tangent for the input's tangent (the target's, having no derivative, is
        ignored; None: a zero tangent)."""
        saved = _saved(saved)
        zero = np.zeros(saved.output_shape, saved.dtype)
        t = zero if tangent_input is None else np.asarray(tangent_input)
        hinge = self.kink.jvp(t, None, None, saved.kink)
        with np.errstate(invalid="ignore"):
            return np.where(saved.margin_term, hinge, zero) + np.where(saved.input_term, t, zero)


def _saved(saved) -> HingeSaved:
    if not isinstance(saved, HingeSaved):
        raise TypeError(f"hinge_embedding_loss: saved must be the Saved value that this module's "
                        f"forward returned, got {type(saved).__name__}")
    return saved


def load(load_op, op: str, settings: dict, params: dict):
    """The composed loss for symgrad.load(op, **settings, **params) (load_op: symgrad.load)."""
    wrong = set(params) - set(PARAMS[op])
    if wrong:
        from .api import SETTINGS
        from .suggest import unexpected
        raise unexpected(op, "parameter", wrong, list(PARAMS[op] + SETTINGS))
    if settings.get("backend") not in HOST_BACKENDS:  # (the selection and sums are NumPy's)
        raise ValueError(f"{op}: composed with NumPy on the host (symgrad/{FILES[op]}), it runs on "
                         f"the backends {' and '.join(HOST_BACKENDS)}, got backend="
                         f"{settings.get('backend')!r}")
    reduction = _losses.check_reduction(op, params.get("reduction", "none"))
    margin = _check_margin(op, params.get("margin", 1.0))
    if op == "multi_margin_loss":
        from .multi_margin import load as load_multi_margin
        return load_multi_margin(load_op, settings, params, margin, reduction)
    module = HingeEmbedding(load_op("margin_ranking_loss", **settings, margin=margin))
    if reduction == "none":
        return module
    return _losses.Reduced(module, reduction, torch_order=settings.get("convention") == "torch")
