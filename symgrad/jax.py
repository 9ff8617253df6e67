"""symgrad ops as JAX functions: jit, grad, vmap and grad-of-grad, on the CPU.

``symgrad.jax.op(name, ties=None, convention=None, nan=None, order=None, **params)`` and
``symgrad.jax.expr(text, ...)`` return functions of JAX arrays backed by the generated NumPy
modules (``symgrad.load`` / ``symgrad.load_expr``; the same arguments, checked the same way).

How: a ``jax.custom_jvp`` function whose primal runs the module's forward in a
``jax.pure_callback`` (returning the output and the saved arrays), and whose tangent is
``jax.custom_derivatives.linear_call(jvp, backward, residuals, tangents)``: the module's ``jvp``,
declared linear in the tangents with the module's ``backward`` as its transpose.  Reverse mode is
JAX's transposition of that linear call, so ``jax.grad`` runs the generated backward (a gather),
never a transposed jvp; no fallback to ``custom_vjp`` is needed.  linear_call differentiates
itself in its linear arguments (its derivative is itself, and the transpose of the transpose is
the jvp again); its residuals (the inputs, the output, the saved arrays) go through
``lax.stop_gradient`` for piecewise-linear modules (``PIECEWISE_LINEAR``: W is constant in them
almost everywhere), which makes grad-of-grad and higher orders exact; for logsumexp and
expressions with smooth non-linear parts a derivative with respect to the residuals is refused
with a NotImplementedError (first order only).  Only the inputs that are differentiated are
linear arguments (the jvp rule sees the others' tangents as symbolic zeros and passes None for
them), as JAX transposes a linear_call only when all of them are unknown; an expression's input
outside ``wrt`` that gets a tangent is a ValueError, never a silent zero.

The shapes of the callbacks' results come from the input shapes (the module is run once on zeros
of each new signature, ``symgrad.bridge``), so one jitted function serves any shape.  Callbacks
are vmapped sequentially (``vmap_method="sequential"``: a module's leading axes have meanings,
e.g. N and C of a pooling, so a batch axis cannot be handed to it); JAX 0.10 has no batching rule
for linear_call, so importing this module registers one (sequential, ``lax.map``) where JAX has
none.  float16, bfloat16 (ml_dtypes' type, as JAX's), float32 and float64 (float64 with
``jax_enable_x64``).  CPU only: the callbacks run NumPy on the host.

``op`` runs float32/float64 arrays through the cpu backend's module (``backend="cpu"``: compiled C,
the same bits as the NumPy module) for the kinds it builds where a C compiler is found, else
through the NumPy module; ``$SYMGRAD_CPU_BACKEND`` chooses (``auto``, the default; ``cpu`` to
require it; ``numpy``), read when ``op`` is called.

Errors in the data (an unpooling index outside the output plane, ...) are found by the module on
the host, inside a callback.  Called eagerly, an op raises the module's own one-line ValueError
(or TypeError).  Under ``jit`` the values are not known while tracing and compiled code cannot
raise a Python exception: the call raises ``jax.errors.JaxRuntimeError``, whose message (after
XLA's callback traceback) ends with the module's one-line error; check such inputs before the
jitted call, or run the op eagerly, to get the ValueError itself.
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

from . import api, bridge
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
        if len(args) != len(self.inputs):
            raise TypeError(f"{self.op}: expected {len(self.inputs)} array(s) "
                            f"({', '.join(self.inputs)}), got {len(args)}")
        xs = []
        for k, (name, x) in enumerate(zip(self.inputs, args)):
            x = jnp.asarray(x)
            if k in self.integers:
                if not jnp.issubdtype(x.dtype, jnp.integer):
                    raise TypeError(f"{self.op}: {name} must be an integer array, got {x.dtype}")
            elif np.dtype(x.dtype) not in _FLOATS:
                raise TypeError(f"{self.op}: {name} must be a float16, bfloat16, float32 or float64 "
                                f"array, got {x.dtype}")
            xs.append(x)
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
            return (np.asarray(output),) + tuple(np.asarray(a).astype(s.dtype, copy=False)
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

    def _refuse_higher_order(self):
        """The identity, whose derivative is a clear error: W depends smoothly on the residuals."""
        op = self.op

        @jax.custom_jvp
        def refuse(residuals):
            return residuals

        @refuse.defjvp
        def _(primals, tangents):
            raise NotImplementedError(
                f"{op}: derivatives beyond the first are supported for piecewise-linear ops only "
                f"(this module's backward depends smoothly on its inputs)")
        return refuse

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
        fixed = jax.lax.stop_gradient if me.module.PIECEWISE_LINEAR else self._refuse_higher_order()

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
            return forward(*xs)[0]

        return fn


def _batch_linear_call() -> None:
    """Give JAX's linear_call a batching rule where it has none (JAX 0.10 has none): the batch
    is mapped sequentially with lax.map, each element one linear_call, which stays linear and
    transposable.  Without it vmap would work on an op but not on its gradients."""
    try:
        from jax._src.custom_derivatives import linear_call_p
        from jax._src.interpreters import batching
    except ImportError:  # another JAX layout: vmap of gradients is then not available
        return
    if linear_call_p in batching.fancy_primitive_batchers:  # where primitive_batchers registers too
        return

    def rule(vals, dims, **params):
        vals = [v if d is None else jnp.moveaxis(v, d, 0) for v, d in zip(vals, dims)]
        batched = [k for k, d in enumerate(dims) if d is not None]

        def one(sliced):
            args = list(vals)
            for k, v in zip(batched, sliced):
                args[k] = v
            return linear_call_p.bind(*args, **params)

        outs = jax.lax.map(one, [vals[k] for k in batched])
        return outs, [0] * len(outs)

    batching.primitive_batchers[linear_call_p] = rule


_batch_linear_call()


def _threads(module) -> dict:
    """threads= for the cpu backend's module: 1 in the host callbacks (XLA's CPU runtime has its
    own thread pool), unless its THREADS or $SYMGRAD_NUM_THREADS is set."""
    return framework_threads(module, lambda: 1)


_OPS: dict = {}
_OPS_LOCK = threading.Lock()


def wrap(module) -> _Op:
    """A module that symgrad.load or symgrad.load_expr returned (NumPy backend) as a JAX function."""
    bridge.require_module(module, "symgrad.jax.wrap")
    with _OPS_LOCK:
        found = _OPS.get(module.__name__)
        if found is None:
            found = _OPS[module.__name__] = _Op(module)
    return found


def op(name: str, ties: str | None = None, convention: str | None = None, nan: str | None = None,
       order: str | None = None, **params) -> _Op:
    """A symgrad op as a JAX function (symgrad.load's arguments; the same checks and errors)."""
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
         **kwargs) -> _Op:
    """An expression (symgrad.load_expr's arguments) as a JAX function."""
    return wrap(api.load_expr(text, inputs=inputs, wrt=wrt, ties=ties, name=name, **kwargs))
