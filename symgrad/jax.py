"""symgrad ops as JAX functions: jit, grad, vmap and grad-of-grad.

``symgrad.jax.op(name, ties=None, convention=None, nan=None, order=None, **params)`` and
``symgrad.jax.expr(text, ...)`` return functions of JAX arrays (symgrad.load's / symgrad.load_expr's
arguments, checked the same way).  Each op takes one of two paths:

* **native** (the elementwise ops: maximum, minimum, relu, clamp, hardtanh, relu6, leaky_relu,
  abs; every expression; max pooling, max_pool1d/2d/3d, adaptive max pooling,
  adaptive_max_pool1d/2d/3d, and fractional max pooling, fractional_max_pool2d/3d (the samples an
  input, not differentiated); maxout; the reductions amax, amin, max, min, nanmax, nanmin; unpooling,
  max_unpool1d/2d/3d; logsumexp (within a few ulps of the NumPy module: XLA's exp, and its division by
  the temperature); the order statistics sort, topk, cummax, cummin, kthvalue, median,
  nanmedian, whose (values, indices) outputs give the indices a float0 tangent (split/all sum tie
  blocks in float64: jax_enable_x64); the segments (the pyg preset included), embedding_bag_max and
  roi_max_pool;
  under every policy, NaN rule and preset but those named below): the jax backend's generated
  module (``symgrad.load(..., backend="jax")``), plain jax.numpy and lax code, traced into the
  caller's program: XLA fuses it with its neighbours, ``vmap`` batches it natively, and it runs
  on every device JAX has (CPU, GPU, TPU).  Its results equal the NumPy backend's module bit for
  bit on the CPU (the modules' docstrings name the exceptions).
* **callback** (where the jax backend builds no module: the bags and RoI pooling; pooling's return_indices,
  refused): the generated NumPy module (or, for
  float32/float64, the cpu backend's compiled C module) in a ``jax.pure_callback`` on the host:
  CPU only, vmapped sequentially (``vmap_method="sequential"``: a module's leading axes have
  meanings, e.g. N and C of a pooling, so a batch axis cannot be handed to it), opaque to XLA.
  ``NATIVE_LOWERINGS``, ``NATIVE_SPECIAL`` and ``backends.jax.WINDOW_FORMS`` say which ops are native.

Both are a ``jax.custom_jvp`` function whose tangent is ``jax.custom_derivatives.linear_call(jvp,
backward, residuals, tangents)``: the module's ``jvp``, declared linear in the tangents with the
module's ``backward`` as its transpose.  Reverse mode is JAX's transposition of that linear call,
so ``jax.grad`` runs the generated backward (a gather), never a transposed jvp.  linear_call
differentiates itself in its linear arguments (its derivative is itself, and the transpose of the
transpose is the jvp again); its residuals (native: the saved inputs; callback: the inputs, the
output, the saved arrays) go through ``lax.stop_gradient`` for piecewise-linear modules
(``PIECEWISE_LINEAR``: W is constant in them almost everywhere), which makes grad-of-grad and
higher orders exact; for the ops smooth between their kinks (hardswish, elu, celu) the residuals
(their input) keep their derivative, which is the op's second derivative (``symgrad.curvature``:
JAX's own under convention='jax', PyTorch's under 'torch', the tie policy's otherwise; JAX's
linear_call asserts constant residuals, so importing this module extends its rule, see
``_differentiate_residuals``); for logsumexp and expressions with smooth non-linear parts a
derivative with respect to the residuals is refused with a NotImplementedError (first order only).  Only the
inputs that are differentiated are linear arguments (the jvp rule sees the others' tangents as
symbolic zeros and passes None for them), as JAX transposes a linear_call only when all of them
are unknown; an expression's input outside ``wrt`` that gets a tangent is a ValueError, never a
silent zero.  JAX 0.10 has no batching rule for linear_call, so importing this module registers
one where JAX has none: the linear map and its transpose are each batched as JAX batches any
function (vmap of their jaxprs), not mapped one example at a time.

float16, bfloat16 (ml_dtypes' type, as JAX's), float32 and float64 (float64 with
``jax_enable_x64``).

Callback path details: the shapes of the callbacks' results come from the input shapes (the
module is run once on zeros of each new signature, ``symgrad.bridge``), so one jitted function
serves any shape.  ``op`` runs float32/float64 arrays through the cpu backend's module
(``backend="cpu"``: compiled C, the same bits as the NumPy module) for the kinds it builds where a
C compiler is found, else through the NumPy module; ``$SYMGRAD_CPU_BACKEND`` chooses (``auto``,
the default; ``cpu`` to require it; ``numpy``), read when ``op`` is called.  Errors in the data (a
segment index out of range, ...) are found by the module on the host, inside a
callback.  Called eagerly, an op raises the module's own one-line ValueError (or TypeError).
Under ``jit`` the values are not known while tracing and compiled code cannot raise a Python
exception: the call raises ``jax.errors.JaxRuntimeError``, whose message (after XLA's callback
traceback) ends with the module's one-line error; check such inputs before the jitted call, or run
the op eagerly, to get the ValueError itself.  The native modules (unpooling's indices, the
segments' index) check the values where they are known (eagerly, and in an eager ``jax.grad``),
not under ``jit`` or ``vmap``: there an index out of range gives an unspecified result (JAX's
out-of-bounds gather and scatter rules), no error.
"""

