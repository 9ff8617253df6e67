"""Tools to study ties in training: how often each symgrad op meets a tie or a kink, and whether the
tie policy changes a batch's parameter gradients.

* ``TieCounter``, a context manager: while it is active every call of a symgrad op made by
  ``symgrad.torch`` (``op``, ``expr``, the nn modules) or ``symgrad.jax`` (``op``) is counted, per
  op and per step (``counter.step()`` starts the next): the calls, the output elements (the
  elements of an elementwise op, the windows of a pooling or reduction), those *at a tie* (an
  element at a kink, a window whose maximum is attained more than once) and those that are NaN
  (a window holding a NaN).
* ``policy(ties)``, a context manager: every symgrad op called inside it runs under tie policy
  ``ties`` instead of its own (the same op, parameters, NaN rule and convention otherwise).
* ``compare_torch`` / ``compare_jax``: one batch's backward under two policies (default relu'(0)
  = 0, ``first``, against 1, ``last``) and per parameter whether and how much the gradients differ.

An output element is *at a tie* where the policy decides its derivative: the jvp of the op under
``first`` and under ``last``, with one random tangent per input element, differ there (at a tie of
pieces or window elements the first and the last tied element differ, and random tangents tell
them apart; elsewhere both policies pick the same element).  That is the generated modules' own
jvp, so the count holds for every op whose module has the two policies, whatever its kind; ops
with no ``first``/``last`` (logsumexp: smooth) count their NaN outputs only.

Both context managers wrap the frameworks' op classes from outside (their ``__call__``), and
undo it on exit.  Counting runs the NumPy modules on a host copy of the op's inputs: it is not
free (see docs/study.md for the measured overhead), and ``every=N`` counts one call in N.  Under
``torch.compile`` calls are not counted.  In JAX the inputs reach the counter through
``jax.debug.callback``, so a function traced (jitted) while a counter is active counts its calls
into whichever counters are active when it runs; ``policy`` applies to functions traced inside it.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import numpy as np

from . import api

_ACTIVE: list = []  # the active TieCounters, innermost last
_POLICY: list = []  # the active policy overrides, innermost last
_LOCK = threading.Lock()
_PATCHED: dict = {}  # class -> its original __call__, while patched
_VARIANTS: dict = {}  # (op, params) -> its NumPy modules under first and last, or None


# ------------------------------------------------------------------------------ counting

@dataclass
class Counts:
    """One op's counts in one step."""
    calls: int = 0
    outputs: int = 0  # output elements: the elements of an elementwise op, the windows of a window op
    at_tie: int = 0  # of them, where the policy decides the derivative (a kink, a tied window)
    nan: int = 0  # of them, NaN (a window holding a NaN)

    def add(self, other: "Counts") -> None:
        self.calls += other.calls
        self.outputs += other.outputs
        self.at_tie += other.at_tie
        self.nan += other.nan


def _variants(module) -> tuple | None:
    """The NumPy modules of module's op under first and last (None: the op has no such policies)."""
    key = (module.OP, repr(sorted(module.PARAMS.items())), getattr(module, "EXPR", None))
    with _LOCK:
        if key in _VARIANTS:
            return _VARIANTS[key]
    try:
        found = tuple(api.load(module.OP, ties=t, **module.PARAMS) for t in ("first", "last"))
    except (ValueError, TypeError):
        found = None
    with _LOCK:
        _VARIANTS[key] = found
    return found


def count(module, arrays: list, seed: int = 0) -> Counts:
    """The counts of one call of module's op on these NumPy arrays (its inputs, in order)."""
    variants = _variants(module)
    first = variants[0] if variants else module
    y, saved = first.forward(*arrays)
    y = np.asarray(y)
    c = Counts(calls=1, outputs=int(y.size), nan=int(np.count_nonzero(np.isnan(y))))
    if variants is None or y.size == 0:
        return c
    rng = np.random.default_rng(seed)
    tangents = [rng.standard_normal(np.shape(a)).astype(np.asarray(a).dtype)
                if np.issubdtype(np.asarray(a).dtype, np.floating) else None for a in arrays]
    _, saved_last = variants[1].forward(*arrays)
    a, b = np.asarray(first.jvp(*tangents, saved)), np.asarray(variants[1].jvp(*tangents, saved_last))
    differ = (a != b) & ~(np.isnan(a) & np.isnan(b))
    c.at_tie = int(np.count_nonzero(differ))
    return c


