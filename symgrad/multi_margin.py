"""F.multi_margin_loss with p=1 (issue 30), composed at the host level (see hinge.py).

Per row of input (N, C) (or the one row of a (C,) input) with target class y:

    loss = (1/C) sum_{i != y} w[y] max(0, z_i),   z_i = (margin - x[y]) + x[i]

In the W-matrix view each hinge max(0, z_i) is a max node with pieces (0, z_i); the target's
index only selects (no tie, no gradient).  relu's generated module, loaded with the policy and NaN
rule, gives each hinge's weight k(z_i) (its backward of ones): k = 1 where z > 0, 0 where z < 0,
the policy's value at z = 0.  The rest is linear and written here in the framework's order:

* torch (the default arithmetic, and the torch preset: relu with 'first' and NaN rule 'keep', as
  aten's CPU kernel tests ``z > 0``: 0 at the kink, a NaN hinge skipped): the row's active hinges
  (k != 0) added one at a time into +0 in the dtype, times w[y], divided by C; 'mean'/'sum' add the
  rows in float64 (at::acc_type; PyTorch's CPU kernel takes float32 and float64 only), 'mean'
  divides by N.  Backward: each active hinge's input gets h = (k * c) * w[y], c = 1/C (1/(N C)
  for 'mean') rounded to the dtype, the target column 0 - h_0 - h_1 - ... in order, then every
  entry times grad_output (the row's for 'none');
* jax (the jax preset: relu with 'split' and NaN rule 'zero', as jnp.maximum): JAX has no multi
  margin loss (optax neither); this is what a JAX user writes::

      z = jnp.maximum(0, margin - jnp.take_along_axis(x, y[:, None], 1) + x)   # times w[y][:, None]
      loss = jnp.sum(jnp.where(jnp.arange(C) == y[:, None], 0, z), axis=-1) / C  # jnp.mean/jnp.sum

  with its autodiff: each hinge's input gets (g / C) * k (times w[y]), the target column that
  hinge's cotangent plus minus the row's sum of them.  XLA's summation order may differ from
  NumPy's in the last bits of a sum that is not exact.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

OP = "multi_margin_loss"
# the kink max(0, z) under each preset: (ties, nan) of relu's module
PRESETS = {"torch": ("first", "keep"), "jax": ("split", "zero")}


def _float(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16"


def _accumulating(dtype: np.dtype, framework: str) -> np.dtype:
    """torch: at::acc_type on the CPU (double for float and double); jax: float32 for the
    16-bit floats, else the dtype."""
    if framework == "torch":
        return np.dtype(np.float64) if np.dtype(dtype).itemsize >= 4 else np.dtype(np.float32)
    return np.dtype(np.float32) if np.dtype(dtype).itemsize < 4 else np.dtype(dtype)


@dataclass(frozen=True)
class MarginSaved:
    x: np.ndarray  # (N, C)
    y: np.ndarray  # (N,)
    k: np.ndarray  # each hinge's weight, 0 in the target column
    weight: np.ndarray | None  # w[y] per row, (N, 1)
    input_shape: tuple
    output_shape: tuple
    dtype: np.dtype


class MultiMargin:
    """F.multi_margin_loss(input, target, p=1, margin, weight, reduction) (see the module)."""

    OP = OP
    INPUTS = ("input", "target")
    INDEX_INPUTS = ("target",)  # integer class indices (symgrad conventions' rows read this)

    def __init__(self, kink, margin: float, weight, reduction: str, framework: str):
        self.kink, self.margin, self.weight = kink, margin, weight
        self.reduction, self.framework = reduction, framework
        self.TIES = kink.TIES
        self.__name__ = f"multi_margin_loss of {kink.__name__}"
        self.__doc__ = (f"multi_margin_loss (p=1, margin={margin}, reduction={reduction!r}, "
                        f"{framework}'s arithmetic) of {kink.__name__} (symgrad.multi_margin).")

    def __repr__(self) -> str:
        return f"<symgrad {self.__name__} reduction={self.reduction!r}>"

    def _rows(self, input, target):
        x, y = np.asarray(input), np.asarray(target)
        check_shapes((_float(x.dtype), x.dtype, x.shape), (y.dtype.kind in "iu", y.dtype, y.shape),
                     None if self.weight is None else self.weight.shape)
        C = x.shape[-1]
        if y.size and (y.min() < 0 or y.max() >= C):
            raise ValueError(f"{OP}: target out of range: every class must be in [0, {C}), got "
                             f"{y.min() if y.min() < 0 else y.max()}")
        return x.reshape(-1, C), y.reshape(-1).astype(np.int64)

    def forward(self, input, target):
        """Return (the loss: per row for reduction='none', else 0-d; saved)."""
        x, y = self._rows(input, target)
        dtype, (n, C) = x.dtype, x.shape
        with np.errstate(invalid="ignore", over="ignore"):
            z = (dtype.type(self.margin) - np.take_along_axis(x, y[:, None], 1)) + x
            m, kink = self.kink.forward(z)
            k = self.kink.backward(np.ones_like(z), kink)[0]
            k[np.arange(n), y] = 0
            w = None if self.weight is None else self.weight.astype(dtype)[y][:, None]
            rows = (self._torch_rows if self.framework == "torch" else self._jax_rows)(z, m, k, w, y)
        shape = (n,) if np.ndim(input) == 2 else ()
        saved = MarginSaved(x, y, k, w, np.shape(input), shape, dtype)
        if self.reduction == "none":
            return rows.reshape(shape), saved
        return self._reduce(rows), saved

    def _torch_rows(self, z, m, k, w, y):
        term = np.where(k != 0, z if w is None else z * w, z.dtype.type(0))
        total = np.zeros(z.shape[0], z.dtype)
        for column in term.T:  # one at a time into +0, as aten's loop
            total = total + column
        return total / z.dtype.type(z.shape[1])

    def _jax_rows(self, z, m, k, w, y):
        term = m if w is None else w * m
        term = np.where(np.arange(z.shape[1]) == y[:, None], z.dtype.type(0), term)
        acc = _accumulating(z.dtype, "jax")
        return np.sum(term, axis=1, dtype=acc).astype(z.dtype) / z.dtype.type(z.shape[1])

    def _reduce(self, rows):
        acc = _accumulating(rows.dtype, self.framework)
        with np.errstate(invalid="ignore", divide="ignore"):
            if self.framework == "torch":
                total = acc.type(0)
                for r in rows.astype(acc):
                    total = total + r
            else:
                total = np.sum(rows, dtype=acc)
            if self.reduction == "mean":
                total = acc.type(total) / acc.type(rows.size)
        return np.asarray(total, acc).astype(rows.dtype)

    def backward(self, grad_output, saved):
        """(grad_input, None): the target only selects."""
        if not isinstance(saved, MarginSaved):
            raise TypeError(f"{OP}: saved must be the Saved value that this module's forward "
                            f"returned, got {type(saved).__name__}")
        shape = saved.output_shape if self.reduction == "none" else ()
        g = np.asarray(grad_output)
        if g.shape != shape or not _float(g.dtype):
            raise ValueError(f"{OP}: grad_output must be a float array of the output's shape {shape}, "
                             f"got {g.dtype} with shape {g.shape}")
        g = g.astype(saved.dtype).reshape(-1, 1) if shape else g.astype(saved.dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            grad = (self._torch_backward if self.framework == "torch" else self._jax_backward)(g, saved)
        return grad.reshape(saved.input_shape), None

    def _torch_backward(self, g, s):
        n, C = s.x.shape
        dtype = s.dtype
        c = dtype.type(1.0 / (n * C) if self.reduction == "mean" else 1.0 / C)
        h = np.where(s.k != 0, s.k * c, dtype.type(0))
        if s.weight is not None:
            h = np.where(s.k != 0, h * s.weight, dtype.type(0))
        target = np.zeros(n, dtype)
        for column in h.T:  # 0 - h_0 - h_1 - ..., as aten's loop (the target column's h is +0)
            target = target - column
        h[np.arange(n), s.y] = target
        return h * g

    def _jax_backward(self, g, s):
        n, C = s.x.shape
        dtype = s.dtype
        if self.reduction == "mean":  # jnp.mean's transpose: g / N in at least float32
            acc = _accumulating(dtype, "jax")
            g = (acc.type(g) / acc.type(n)).astype(dtype)
        ct = np.broadcast_to(g / dtype.type(C), s.x.shape)
        ct = np.where(np.arange(C) == s.y[:, None], dtype.type(0), ct)
        if s.weight is not None:
            ct = ct * s.weight
        ct = ct * s.k
        # take_along_axis's transpose: minus the row's sum scattered into zeros at y, added to
        # the hinges' cotangents (so a -0 cotangent becomes +0, as JAX's add_any computes it)
        scattered = np.zeros_like(ct)
        row_sum = np.sum(ct, axis=1, dtype=_accumulating(dtype, "jax")).astype(dtype)
        scattered[np.arange(n), s.y] += -row_sum  # (a scatter-add into +0: -0 becomes +0)
        return ct + scattered

    def jvp(self, tangent_input, tangent_target, saved):
        """The loss's tangent: backward's gradient for each output, dotted with the tangent
        (a row's loss depends on that row only)."""
        if not isinstance(saved, MarginSaved):
            raise TypeError(f"{OP}: saved must be the Saved value that this module's forward "
                            f"returned, got {type(saved).__name__}")
        n, C = saved.x.shape
        t = np.zeros((n, C), saved.dtype) if tangent_input is None else np.asarray(tangent_input).reshape(n, C)
        ones = np.ones(saved.output_shape if self.reduction == "none" else (), saved.dtype)
        grad = self.backward(ones, saved)[0].reshape(n, C)
        out = np.sum(grad * t, axis=1)
        if self.reduction == "none":
            return out.reshape(saved.output_shape)
        return np.sum(out).astype(saved.dtype)


def check_shapes(input: tuple, target: tuple, weight_shape) -> None:
    """One-line ValueErrors for input (is float, dtype, shape) not (N, C) or (C,), target (is
    integer, dtype, shape) not one class per row, a weight's shape not (C,)."""
    (is_float, dtype, shape), (is_int, y_dtype, y_shape) = input, target
    shape, y_shape = tuple(shape), tuple(y_shape)
    if not is_float or len(shape) not in (1, 2) or shape[-1] == 0:
        raise ValueError(f"{OP}: input must be a float array of shape (N, C) or (C,) with C >= 1, "
                         f"got {dtype} with shape {shape}")
    if not is_int or (y_shape != shape[:1] if len(shape) == 2 else y_shape not in ((), (1,))):
        raise ValueError(f"{OP}: target must be an integer array of the class per row, shape "
                         f"{shape[:1] if len(shape) == 2 else '()'}, got {y_dtype} with shape {y_shape}")
    if weight_shape is not None and tuple(weight_shape) != shape[-1:]:
        raise ValueError(f"{OP}: weight must hold one value per class ({shape[-1]}), got shape "
                         f"{tuple(weight_shape)}")


def _check_weight(weight):
    if weight is None:
        return None
    w = np.asarray(weight)
    if w.ndim != 1 or not (_float(w.dtype) or w.dtype.kind in "iu"):
        raise ValueError(f"{OP}: weight must be None or a 1-d array of one real weight per class, "
                         f"got {w.dtype} with shape {w.shape}")
    return w.astype(np.float64) if w.dtype.kind in "iu" else w


def check_p(p) -> int:
    """p as F.multi_margin_loss takes it here: the int 1, or a one-line TypeError/ValueError."""
    if isinstance(p, bool) or not isinstance(p, numbers.Integral):
        raise TypeError(f"{OP}: p must be the int 1, got {p!r}")
    if p != 1:
        raise ValueError(f"{OP}: p must be 1 (the hinge; p=2 squares it, which symgrad does not "
                         f"implement), got {p}")
    return 1


def kink_settings(settings: dict) -> dict:
    """relu's ties, nan and order for the hinge max(0, z): the preset's (or the given) ones."""
    convention = settings.get("convention")
    if convention not in (None, *PRESETS):
        raise ValueError(f"{OP}: convention must be one of {', '.join(PRESETS)} (or None), got "
                         f"{convention!r}")
    ties, nan = PRESETS.get(convention, (None, None))
    return dict(ties=settings.get("ties") or ties, nan=settings.get("nan") or nan, order=settings.get("order"))


def load(load_op, settings: dict, params: dict, margin: float, reduction: str) -> MultiMargin:
    """MultiMargin over relu's module loaded with the preset's (or the given) policy and NaN rule."""
    check_p(params.get("p", 1))
    weight = _check_weight(params.get("weight"))
    kink = load_op("relu", backend=settings["backend"], **kink_settings(settings))
    return MultiMargin(kink, margin, weight, reduction, "jax" if settings.get("convention") == "jax" else "torch")