from __future__ import annotations

import logging
import threading
from functools import partial

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    from jax.custom_derivatives import SymbolicZero, linear_call
except ModuleNotFoundError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    if exc.name not in ("jax", "jaxlib"):
        raise
    raise ModuleNotFoundError(
        "symgrad.jax needs JAX, which is not installed; install it with "
        "pip install jax==0.10.2 jaxlib==0.10.2 (or pip install \".[jax]\" from symgrad's checkout)") from None

from . import api, bridge, curvature, framework_losses, framework_multi_margin
from .ops import OPS
from .backends import jax as jax_backend
from .backends.cpu import framework_threads

__all__ = ["op", "expr", "wrap"]

_FLOATS = (np.dtype(np.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32), np.dtype(np.float64))


# Callbacks that run inside _Op.__call__ (eager calls, eager grad and vmap; never a jitted
# function's, which run after tracing) run in the caller's thread: a module's error there is raised
# again by __call__ as itself, so the traceback JAX logs for the failed callback is dropped for it
# (and only for it: under jit, JAX's log and error are all the caller gets).
_EAGER = threading.local()


def _not_reraised(record: logging.LogRecord) -> bool:
    return not (record.exc_info and getattr(record.exc_info[1], "symgrad_reraised", False))


logging.getLogger("jax._src.callback").addFilter(_not_reraised)


def _checked(op, args) -> list:
    """The arguments of an op's call as JAX arrays, or a TypeError naming what was expected."""
    if op.op == "embedding_bag_max":
        args = _bag_offsets(op, args)
    if len(args) != len(op.inputs):
        raise TypeError(f"{op.op}: expected {len(op.inputs)} array(s) "
                        f"({', '.join(op.inputs)}), got {len(args)}")
    xs = []
    for k, (name, x) in enumerate(zip(op.inputs, args)):
        x = jnp.asarray(x)
        if k in op.integers:
            if not jnp.issubdtype(x.dtype, jnp.integer):
                raise TypeError(f"{op.op}: {name} must be an integer array, got {x.dtype}")
        elif np.dtype(x.dtype) not in _FLOATS:
            raise TypeError(f"{op.op}: {name} must be a float16, bfloat16, float32 or float64 "
                            f"array, got {x.dtype}")
        xs.append(x)
    return xs


def _bag_offsets(op, args) -> tuple:
    """embedding_bag_max's (input, weight, offsets) as PyTorch's F.embedding_bag takes them: offsets
    None (or left out) with a 2-d input, each row a bag (bridge.bags_per_row)."""
    if len(args) == 2:
        args = (*args, None)
    if len(args) != 3 or args[2] is not None:
        return args
    input = jnp.asarray(args[0])
    if input.ndim != 2:
        raise ValueError(f"{op.op}: offsets None needs a 2-d input (each row a bag), got input of "
                         f"shape {tuple(input.shape)}")
    flat, offsets = bridge.bags_per_row(input, op.params["include_last_offset"],
                                        lambda n: jnp.arange(n, dtype=input.dtype))
    return flat, args[1], offsets