@dataclass
class TieCounter:
    """Counts ties, kinks and NaN of every symgrad op call while active (``with TieCounter() as
    c: ...``), per step (``c.step()``) and op (its label: ``relu(ties=first)``, ...).

    every: count one call of each op in this many (1: all).  seed: the tangents' generator."""
    every: int = 1
    seed: int = 0
    steps: list = field(default_factory=lambda: [{}])
    _seen: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise ValueError(f"every must be a positive int, got {self.every!r}")

    def __enter__(self) -> "TieCounter":
        _patch()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _flush_jax()
        _ACTIVE.remove(self)
        _unpatch_if_idle()

    def step(self) -> None:
        """Close the current step; the next calls count in a new one."""
        _flush_jax()
        self.steps.append({})

    def record(self, label: str, module, arrays: list) -> None:
        n = self._seen[label] = self._seen.get(label, 0) + 1
        if (n - 1) % self.every:
            return
        counts = count(module, arrays, self.seed)
        with _LOCK:
            self.steps[-1].setdefault(label, Counts()).add(counts)

    def totals(self) -> dict[str, Counts]:
        """{op label: its counts over every step}."""
        out: dict[str, Counts] = {}
        for step in self.steps:
            for label, c in step.items():
                out.setdefault(label, Counts()).add(c)
        return out

    def table(self) -> str:
        """A Markdown table: step, op, calls, output elements, at a tie, NaN."""
        rows = ["| step | op | calls | outputs | at a tie | NaN |", "|---|---|---|---|---|---|"]
        for i, step in enumerate(self.steps):
            for label, c in sorted(step.items()):
                rows.append(f"| {i} | `{label}` | {c.calls} | {c.outputs} | {c.at_tie} | {c.nan} |")
        return "\n".join(rows) + "\n"


def _label(op) -> str:
    params = ", ".join(f"{k}={v}" for k, v in op.params.items() if v is not None and v is not False)
    return f"{op.op}({params}{', ' if params else ''}ties={op.ties})"


# ------------------------------------------------------------------------------ the patches

def _torch_call(original):
    def __call__(self, *tensors):
        import torch
        if _POLICY and self.ties != _POLICY[-1]:
            return _torch_variant(self, _POLICY[-1])(*tensors)
        if _ACTIVE and not torch.compiler.is_compiling():
            arrays = [t.detach().cpu().numpy() for t in tensors]
            for counter in list(_ACTIVE):
                counter.record(_label(self), self.module, arrays)
        return original(self, *tensors)
    return __call__


def _torch_variant(op, ties: str):
    import symgrad.torch as st
    if op._recipe is None:
        raise ValueError(f"{op.op}: an op made by symgrad.torch.wrap has no recipe to remake under "
                         f"ties={ties!r}; make it with symgrad.torch.op or symgrad.torch.expr")
    maker, args, kwargs = op._recipe
    return getattr(st, maker)(*args, **(kwargs | {"ties": ties}))


def _jax_call(original):
    def __call__(self, *args):
        if _POLICY and self.ties != _POLICY[-1]:
            import symgrad.jax as sj
            return sj.op(self.op, ties=_POLICY[-1], **self.params)(*args)
        if _ACTIVE:
            import jax
            label, module = _label(self), self.module

            def record(*arrays):  # when the traced code runs: into the counters active then
                for counter in list(_ACTIVE):
                    counter.record(label, module, [np.asarray(a) for a in arrays])
            jax.debug.callback(record, *args)
        return original(self, *args)
    return __call__


def _targets() -> list:
    """(class, wrapper maker) of the frameworks' op classes that are importable."""
    found = []
    with contextlib.suppress(ImportError):
        import symgrad.torch as st
        found.append((st.SymgradOp, _torch_call))
    with contextlib.suppress(ImportError):
        import symgrad.jax as sj
        found += [(sj._Native, _jax_call), (sj._Op, _jax_call)]
    return found


def _patch() -> None:
    with _LOCK:
        for cls, maker in _targets():
            if cls not in _PATCHED:
                _PATCHED[cls] = cls.__call__
                cls.__call__ = maker(cls.__call__)