def _refuse_higher_order(op: str):
    """The identity, whose derivative is a clear error: W depends smoothly on the residuals."""

    @jax.custom_jvp
    def refuse(residuals):
        return residuals

    @refuse.defjvp
    def _(primals, tangents):
        raise NotImplementedError(
            f"{op}: derivatives beyond the first are supported for piecewise-linear ops only "
            f"(this module's backward depends smoothly on its inputs)")
    return refuse


class _Native:
    """A jax backend module (symgrad.load(..., backend="jax")) as a JAX function: its forward
    traced in place, custom_jvp with its jvp, reverse mode by transposition into its backward
    (see the module docstring).  No callback: jit, vmap and every device."""

    def __init__(self, module):
        self.module = module
        self.settings = None  # op()'s ties, convention, nan, order (curvature.SMOOTH's second derivative)
        self._curve = None
        self.integers = bridge.integer_inputs(module)  # (the segments' index: no tangent, no gradient)
        self.op, self.params, self.ties = module.OP, module.PARAMS, module.TIES
        self.inputs = tuple(module.INPUTS)
        self.differentiable = tuple(k for k, name in enumerate(self.inputs) if name in module.WRT)
        self.fn = self._build()
        self.__doc__ = (f"{self.op} (ties={self.ties!r}, params={self.params}) as a JAX function "
                        f"of {', '.join(self.inputs)}: the jax backend's module traced in place, "
                        f"custom_jvp with its jvp, reverse mode by transposition into its backward.")

    def __repr__(self) -> str:
        return f"symgrad.jax op {self.op} (ties={self.ties!r}, params={self.params}, native)"

    def __call__(self, *args):
        return self.fn(*_checked(self, args))

    def _second_derivative(self):
        """fn(x, v, g) -> v * g * f''(x) for the ops smooth between their kinks (curvature.SMOOTH) made
        by op(); None for the others (their residuals' derivative is stopped or refused)."""
        if self._curve is None and self.settings is not None and self.op in curvature.SMOOTH:
            self._curve = curvature.second_derivative(self.op, self.params, self.settings, self.module, "jax")
        return self._curve

    def _build(self):
        me, m, n = self, self.module, len(self.inputs)
        # the residuals (the saved inputs): for a piecewise-linear module W is constant in them
        # almost everywhere, so their derivative is stopped (exact at every order); otherwise
        # differentiating through them is refused
        refuse = jax.lax.stop_gradient if m.PIECEWISE_LINEAR else _refuse_higher_order(self.op)

        @jax.custom_jvp
        def fn(*xs):
            return m.forward(*xs)[0]

        @partial(fn.defjvp, symbolic_zeros=True)
        def _(primals, tangents):
            # the output through fn itself, so that a derivative of this rule (grad-of-grad)
            # differentiates it by this rule again, not the forward's jax.numpy code
            out, saved = fn(*primals), m.forward(*primals)[1]
            moving = [k for k, t in enumerate(tangents) if not isinstance(t, SymbolicZero)]
            for k in moving:
                if k not in me.differentiable:
                    raise ValueError(
                        f"{me.op}: {me.inputs[k]} is not differentiated (wrt="
                        f"{[me.inputs[j] for j in me.differentiable]}); load the expression with "
                        f"{me.inputs[k]} in wrt to differentiate it")
            if not moving:
                return out, _no_tangent(out)

            def apply_jvp(residuals, ts):
                """W t: the module's jvp, linear in the tangents (None: the inputs not moving)."""
                given = dict(zip(moving, ts))
                return m.jvp(*[given.get(k) for k in range(n)], residuals)

            def apply_backward(residuals, g):
                """W^T g: the module's backward, linear in g."""
                grads = m.backward(g, residuals)
                return tuple(grads[k] for k in moving)

            curve = me._second_derivative()
            if curve is None:
                residuals = refuse(saved)
            else:  # hardswish, elu, celu: a derivative in the saved input, their second
                residuals = saved
                apply_jvp, apply_backward = _curved(apply_jvp, curve), _curved(apply_backward, curve)
            out_dot = linear_call(apply_jvp, apply_backward, residuals,
                                  tuple(tangents[k] for k in moving))
            if isinstance(out, tuple):  # an order statistic's (values, indices): no tangent for the indices
                return out, (out_dot,) + _no_tangent(out[1:])
            return out, out_dot

        return fn


def _curved(linear, curve):
    """``linear(residuals, a)`` (a module's jvp or backward, linear in a; residuals its Saved of
    one input x) whose derivative in the residuals is ``curve(x, dx, a)`` (dx * a * f''(x)): the op's second
    derivative, where-selected values (_differentiate_residuals lets linear_call take it)."""

    @jax.custom_jvp
    def curved(residuals, a):
        return linear(residuals, a)

    @partial(curved.defjvp, symbolic_zeros=True)
    def _(primals, tangents):
        (residuals, a), (d_residuals, d_a) = primals, tangents
        out = curved(residuals, a)
        dx = jax.tree_util.tree_leaves(d_residuals)[0]
        zero = [isinstance(t, SymbolicZero) for t in jax.tree_util.tree_leaves(d_a)]
        parts = [] if all(zero) else [linear(residuals, jax.tree_util.tree_map(_instantiated, d_a))]
        if not isinstance(dx, SymbolicZero):
            (x,), (h,) = jax.tree_util.tree_leaves(residuals), jax.tree_util.tree_leaves(a)
            bend = curve(x, dx, h)
            parts.append(jax.tree_util.tree_map(lambda _: bend, out))
        if not parts:
            return out, jax.tree_util.tree_map(jnp.zeros_like, out)
        return out, parts[0] if len(parts) == 1 else jax.tree_util.tree_map(jnp.add, *parts)
    return curved


def _instantiated(t):
    """A tangent, a SymbolicZero as zeros."""
    return jnp.zeros(t.aval.shape, t.aval.dtype) if isinstance(t, SymbolicZero) else t


def _no_tangent(out):
    """The zero tangent of an output (a tuple's: each; integer indices: float0 zeros)."""
    if isinstance(out, tuple):
        return tuple(_no_tangent(o) for o in out)
    if jnp.issubdtype(out.dtype, jnp.integer):
        return np.zeros(out.shape, jax.dtypes.float0)
    return jnp.zeros(out.shape, out.dtype)