def _unpatch_if_idle() -> None:
    with _LOCK:
        if _ACTIVE or _POLICY:
            return
        for cls, original in _PATCHED.items():
            cls.__call__ = original
        _PATCHED.clear()


def _flush_jax() -> None:
    """Wait for the counts that JAX's callbacks still have in flight."""
    import sys
    if "jax" in sys.modules:
        sys.modules["jax"].effects_barrier()


@contextlib.contextmanager
def policy(ties: str):
    """Run every symgrad op called inside under tie policy ``ties`` (``first``, ``last``, ``split``
    or ``all``)."""
    from .policy import POLICIES
    if ties not in POLICIES:
        raise ValueError(f"ties must be one of {', '.join(POLICIES)}, got {ties!r}")
    _patch()
    _POLICY.append(ties)
    try:
        yield
    finally:
        _POLICY.pop()
        _unpatch_if_idle()


# ------------------------------------------------------------------------------ comparing

@dataclass(frozen=True)
class Difference:
    """How one parameter's gradient differs between two policies."""
    name: str
    elements: int
    differing: int  # elements whose bits differ
    max_abs: float  # the largest absolute difference
    relative: float  # |g_a - g_b| / |g_a| (Euclidean norms; inf where g_a is 0 and g_b is not)


@dataclass(frozen=True)
class Comparison:
    policies: tuple[str, str]
    parameters: tuple[Difference, ...]

    @property
    def differ(self) -> bool:
        return any(p.differing for p in self.parameters)

    def table(self) -> str:
        a, b = self.policies
        rows = [f"| parameter | elements | differing ({a} vs {b}) | max abs difference | relative |",
                "|---|---|---|---|---|"]
        rows += [f"| `{p.name}` | {p.elements} | {p.differing} | {p.max_abs:.3g} | {p.relative:.3g} |"
                 for p in self.parameters]
        return "\n".join(rows) + "\n"


def difference(name: str, a: np.ndarray, b: np.ndarray) -> Difference:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"{name}: gradients of shapes {a.shape} and {b.shape}")
    same = (a.view(np.uint8).reshape(a.shape + (-1,)) == b.view(np.uint8).reshape(b.shape + (-1,))).all(-1) \
        if a.dtype == b.dtype else (a == b)
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    norm_a, norm_d = float(np.linalg.norm(a.astype(np.float64))), float(np.linalg.norm(d))
    rel = norm_d / norm_a if norm_a else (0.0 if norm_d == 0 else float("inf"))
    return Difference(name, int(a.size), int(np.count_nonzero(~same)),
                      float(np.nanmax(d)) if d.size else 0.0, rel)


def compare(grads_a: dict, grads_b: dict, policies: tuple[str, str]) -> Comparison:
    """Compare {parameter name: gradient} of two policies."""
    if set(grads_a) != set(grads_b):
        raise ValueError(f"parameters differ: {sorted(set(grads_a) ^ set(grads_b))}")
    return Comparison(policies, tuple(difference(n, grads_a[n], grads_b[n]) for n in grads_a))


def compare_torch(model, loss_fn, a: str = "first", b: str = "last") -> Comparison:
    """Run ``loss_fn()`` (a scalar tensor computed with ``model``'s symgrad ops) and its backward
    under policies a and b; compare model's parameter gradients.  The gradients are left as b's."""
    grads = []
    for ties in (a, b):
        model.zero_grad(set_to_none=True)
        with policy(ties):
            loss_fn().backward()
        grads.append({n: p.grad.detach().cpu().numpy().copy() for n, p in model.named_parameters()
                      if p.grad is not None})
    return compare(grads[0], grads[1], (a, b))


def compare_jax(loss_fn, params, *args, a: str = "first", b: str = "last") -> Comparison:
    """``jax.grad(loss_fn)(params, *args)`` under policies a and b (loss_fn not jitted outside: it
    is traced under each policy), compared leaf by leaf (named by their pytree paths)."""
    import jax
    grads = []
    for ties in (a, b):
        with policy(ties):
            g = jax.grad(loss_fn)(params, *args)
        leaves = jax.tree_util.tree_flatten_with_path(g)[0]
        grads.append({jax.tree_util.keystr(path) or "params": np.asarray(v) for path, v in leaves})
    return compare(grads[0], grads[1], (a, b))