class _Op:
    """One generated module as a JAX function of its inputs (see the module docstring)."""

    def __init__(self, module):
        self.module = module
        self.op, self.params, self.ties = module.OP, module.PARAMS, module.TIES
        self.inputs = tuple(module.INPUTS)
        self.layouts = bridge.Layouts(module)
        self.integers = bridge.integer_inputs(module)
        self.differentiable = bridge.differentiable(module)
        self.fn = self._build()
        self._host_error = None  # the last error a forward callback raised (eager calls re-raise it)
        self.__doc__ = (f"{self.op} (ties={self.ties!r}, params={self.params}) as a JAX function "
                        f"of {', '.join(self.inputs)}: custom_jvp with the generated jvp, reverse "
                        f"mode by transposition (the generated backward).")

    def __repr__(self) -> str:
        return f"symgrad.jax op {self.op} (ties={self.ties!r}, params={self.params})"

    def __call__(self, *args):
        xs = _checked(self, args)
        self._host_error = None
        outer, _EAGER.active = getattr(_EAGER, "active", False), True
        try:
            return self.fn(*xs)
        except jax.errors.JaxRuntimeError as exc:  # eagerly: the callback's own error, not XLA's wrapping
            error, self._host_error = self._host_error, None
            if error is None or str(error) not in str(exc):
                raise
            raise error.with_traceback(None) from None
        finally:
            _EAGER.active = outer

    # -- the callbacks (NumPy on the host)

    def _signature(self, xs) -> tuple:
        return tuple((tuple(x.shape), np.dtype(x.dtype)) for x in xs)

    def _forward_shapes(self, xs):
        layout = self.layouts.get(self._signature(xs))
        out = jax.ShapeDtypeStruct(*layout.output)
        arrays = [jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype)) for shape, dtype in layout.arrays]
        return layout, (out, *arrays)

    def _saved(self, xs, output, arrays):
        layout = self.layouts.get(self._signature(xs))
        arrays = [np.asarray(a).astype(dtype, copy=False) for a, (_, dtype) in zip(arrays, layout.arrays)]
        return bridge.join(self.module, layout, [np.asarray(x) for x in xs], np.asarray(output), arrays)

    def _call_forward(self, xs):
        _, shapes = self._forward_shapes(xs)

        def host(*xs):
            xs = [np.asarray(x) for x in xs]
            try:
                output, saved = self.module.forward(*xs, **_threads(self.module))
            except (ValueError, TypeError) as exc:
                self._host_error = exc  # for __call__, which raises it where it can (eagerly)
                exc.symgrad_reraised = getattr(_EAGER, "active", False)  # JAX need not log it
                raise
            _, arrays = bridge.split(xs, output, saved)
            return (np.asarray(bridge.first(output)),) + tuple(np.asarray(a).astype(s.dtype, copy=False)
                                                 for a, s in zip(arrays, shapes[1:]))

        out, *arrays = jax.pure_callback(host, shapes, *xs, vmap_method="sequential")
        return out, arrays

    def _host_jvp(self, active, xs, output, arrays, tangents):
        """The module's jvp, with a tangent for each input in active and None (zero) elsewhere."""
        saved = self._saved(list(xs), output, list(arrays))
        given = dict(zip(active, tangents))
        ts = [np.asarray(given[k]) if k in given else None for k in range(len(xs))]
        return np.asarray(self.module.jvp(*ts, saved, **_threads(self.module)))

    def _host_backward(self, active, xs, output, arrays, g):
        """The gradients of the inputs in active: the module's backward."""
        saved = self._saved(list(xs), output, list(arrays))
        grads = self.module.backward(np.asarray(g), saved, **_threads(self.module))
        return tuple(np.asarray(grads[k]) for k in active)

    # -- the JAX functions

    def _build(self):
        me, n = self, len(self.inputs)

        def unpack(residuals):
            return list(residuals[:n]), residuals[n], list(residuals[n + 1:])

        def linear_maps(active):
            """W t and W^T g restricted to the inputs in active (those with a non-zero tangent):
            JAX transposes a linear_call only when every linear argument is unknown, so an input
            that is not differentiated (a constant) must not be one."""

            def apply_jvp(residuals, tangents):
                """W t: the module's jvp, linear in the tangents."""
                xs, out, arrays = unpack(residuals)
                m = len(arrays)

                def host(*a):
                    return me._host_jvp(active, a[:n], a[n], a[n + 1:n + 1 + m], a[n + 1 + m:])
                return jax.pure_callback(host, jax.ShapeDtypeStruct(out.shape, out.dtype),
                                         *xs, out, *arrays, *tangents, vmap_method="sequential")

            def apply_backward(residuals, g):
                """W^T g: the module's backward, linear in g."""
                xs, out, arrays = unpack(residuals)
                m = len(arrays)

                def host(*a):
                    return me._host_backward(active, a[:n], a[n], a[n + 1:n + 1 + m], a[n + 1 + m])
                shapes = tuple(jax.ShapeDtypeStruct(xs[k].shape, xs[k].dtype) for k in active)
                return jax.pure_callback(host, shapes, *xs, out, *arrays, g, vmap_method="sequential")

            return apply_jvp, apply_backward

        # The linear maps' residuals (the inputs, the output, the saved arrays): for a
        # piecewise-linear module W is constant in them almost everywhere, so their derivative
        # is stopped (exact at every order); otherwise differentiating through them is refused.
        fixed = jax.lax.stop_gradient if me.module.PIECEWISE_LINEAR else _refuse_higher_order(self.op)

        @jax.custom_jvp
        def forward(*xs):
            """(output, saved arrays): the module's forward."""
            out, arrays = me._call_forward(xs)
            return out, tuple(arrays)

        @partial(forward.defjvp, symbolic_zeros=True)
        def _(primals, tangents):
            out, arrays = forward(*primals)
            moving = [k for k, t in enumerate(tangents)
                      if k not in me.integers and not isinstance(t, SymbolicZero)]
            for k in moving:
                if k not in me.differentiable:
                    raise ValueError(
                        f"{me.op}: {me.inputs[k]} is not differentiated (wrt="
                        f"{[me.inputs[j] for j in me.differentiable]}); load the expression with "
                        f"{me.inputs[k]} in wrt to differentiate it")
            if moving:
                apply_jvp, apply_backward = linear_maps(tuple(moving))
                out_dot = linear_call(apply_jvp, apply_backward, fixed((*primals, out, *arrays)),
                                      tuple(tangents[k] for k in moving))
            else:
                out_dot = jnp.zeros(out.shape, out.dtype)
            # the saved arrays are integers (indices, counts, masks), or a bfloat16 input's copy
            # (the bfloat16 path saves its rounded inputs): no tangent, a zero one
            return (out, arrays), (out_dot, tuple(
                jnp.zeros(a.shape, a.dtype) if jnp.issubdtype(a.dtype, jnp.floating)
                else np.zeros(a.shape, jax.dtypes.float0) for a in arrays))

        def fn(*xs):
            """The output (with the module's other outputs, an order statistic's indices: a tuple)."""
            out, arrays = forward(*xs)
            extra = me.layouts.get(me._signature(xs)).extra_outputs
            return (out, *arrays[:extra]) if extra else out

        return fn


def _batch_linear_call() -> None:
    """Give JAX's linear_call a batching rule where it has none (JAX 0.10 has none): every
    argument moved to (or broadcast along) a leading batch axis, the linear map and its transpose
    each batched as vmap batches any function (their jaxprs), the batched call still a
    linear_call, linear and transposable.  Without it vmap would work on an op but not on its
    gradients.  (A callback inside is batched by its own rule: sequentially.)"""
    try:
        from jax._src.custom_derivatives import linear_call_p
        from jax._src.interpreters import batching
        from jax._src.interpreters import partial_eval as pe
    except ImportError:  # another JAX layout: vmap of gradients is then not available
        return
    if linear_call_p in batching.fancy_primitive_batchers:
        return

    def rule(axis_data, vals, dims, *, callee, transpose_thunk, num_callee_consts, num_res):
        if all(d is None for d in dims):
            outs = linear_call_p.bind(*vals, callee=callee, transpose_thunk=transpose_thunk,
                                      num_callee_consts=num_callee_consts, num_res=num_res)
            return outs, [None] * len(outs)
        vals = [batching.bdim_at_front(v, d, axis_data.size) for v, d in zip(vals, dims)]
        batched, _ = batching.batch_jaxpr(callee, axis_data, [True] * len(vals), True)

        @pe._memoize
        def batched_transpose():
            transpose, consts = transpose_thunk()
            rest = len(transpose.in_avals) - len(consts)
            jaxpr, _ = batching.batch_jaxpr(transpose, axis_data, [False] * len(consts) + [True] * rest, True)
            return jaxpr, consts

        outs = linear_call_p.bind(*vals, callee=batched, transpose_thunk=batched_transpose,
                                  num_callee_consts=num_callee_consts, num_res=num_res)
        return outs, [0] * len(outs)

    batching.fancy_primitive_batchers[linear_call_p] = rule


_batch_linear_call()


def _differentiate_residuals() -> None:
    """Let a linear_call be differentiated in its residuals, where JAX's rule asserts that they
    are constant: JAX's rule on the linear arguments' tangents plus the callee's derivative in the
    residuals (JAX's jvp of its code: a _curved map's own rule).  Where every residual's tangent
    is zero JAX's rule runs unchanged.  (symgrad.jax gives residuals a tangent only for
    curvature.SMOOTH's ops: grad-of-grad of hardswish, elu and celu.)"""
    try:
        from jax._src import core
        from jax._src.custom_derivatives import linear_call_p
        from jax._src.interpreters import ad
    except ImportError:  # another JAX layout: their second derivatives are then not available
        return
    jax_rule = ad.primitive_jvps[linear_call_p]
    if getattr(jax_rule, "symgrad", False):
        return

    def rule(primals, tangents, *, callee, transpose_thunk, num_callee_consts, num_res):
        params = dict(callee=callee, transpose_thunk=transpose_thunk,
                      num_callee_consts=num_callee_consts, num_res=num_res)
        split = num_callee_consts + num_res
        if all(type(t) is ad.Zero for t in tangents[:split]):
            return jax_rule(primals, tangents, **params)
        fixed, linear = list(primals[:split]), list(primals[split:])
        out, bend = jax.jvp(lambda *r: core.eval_jaxpr(callee.jaxpr, callee.consts, *r, *linear),
                            tuple(fixed), tuple(ad.instantiate_zeros(t) for t in tangents[:split]))
        if all(type(t) is ad.Zero for t in tangents[split:]):  # (no +0 added: a -0 stays)
            return out, bend
        zeros = [t if type(t) is ad.Zero else ad.Zero(jax.typeof(t)) for t in tangents[:split]]
        moving = [ad.instantiate_zeros(t) for t in tangents[split:]]
        _, out_dot = jax_rule(primals, zeros + moving, **params)
        return out, [a + b for a, b in zip(out_dot, bend)]

    rule.symgrad = True
    ad.primitive_jvps[linear_call_p] = rule


_differentiate_residuals()


def _threads(module) -> dict:
    """threads= for the cpu backend's module: 1 in the host callbacks (XLA's CPU runtime has its
    own thread pool), unless its THREADS or $SYMGRAD_NUM_THREADS is set."""
    return framework_threads(module, lambda: 1)


_OPS: dict = {}
_OPS_LOCK = threading.Lock()


def wrap(module):
    """A module that symgrad.load or symgrad.load_expr returned as a JAX function: a jax backend
    module natively, a NumPy module through host callbacks (an order statistic's (values,
    indices) as both, the indices integers without a gradient)."""
    if getattr(module, "__name__", None) is not None and getattr(module, "BACKEND", None) == "jax":
        wrapper = _Native
    else:
        bridge.require_module(module, "symgrad.jax.wrap")
        wrapper = _Op
    with _OPS_LOCK:
        found = _OPS.get(module.__name__)
        if found is None:
            found = _OPS[module.__name__] = wrapper(module)
    return found


# the lowerings whose kernel the jax backend builds (lower.ElementwiseKernel): these ops and
# expressions take the native path; window ops where the jax backend builds their form of windows
# (backends.jax.WINDOW_FORMS) too; the others the callback path
NATIVE_LOWERINGS = ("elementwise", "expression", "order", "logsumexp")  # (order: the order statistics)
NATIVE_SPECIAL = ("scatter",)  # the special kernels it builds (unpooling: lower.UnpoolKernel)


def _native(spec, params: dict) -> bool:
    """Whether an op takes the native path: the jax backend builds its module."""
    if spec is None:
        return False
    if spec.strategy.lowering in NATIVE_LOWERINGS:
        return True
    if spec.strategy.lowering in NATIVE_SPECIAL:
        return True
    return (spec.strategy.lowering in ("window", "segment", "bag") and spec.strategy.windows in jax_backend.WINDOW_FORMS
            and not params.get("return_indices"))


def op(name: str, ties: str | None = None, convention: str | None = None, nan: str | None = None,
       order: str | None = None, **params):
    """A symgrad op as a JAX function (symgrad.load's arguments; the same checks and errors): the
    jax backend's module where it builds one (_native), host callbacks for the others."""
    api.check_names(name, params)
    spec = OPS.get(name)
    if _native(spec, params):
        try:
            found = wrap(api.load(name, backend="jax", ties=ties, convention=convention, nan=nan,
                                  order=order, **params))
            if found.settings is None:  # (the second derivatives' settings: curvature.py)
                found.settings = dict(ties=ties, convention=convention, nan=nan, order=order)
            return found
        except ValueError:
            if spec.strategy.lowering in NATIVE_LOWERINGS:
                raise
            # the jax backend refuses this variant of a window op (segment_max without num_segments):
            # the callback path, which raises the same error where it was the arguments'
    return _callback_op(name, ties=ties, convention=convention, nan=nan, order=order, **params)


def _callback_op(name: str, ties: str | None = None, convention: str | None = None,
                 nan: str | None = None, order: str | None = None, **params):
    """A symgrad op through host callbacks into the NumPy (or cpu backend's) module: the path of
    the kinds the jax backend does not build (any op can take it: the benchmarks compare)."""
    api.check_names(name, params)
    if params.get("return_indices"):
        api.load(name, ties=ties, convention=convention, nan=nan, order=order, **params)  # checks
        raise ValueError(f"{name}: return_indices=True is PyTorch's; JAX's max pooling returns no "
                         f"indices and symgrad.jax neither (use symgrad.load(...).forward, or "
                         f"symgrad.torch.op, for the indices)")
    module = api.load(name, ties=ties, convention=convention, nan=nan, order=order, **params)
    cpu = bridge.module_for_cpu(module, lambda: api.load(name, backend="cpu", ties=ties, convention=convention,
                                                         nan=nan, order=order, **params),
                                bridge.cpu_backend_choice())
    return wrap(module) if cpu is module else _OnCpuBackend(wrap(module), wrap(cpu))


class _OnCpuBackend:
    """An op whose float32/float64 arrays run through the cpu backend's module (compiled C, the same
    bits as the NumPy module), other dtypes through the NumPy module's; otherwise the NumPy
    module's op (its attributes)."""

    def __init__(self, numpy_op: _Op, cpu_op: _Op):
        self.numpy_op, self.cpu_op = numpy_op, cpu_op
        self.__doc__ = numpy_op.__doc__

    def __getattr__(self, name):
        return getattr(self.numpy_op, name)

    def __repr__(self) -> str:
        return repr(self.numpy_op) + " on the cpu backend"

    def __call__(self, *args):
        first = jnp.asarray(args[0]) if args else None
        use = self.cpu_op if first is not None and np.dtype(first.dtype) in bridge.CPU_DTYPES else self.numpy_op
        return use(*args)


def expr(text: str, inputs=None, wrt=None, ties: str | None = None, name: str | None = None,
         **kwargs) -> _Native:
    """An expression (symgrad.load_expr's arguments) as a JAX function: the jax backend's module."""
    return wrap(api.load_expr(text, inputs=inputs, wrt=wrt, ties=ties, name=name, backend="jax", **kwargs))


# ----------------------------------------------------------------------------- losses (issue 30)

def _loss(name: str, inputs: tuple, margin, reduction, settings: dict):
    fn = framework_losses.kink(op, name, margin, settings)
    return framework_losses.loss(name, fn, jnp, inputs, reduction)


def l1_loss(input, target, *, reduction="mean", ties=None, convention=None, nan=None):
    """PyTorch's F.l1_loss as a JAX function: jnp.mean of symgrad's ``abs(input - target)``
    (framework_losses.py)."""
    return _loss("l1_loss", (input, target), None, reduction, dict(ties=ties, convention=convention, nan=nan))


def margin_ranking_loss(input1, input2, target, margin=0.0, *, reduction="mean", ties=None,
                        convention=None, nan=None):
    """PyTorch's F.margin_ranking_loss as a JAX function (framework_losses.py)."""
    return _loss("margin_ranking_loss", (input1, input2, target), margin, reduction,
                 dict(ties=ties, convention=convention, nan=nan))


def hinge_embedding_loss(input, target, margin=1.0, *, reduction="mean", ties=None, convention=None,
                         nan=None):
    """PyTorch's F.hinge_embedding_loss as a JAX function (framework_losses.py)."""
    return _loss("hinge_embedding_loss", (input, target), margin, reduction,
                 dict(ties=ties, convention=convention, nan=nan))


__all__ += ["l1_loss", "margin_ranking_loss", "hinge_embedding_loss"]


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, *, reduction="mean", ties=None,
                      convention=None, nan=None):
    """PyTorch's F.multi_margin_loss (p=1) as a JAX function: the jnp expression with symgrad's
    relu for the hinge (framework_multi_margin.py)."""
    margin, reduction, kink = framework_multi_margin.settings_of(
        p, margin, reduction, dict(ties=ties, convention=convention, nan=nan))
    return framework_multi_margin.jax_loss(input, target, margin, weight, reduction, lambda: op("relu", **kink))


__all__ += ["multi_margin_loss"]
