"""symgrad ops as PyTorch operators: autograd, double backward, torch.compile, DDP.

``symgrad.torch.op(name, ties=None, convention=None, nan=None, order=None, **params)`` and
``symgrad.torch.expr(text, ...)`` return functions of torch tensors backed by the generated
modules (``symgrad.load`` / ``symgrad.load_expr``; the same arguments, checked the same way).
Each module becomes three operators of the ``symgrad`` library, registered once per process
with ``torch.library.custom_op``:

* ``forward``: the inputs -> the output and the module's saved arrays (as tensors);
* ``backward``: grad_output, the inputs, the output and the saved arrays -> the gradients;
* ``jvp``: tangents of the inputs, the inputs, the output and the saved arrays -> the output's
  tangent (the generated ``jvp``).

Autograd is registered on ``forward`` (its derivative is ``backward``) and on ``backward``: that
operator is linear in grad_output with the transpose ``jvp``, and for piecewise-linear modules
(``PIECEWISE_LINEAR``: every op but logsumexp and expressions with smooth non-linear parts) its
derivative with respect to the inputs is zero almost everywhere, so double backward is exact;
for the ops smooth between their kinks (hardswish, elu, celu) it is v * g * f''(x)
(``symgrad.curvature``: PyTorch's own formulas under convention='torch', JAX's under 'jax', each
region's second derivative weighted by the tie policy otherwise); for logsumexp that derivative is composed of the module's own backward
and jvp (``SymgradOp._second_order``).  For expressions with smooth non-linear parts double backward
raises a clear error.

Every operator has a fake (meta) implementation with the real output shapes, dtypes and strides
(found by running the NumPy module once on zeros of each new input shape), so the ops trace
under ``torch.compile(fullgraph=True)`` with static shapes and pass ``torch.library.opcheck``.
CPU tensors reach the NumPy module as zero-copy views (``Tensor.numpy()``, ``torch.from_numpy``),
or, for ops made by ``op`` of a kind the cpu backend builds, float32/float64 tensors reach its
module (``backend="cpu"``: compiled C, the same bits) where a C compiler is found
(``$SYMGRAD_CPU_BACKEND``: ``auto``, the default; ``cpu`` to require it; ``numpy`` for the NumPy
module; read when an op first runs on CPU tensors under each setting);
CUDA tensors reach the CUDA module (``backend="cuda"``, CuPy) through DLPack.

The elementwise ops, expressions, pooling (max_pool1d/2d/3d, MaxPool1d/2d/3d, and adaptive:
adaptive_max_pool1d/2d/3d, AdaptiveMaxPool1d/2d/3d, and fractional: fractional_max_pool2d/3d,
the samples given as an input), maxout and unpooling (max_unpool1d/2d/3d,
MaxUnpool1d/2d/3d; the kernels the torch backend builds) take another path under torch.compile
and for tensors on any device but the CPU (CUDA, MPS, XPU, ...): the torch backend's module (``symgrad.load(..., backend="torch")``: plain torch operations, the NumPy
module's bits on the CPU) inside an ``autograd.Function`` that Dynamo traces into, so Inductor
fuses it with its neighbours; no CuPy, no host round trip.  Its backward is torch code, so
autograd differentiates it again (double backward); eagerly off the CPU it has the module's jvp
(forward-mode AD).  Eagerly on the CPU they keep the path above, which is faster for each of them:
forward + backward of 1M float32 elements, one thread, ties="split"
(``python benchmarks/torch_elementwise.py --runs 9 --ops relu hardtanh leaky_relu maximum``, a
2-core machine at load average 7-10, so the figures are rough): the compiled C kernels took
20.2 / 11.0 / 19.8 / 22.5 ms for relu / hardtanh / leaky_relu / maximum, the torch backend's module
called eagerly 31.4 / 33.6 / 71.2 / 42.8 ms (it makes one full-size temporary per operation).
Pooling, maxout and unpooling eagerly on the CPU keep that path too (the compiled C kernels where a C
compiler is found; not measured against the torch module here).  Pooling with
return_indices=True takes its indices from the torch backend's module (torch code on the inputs'
device, traced by torch.compile).  Logsumexp keeps the
registered operators under torch.compile too, and need the NumPy (CPU) or CUDA module.

The order statistics (sort, topk, cummax, cummin, kthvalue, median, nanmedian: PyTorch's
(values, indices) outputs, the indices without gradient) take the torch backend's module on every
device, the CPU included, eagerly and under torch.compile.

Under torch.func (``grad``, ``vmap``, ``jacrev``, ``jacfwd``, ``jvp``, ``hessian``; eagerly) an op
runs through ``symgrad.torch_func``: autograd.Functions of the functorch-ready form (forward,
setup_context, a vmap staticmethod) around the same forward, backward and jvp implementations, so
the gradients are the module's derived ones under its tie policy.  vmap is one merged call for the
elementwise ops, expressions and (adaptive) max pooling (the batch folded into their leading
dims) and a loop over the batch for every other op (torch_func's docstring).  Under torch.compile
of a transform the op is a graph break (fullgraph=True raises), never the torch backend's forward
differentiated without the policy.

The ``nn.Module`` classes (``MaxPool2d``, ``AdaptiveMaxPool3d``, ``ReLU``, ``Hardtanh``, ...)
take torch.nn's constructor arguments plus ``ties``, ``convention``, ``nan`` and ``order``.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading

import numpy as np

try:
    import torch
except ModuleNotFoundError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    if exc.name != "torch":
        raise
    raise ModuleNotFoundError(
        "symgrad.torch needs PyTorch, which is not installed; install it with "
        "pip install torch==2.13.0 (or pip install \".[torch]\" from symgrad's checkout)") from None

from . import api, bridge, curvature, framework_losses, framework_multi_margin, torch_func
from .backends.cpu import THREADS_ENV, framework_threads
from .ops import OPS
from .suggest import unexpected

__all__ = ["op", "expr", "wrap", "SymgradOp",
           "MaxPool1d", "MaxPool2d", "MaxPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
           "AdaptiveMaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d",
           "ReLU", "ReLU6", "Hardtanh", "LeakyReLU"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FLOAT_SET = frozenset(_FLOATS)
_INDEX_DTYPES = frozenset((torch.int32, torch.int64))
_LIBRARY = "symgrad"


# ----------------------------------------------------------------------------- arrays

def _signature(tensors) -> tuple:
    """The inputs' (shape, NumPy dtype): the key of a bridge.Layout."""
    return tuple((tuple(map(int, t.shape)), _numpy_dtype(t.dtype)) for t in tensors)


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """A zero-copy NumPy view of a CPU tensor (bfloat16 as ml_dtypes' bfloat16, through int16)."""
    if t.dtype == torch.bfloat16:
        return t.detach().view(torch.int16).numpy().view(bridge.bfloat16("symgrad.torch"))
    return t.detach().numpy()


def _to_contiguous(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor made contiguous."""
    return t.detach().contiguous().numpy()


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing a's memory (a copy only when a is strided or read-only)."""
    a = np.asarray(a)
    flags = a.flags
    if not (flags.c_contiguous and flags.writeable):
        a = bridge.contiguous(a)
        if not a.flags.writeable:
            a = a.copy()
    if a.dtype.kind == "V":  # ml_dtypes' bfloat16 (NumPy's own dtypes are no kind V): through int16
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# ----------------------------------------------------------------------------- one module

class SymgradOp:
    """A generated module as PyTorch operators; call it on tensors (one per entry of INPUTS).

    Attributes: ``module`` (the NumPy module), ``op``/``params``/``ties`` (its OP, PARAMS and
    TIES), ``name`` (the operators' base name in the ``symgrad`` library).
    """

    def __init__(self, module, cuda_loader=None, cpu_loader=None, torch_module=None):
        self.module = module
        # the torch backend's module (elementwise ops and expressions): run inside an
        # autograd.Function under torch.compile and on devices other than the CPU (None: none)
        self.torch_module = torch_module
        self._native = _native_function(torch_module, self._smooth()) if torch_module is not None else None
        # order statistics ((values, indices) outputs): the torch backend's module on every device
        self._native_only = getattr(OPS.get(module.OP), "kind", None) == "ranking"
        self._cpu_loader = cpu_loader  # () -> the cpu backend's module (None: the NumPy module only)
        # $SYMGRAD_CPU_BACKEND -> _backend's answer for float32/float64 CPU tensors (made once per setting)
        self._cpu = {}  # keyed by the variable's raw value (None: unset), read once a call
        self.op, self.params, self.ties = module.OP, module.PARAMS, module.TIES
        self.inputs = tuple(module.INPUTS)
        self._cuda_loader = cuda_loader  # () -> the CUDA module, loaded on first use
        self._recipe = None  # ("op" | "expr", args, kwargs): how op()/expr() made it, for pickle
        self._curve = None  # curvature.second_derivative, made on first use (hardswish, elu, celu)
        self._layouts = bridge.Layouts(module)  # CPU tensors: the NumPy module's saved state
        self._cuda = None  # CUDA tensors: (the CUDA module, its layouts), on first use
        self._integers = bridge.integer_inputs(module)
        # each input's accepted dtypes (_check_tensor names the others)
        self._accepted = tuple(_INDEX_DTYPES if k in self._integers else _FLOAT_SET for k in range(len(self.inputs)))
        self._differentiable = bridge.differentiable(module)
        stem = module.__name__.rpartition(".")[2]
        self.name = stem.replace("-", "_")
        self._register()

    def __repr__(self) -> str:
        return f"symgrad.torch op {self.name} ({self.op}, ties={self.ties!r}, params={self.params})"

    def __reduce__(self):
        """Pickled as the call that made it (so models holding symgrad ops can be saved whole)."""
        if self._recipe is None:
            raise TypeError(f"{self.op}: an op made by symgrad.torch.wrap cannot be pickled; make "
                            f"it with symgrad.torch.op or symgrad.torch.expr")
        maker, args, kwargs = self._recipe
        return _remake, (maker, args, kwargs)

    # -- calling

    def __call__(self, *tensors):
        if len(tensors) != len(self.inputs):
            raise TypeError(f"{self.op}: expected {len(self.inputs)} tensor(s) "
                            f"({', '.join(self.inputs)}), got {len(tensors)}")
        for t, accepted in zip(tensors, self._accepted):  # (one look-up each where all is well)
            if not (isinstance(t, torch.Tensor) and t.dtype in accepted and t.layout is torch.strided):
                for k, (name, u) in enumerate(zip(self.inputs, tensors)):
                    self._check_tensor(k, name, u)  # raises the error that names the first bad one
        compiling = torch.compiler.is_compiling()
        if torch_func.active():  # torch.func: grad, vmap, jvp, jacrev, jacfwd
            return torch_func.call(self, tensors)
        if self._native is not None:
            if compiling:
                if NATIVE_UNDER_COMPILE:  # plain torch code that Dynamo traces into
                    return self._native[1].apply(*tensors)
            elif not tensors[0].is_cpu or self._native_only:  # every device: the torch backend's module
                return self._native[0].apply(*tensors)
        if compiling:  # the registered operators, which tracing sees
            return self._returned(self._ops[0](list(tensors)), self._layout(tensors))
        if not (torch.is_grad_enabled() and _any_requires_grad(tensors)):
            results = self._run(tensors)[-1]  # no graph: the implementation
            return tuple(results) if len(results) > 1 else results[0]
        # eagerly, the same implementations through autograd.Function: no dispatcher round trips
        return _Forward.apply(self, *tensors)

    @staticmethod
    def _returned(results: list, layout: bridge.Layout):
        """What the op returns of the forward operator's [output, *arrays] (of this layout): the
        output, or with the module's other outputs (an order statistic's int64 indices, no
        gradient) a tuple."""
        extra = layout.extra_outputs
        return (results[0], *results[1:1 + extra]) if extra else results[0]

    def _check_tensor(self, k: int, name: str, t) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{self.op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise TypeError(f"{self.op}: {name} must be a dense (strided) tensor, got layout "
                            f"{t.layout} (convert it with .to_dense())")
        if k in self._integers:
            if t.dtype not in _INDEX_DTYPES:
                raise TypeError(f"{self.op}: {name} must be an int64 or int32 tensor, got {t.dtype}")
        elif t.dtype not in _FLOATS:
            raise TypeError(f"{self.op}: {name} must be a float16, bfloat16, float32 or float64 "
                            f"tensor, got {t.dtype}")

    # -- the implementations

    def _backend(self, tensors):
        """(module, its layouts, to_array, from_array) for the device of these tensors."""
        first = tensors[0]
        if first.is_cpu:
            if first.dtype not in _CPU_BACKEND_DTYPES:
                return self.module, self._layouts, _to_numpy, _from_numpy
            # the cpu backend (compiled C) or the NumPy module, by $SYMGRAD_CPU_BACKEND's raw value
            # (checked by bridge.cpu_backend_choice the first time it is met: one look-up a call)
            raw = os.environ.get(bridge.CPU_BACKEND_ENV)
            found = self._cpu.get(raw)
            if found is None:
                found = self._cpu[raw] = self._cpu_backend(bridge.cpu_backend_choice())
            return found
        device = first.device
        if device.type == "cuda":
            import cupy  # the CUDA module needs it anyway; its absence is reported there
            if self._cuda is None:
                cuda = self._cuda_loader()
                self._cuda = (cuda, bridge.Layouts(cuda, zeros=cupy.zeros))
            cuda, layouts = self._cuda
            return (cuda, layouts, lambda t: cupy.from_dlpack(t.detach().contiguous()),
                    lambda a: torch.from_dlpack(cupy.ascontiguousarray(a)))
        raise ValueError(f"{self.op}: tensors on {device} are not supported (CPU or CUDA)")

    def _cpu_backend(self, choice: str) -> tuple:
        """_backend's answer for float32/float64 CPU tensors under $SYMGRAD_CPU_BACKEND=choice."""
        # (any saved fields: the layouts below are the module's own, under torch.compile too)
        module = bridge.module_for_cpu(self.module, self._cpu_loader, choice, same_fields=False)
        if module is self.module:
            return module, self._layouts, _to_numpy, _from_numpy
        # the cpu backend's saved arrays share one memory order: its arrays made contiguous
        return module, bridge.Layouts(module), _to_contiguous, _from_numpy

    def _layout(self, tensors) -> bridge.Layout:
        return self._backend(tensors)[1].get(_signature(tensors))

    def _run(self, tensors) -> tuple:
        """An eager call of the module: (_backend's answer, the arrays it ran on, its output, its
        Saved value, its threads= keyword, the op's results [output, *other outputs] as tensors).
        Nothing flattened (bridge.split): eager autograd hands the Saved value back as it is."""
        found = module, _, to_array, from_array = self._backend(tensors)
        arrays = [to_array(t) for t in tensors]
        threads = _threads(module)
        output, saved = module.forward(*arrays, **threads)
        results = [_unaliased(from_array(bridge.first(output)), tensors)]
        if isinstance(output, tuple):  # an order statistic's (values, indices)
            results += [from_array(a) for a in output[1:]]
        return found, arrays, output, saved, threads, results

    def _forward_impl(self, tensors: list) -> list:
        """The forward operator's tensors: the output, then the saved arrays (bridge.split)."""
        found, arrays, output, saved, _, results = self._run(tensors)
        return results[:1] + _flattened(found, tensors, arrays, output, saved)

    def _saved(self, inputs, output, arrays):
        """(module, to_array, from_array, its Saved value) for the operators' tensors."""
        module, layouts, to_array, from_array = self._backend(inputs)
        layout = layouts.get(_signature(inputs))
        used = layout.used  # only the tensors the saved state holds become arrays
        saved = bridge.join(module, layout, [to_array(t) if k in used.inputs else None for k, t in enumerate(inputs)],
                            to_array(output) if used.output else None, [to_array(a) for a in arrays])
        return module, to_array, from_array, saved

    def _backward_impl(self, grad_output, inputs: list, output, arrays: list) -> list:
        module, to_array, from_array, saved = self._saved(inputs, output, arrays)
        grads = module.backward(to_array(grad_output.contiguous()), saved, **_threads(module))
        return [from_array(g) for g in grads if g is not None]

    def _jvp_impl(self, tangents: list, inputs: list, output, arrays: list):
        module, to_array, from_array, saved = self._saved(inputs, output, arrays)
        differentiable = iter(tangents)
        ts = [to_array(next(differentiable).contiguous()) if k in self._differentiable else None
              for k in range(len(self.inputs))]
        return from_array(module.jvp(*ts, saved, **_threads(module)))

    # -- registration

    def _register(self) -> None:
        ns = f"{_LIBRARY}::{self.name}"
        me = self

        @torch.library.custom_op(f"{ns}_forward", mutates_args=())
        def forward(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            return me._forward_impl(inputs)

        @forward.register_fake
        def _(inputs):
            layout = me._layout(inputs)
            like = inputs[0]
            (shape, dtype) = layout.output
            out = [like.new_empty(shape, dtype=_torch_dtype(dtype))]
            return out + [like.new_empty(s, dtype=_torch_dtype(d)) for s, d in layout.arrays]

        @torch.library.custom_op(f"{ns}_backward", mutates_args=())
        def backward(grad_output: torch.Tensor, inputs: list[torch.Tensor], output: torch.Tensor,
                     arrays: list[torch.Tensor]) -> list[torch.Tensor]:
            return me._backward_impl(grad_output, inputs, output, arrays)

        @backward.register_fake
        def _(grad_output, inputs, output, arrays):
            return [torch.empty_like(inputs[k], memory_format=torch.contiguous_format)
                    for k in me._differentiable]

        @torch.library.custom_op(f"{ns}_jvp", mutates_args=())
        def jvp(tangents: list[torch.Tensor], inputs: list[torch.Tensor], output: torch.Tensor,
                arrays: list[torch.Tensor]) -> torch.Tensor:
            return me._jvp_impl(tangents, inputs, output, arrays)

        @jvp.register_fake
        def _(tangents, inputs, output, arrays):
            return torch.empty_like(output, memory_format=torch.contiguous_format)

        def setup_forward(ctx, inputs, output):
            (tensors,) = inputs
            out, *arrays = output
            ctx.save_for_backward(*tensors, out, *arrays)
            ctx.n_inputs = len(tensors)
            ctx.mark_non_differentiable(*arrays)

        def backward_of_forward(ctx, grads):
            if grads[0] is None:
                return (None,)
            return (me._input_grads(backward, grads[0], *_unpack(ctx.saved_tensors, ctx.n_inputs)),)

        forward.register_autograd(backward_of_forward, setup_context=setup_forward)

        def setup_backward(ctx, inputs, output):
            grad_output, tensors, out, arrays = inputs
            ctx.save_for_backward(grad_output, *tensors, out, *arrays)
            ctx.n_inputs = len(tensors)

        def backward_of_backward(ctx, grads):
            g, *saved = ctx.saved_tensors
            tensors, out, arrays = _unpack(saved, ctx.n_inputs)
            in_g, in_inputs = me._backward_grads(backward, jvp, g, grads, tensors, out, arrays)
            return in_g, in_inputs, None, [None] * len(arrays)

        backward.register_autograd(backward_of_backward, setup_context=setup_backward)
        self._ops = (forward, backward, jvp)

    def _input_grads(self, backward, grad_output, tensors, out, arrays) -> list:
        """The gradient of every input (None for one backward returns none for), from
        ``backward(grad_output, tensors, output, arrays)``: the registered operator or its eager
        twin.  The output is passed as data, not a path for gradients (a zero gradient sent back
        through it would be 0 * W, NaN where W holds NaN)."""
        got = iter(backward(grad_output, tensors, out.detach(), arrays))
        return [next(got) if k in self._differentiable else None for k in range(len(tensors))]

    def _backward_grads(self, backward, jvp, g, grads, tensors, out, arrays):
        """(gradient in grad_output, gradients in the inputs) of <backward(g), grads>: backward
        is W^T g, so its derivative in g is W (the jvp); in the inputs, _second_order."""
        tangents = [v if v is not None else torch.zeros_like(tensors[k])
                    for v, k in zip(grads, self._differentiable)]
        in_inputs = self._second_order(lambda h: backward(h, tensors, out, arrays),
                                       lambda vs: jvp(vs, tensors, out, arrays), g, tangents, tensors)
        return jvp(tangents, tensors, out, arrays), in_inputs

    def _second_order(self, backward, jvp, g, tangents: list, tensors: list) -> list:
        """The derivative of <backward(g), tangents> in the inputs, from the module's own backward
        and jvp (applied by ``backward(h)`` and ``jvp(vs)``).  Piecewise-linear modules: 0 almost
        everywhere.  The smooth elementwise ops (hardswish, elu, celu): _curvature.  logsumexp
        (y = t log sum exp(x / t); backward g * s, s = softmax(x / t), jvp sum(s * v)):
        (backward(g) * v - backward(g * jvp(v))) / t.  Others: refused."""
        if self.module.PIECEWISE_LINEAR:
            return [None] * len(tensors)
        if self.op in curvature.SMOOTH and self._recipe is not None and self.torch_module is not None:
            return self._curvature(g, tangents, tensors)
        if self.op != "logsumexp" or "expr" in self.params:
            raise NotImplementedError(
                f"{self.op}: double backward is supported for piecewise-linear ops and logsumexp "
                f"only (this expression's backward depends smoothly on its inputs)")
        (v,) = tangents
        (a,) = backward(g)
        (b,) = backward(g * jvp([v]))
        return [(a * v - b) / self.params["temperature"]]

    def _curvature(self, g, tangents: list, tensors: list) -> list:
        """The derivative of <backward(g), tangents> in the input of an op smooth between its
        kinks (hardswish, elu, celu): v * g * f''(x), curvature.py's torch code (PyTorch's own
        formulas under convention='torch'), differentiable again where create_graph is set."""
        (x,), (v,) = tensors, tangents
        return [self._second_derivative()(x, v, g)]

    def _smooth(self):
        """The ops smooth between their kinks: the torch module's backward as an autograd.Function
        whose derivative is curvature.py's (None for the others: autograd differentiates it)."""
        return curvature.smooth_backward(self.module.OP, self._second_derivative)

    def _second_derivative(self):
        """curvature.second_derivative for this op (made once)."""
        if self._curve is None:
            maker, (name,), kwargs = self._recipe
            settings = {k: kwargs.get(k) for k in ("ties", "convention", "nan", "order")}
            self._curve = curvature.second_derivative(name, self.params, settings, self.torch_module, "torch")
        return self._curve

    def _forward(self, tensors: list):
        return self._ops[0](tensors)

    def jvp(self, tangents, tensors):
        """The output's tangent for tangents of the inputs (forward mode, the module's jvp)."""
        forward, _, jvp = self._ops
        out, *arrays = forward(list(tensors))
        ts = [tangents[k] for k in self._differentiable]
        return jvp(ts, list(tensors), out, arrays)


class _Forward(torch.autograd.Function):
    """Eager autograd for SymgradOp.  forward runs the module and keeps its Saved value as it is;
    backward hands that value back to the module's backward (no flattening into tensors and
    rebuilding: the per-call Python work is what an eager step of small tensors pays for, and
    it runs on caches the kernels have just filled with their arrays).  The inputs and the
    output are kept by save_for_backward, so autograd still refuses a second backward of a freed
    graph and a tensor edited in place since the forward.  Double backward (create_graph)
    flattens the value then (bridge.split) and runs _Backward, whose derivative is the jvp."""

    @staticmethod
    def forward(ctx, op: SymgradOp, *tensors):
        ctx.op = op
        ctx.found, ctx.arrays, ctx.output, ctx.saved, ctx.threads, results = op._run(tensors)
        ctx.save_for_backward(*tensors, *results)
        if len(results) > 1:  # an order statistic's indices: no gradient
            ctx.mark_non_differentiable(*results[1:])
            return tuple(results)
        return results[0]

    @staticmethod
    def backward(ctx, grad_output, *_):  # (an order statistic's indices: no gradient)
        op, kept = ctx.op, ctx.saved_tensors
        n = len(ctx.arrays)
        if torch.is_grad_enabled():  # create_graph: a backward that autograd differentiates again
            def backward(g, tensors, out, arrays):
                return _Backward.apply(op, g, len(tensors), *tensors, out, *arrays)
            flat = _flattened(ctx.found, kept[:n], ctx.arrays, ctx.output, ctx.saved)
            return (None, *op._input_grads(backward, grad_output, list(kept[:n]), kept[n], flat))
        module, _, to_array, from_array = ctx.found
        grads = module.backward(to_array(grad_output.contiguous()), ctx.saved, **ctx.threads)
        if len(op._differentiable) == n:  # a gradient for every input
            return (None, *map(from_array, grads))
        got = iter([from_array(g) for g in grads if g is not None])
        return (None, *[next(got) if k in op._differentiable else None for k in range(n)])


def _unaliased(out: torch.Tensor, tensors) -> torch.Tensor:
    """out, or a copy where it shares an input's memory (an operator's output never aliases its input)."""
    address = out.data_ptr()
    for t in tensors:
        if t.data_ptr() == address and t.numel():
            return out.clone()
    return out


def _flattened(found: tuple, tensors, arrays: list, output, saved) -> list:
    """The saved arrays (as tensors) of a forward's Saved value, its layout remembered for this
    input signature (where the operators' backward and jvp find it): what the forward operator
    returns after the output, and what _Backward runs on."""
    _, layouts, _, from_array = found
    layout, flat = bridge.split(arrays, output, saved)
    signature = _signature(tensors)
    if not layouts.known(signature):
        layouts.remember(signature, layout)
    return [from_array(a) for a in flat]


class _Backward(torch.autograd.Function):
    """backward as a function of grad_output (and data): its derivative is the module's jvp."""

    @staticmethod
    def forward(ctx, op: SymgradOp, grad_output, n_inputs: int, *rest):
        tensors, out, arrays = _unpack(rest, n_inputs)
        ctx.op, ctx.n_inputs = op, n_inputs
        ctx.save_for_backward(grad_output, *rest)
        return tuple(op._backward_impl(grad_output, tensors, out, arrays))

    @staticmethod
    def backward(ctx, *grads):
        op, (g, *rest) = ctx.op, ctx.saved_tensors
        tensors, out, arrays = _unpack(rest, ctx.n_inputs)
        in_g, in_inputs = op._backward_grads(op._backward_impl, op._jvp_impl, g, grads, tensors, out, arrays)
        return (None, in_g, None, *in_inputs) + (None,) * (len(rest) - len(tensors))


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as "2.13.0+cpu"."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


# the torch backend's autograd.Function under torch.compile needs PyTorch 2.13 (the version symgrad
# pins and tests): PyTorch 2.11's Dynamo traced it into zero gradients (seen on an H200, on CPU
# and CUDA tensors alike, with the aot_eager backend too); older versions take the registered
# operators under torch.compile
NATIVE_UNDER_COMPILE = _release(torch.__version__) >= (2, 13)


_KEPT = "<a tensor kept by save_for_backward>"  # ctx.rest's mark of such a Saved field (a None field stays None)


def _native_function(module, smooth=None) -> tuple[type, type]:
    """Two autograd.Functions running the torch backend's ``module``: forward saves the tensors
    of the module's Saved (and keeps its other fields), backward calls the module's backward
    (plain torch code, which autograd differentiates again: double backward).  The first also has
    the module's jvp (forward-mode AD), for eager calls; the second has none, for torch.compile
    (Dynamo does not trace an autograd.Function with a custom jvp, and traces through the rest).
    ``smooth`` (curvature.smooth_backward's, for the ops smooth between their kinks) makes their
    backward an autograd.Function with curvature.py's derivative (double backward as the eager
    path's, no NaN where exp overflows off its piece)."""
    wrt = tuple(module.WRT)
    twice = smooth(module) if smooth is not None else None

    def saved_of(ctx):
        tensors = iter(ctx.saved_tensors)
        return module.Saved(*[next(tensors) if v is _KEPT else v for v in ctx.rest])

    def indices_of(ctx, output):
        """An order statistic's (values, indices): the indices have no gradient."""
        if isinstance(output, tuple):
            ctx.mark_non_differentiable(*output[1:])
        ctx.extra_outputs = len(output) - 1 if isinstance(output, tuple) else 0
        return output

    class Traced(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *tensors):
            output, saved = module.forward(*tensors)
            kept = [v for v in saved if isinstance(v, torch.Tensor)]
            ctx.save_for_backward(*kept)
            ctx.rest = tuple(_KEPT if isinstance(v, torch.Tensor) else v for v in saved)
            return indices_of(ctx, output)

        @staticmethod
        def backward(ctx, grad_output, *_):  # (an order statistic's indices: no gradient)
            if twice is not None:  # (hardswish, elu, celu: curvature.smooth_backward)
                return twice(grad_output, saved_of(ctx))
            return module.backward(grad_output, saved_of(ctx))

    class Eager(Traced):
        @staticmethod
        def forward(ctx, *tensors):
            output, saved = module.forward(*tensors)
            kept = [v for v in saved if isinstance(v, torch.Tensor)]
            ctx.save_for_backward(*kept)
            ctx.save_for_forward(*kept)
            ctx.rest = tuple(_KEPT if isinstance(v, torch.Tensor) else v for v in saved)
            return indices_of(ctx, output)

        @staticmethod
        def jvp(ctx, *tangents):
            tangents = [t if name in wrt else None for name, t in zip(module.INPUTS, tangents)]
            out = module.jvp(*tangents, saved_of(ctx))
            return (out,) + (None,) * ctx.extra_outputs if ctx.extra_outputs else out

    for cls, suffix in ((Traced, "traced"), (Eager, "eager")):
        cls.__name__ = cls.__qualname__ = f"symgrad_{module.OP}_{suffix}"
    return Eager, Traced


def _unpack(saved, n_inputs: int) -> tuple[list, torch.Tensor, list]:
    """(inputs, output, saved arrays) of the tensors an operator's autograd keeps, in that order."""
    return list(saved[:n_inputs]), saved[n_inputs], list(saved[n_inputs + 1:])


# torch's dtypes and NumPy's, mapped without making a tensor (under torch.compile's fake mode a
# tensor made here is fake, and has no .numpy()); bfloat16 is ml_dtypes', imported when first met
_NUMPY_DTYPES: dict = {torch.float16: np.dtype(np.float16), torch.float32: np.dtype(np.float32),
                       torch.float64: np.dtype(np.float64), torch.int32: np.dtype(np.int32),
                       torch.int64: np.dtype(np.int64), torch.int16: np.dtype(np.int16),
                       torch.int8: np.dtype(np.int8), torch.uint8: np.dtype(np.uint8),
                       torch.uint16: np.dtype(np.uint16), torch.uint32: np.dtype(np.uint32),
                       torch.uint64: np.dtype(np.uint64), torch.bool: np.dtype(np.bool_)}
_TORCH_DTYPES: dict = {d: t for t, d in _NUMPY_DTYPES.items()}
# the torch dtypes of bridge.CPU_DTYPES: CPU tensors of these may run on the cpu backend
_CPU_BACKEND_DTYPES = frozenset(t for t, d in _NUMPY_DTYPES.items() if d in bridge.CPU_DTYPES)


def _threads(module) -> dict:
    """threads= for the cpu backend's module: PyTorch's intra-op thread count (torch.set_num_threads),
    unless its THREADS or $SYMGRAD_NUM_THREADS is set (OpenMP's default would oversubscribe)."""
    if getattr(module, "THREADS", 0) is None and not os.environ.get(THREADS_ENV):  # the usual case, at a look-up's cost
        return {"threads": torch.get_num_threads()}
    return framework_threads(module, torch.get_num_threads)


def _any_requires_grad(tensors) -> bool:
    for t in tensors:
        if t.requires_grad:
            return True
    return False


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    found = _NUMPY_DTYPES.get(dtype)
    if found is None:
        if dtype != torch.bfloat16:
            raise TypeError(f"symgrad.torch: tensors of {dtype} are not supported")
        found = _NUMPY_DTYPES[dtype] = bridge.bfloat16("symgrad.torch")
    return found


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    if np.dtype(dtype).name == "bfloat16":
        return torch.bfloat16
    return _TORCH_DTYPES[np.dtype(dtype)]


_OPS: dict = {}
_OPS_LOCK = threading.Lock()


def _wrap(module, cuda_loader, cpu_loader=None, torch_loader=None) -> SymgradOp:
    key = module.__name__
    with _OPS_LOCK:
        found = _OPS.get(key)
        if found is None:
            found = _OPS[key] = SymgradOp(module, cuda_loader, cpu_loader, _torch_module(torch_loader))
        else:  # made by wrap() first: what op()/expr() add
            if found._cpu_loader is None and cpu_loader is not None:
                found._cpu_loader = cpu_loader
                found._cpu.clear()
            if found.torch_module is None and torch_loader is not None:
                found.torch_module = _torch_module(torch_loader)
                found._native = _native_function(found.torch_module, found._smooth()) if found.torch_module else None
    return found


def wrap(module, cuda_module=None) -> SymgradOp:
    """A module that symgrad.load or symgrad.load_expr returned (NumPy backend) as torch
    operators; ``cuda_module`` is the same op's CUDA module, for CUDA tensors.  An order
    statistic whose forward returns (values, indices) returns both (the indices int64, without a
    gradient)."""
    bridge.require_module(module, "symgrad.torch.wrap")

    def cuda():
        if cuda_module is None:
            raise ValueError(f"{module.OP}: CUDA tensors need the CUDA module: pass cuda_module="
                             f"symgrad.load(..., backend='cuda') to symgrad.torch.wrap")
        return cuda_module
    return _wrap(module, cuda)


def _torch_module(loader):
    """The torch backend's module from loader(), or None where that backend does not build the
    op's kernel yet (the bags, RoI pooling: they keep the registered operators).  Loaded
    when the op is made, eagerly, never while torch.compile traces."""
    if loader is None:
        return None
    try:
        return loader()
    except ValueError as exc:
        if "torch backend builds" not in str(exc):
            raise
        return None


def _remake(maker: str, args: tuple, kwargs: dict) -> SymgradOp:
    return {"op": op, "expr": expr}[maker](*args, **kwargs)


def _made(found: SymgradOp, maker: str, args: tuple, kwargs: dict) -> SymgradOp:
    if found._recipe is None:
        found._recipe = (maker, args, kwargs)
    return found


def op(name: str, ties: str | None = None, convention: str | None = None, nan: str | None = None,
       order: str | None = None, **params) -> SymgradOp:
    """A symgrad op as a function of torch tensors, with autograd and double backward.

    The arguments are symgrad.load's (any op of ``symgrad list``; the same checks and errors)."""
    api.check_names(name, params)
    module = api.load(name, ties=ties, convention=convention, nan=nan, order=order, **params)
    if params.get("return_indices"):  # PyTorch's (output, indices), the indices from `module`
        settings = dict(ties=ties, convention=convention, nan=nan, order=order)
        native = _torch_module(lambda: api.load(name, backend="torch", **settings, **params))
        return _WithIndices(op(name, **settings, **(params | {"return_indices": False})), module,
                            functools.partial(op, name, **settings, **params), native)
    found = _wrap(module, lambda: api.load(name, backend="cuda", ties=ties, convention=convention,
                                           nan=nan, order=order, **params),
                  lambda: api.load(name, backend="cpu", ties=ties, convention=convention, nan=nan,
                                   order=order, **params),
                  lambda: api.load(name, backend="torch", ties=ties, convention=convention, nan=nan,
                                   order=order, **params))
    return _made(found, "op", (name,), dict(ties=ties, convention=convention, nan=nan, order=order, **params))


class _WithIndices:
    """An op with return_indices=True, as PyTorch's: (output, indices).  The output is the op's
    (autograd, double backward); the indices (int64, no gradient) are the winners' flat positions
    in their (N, C) planes, from a second forward on the detached inputs: of the torch backend's
    module loaded with return_indices=True where that backend builds the op (pooling: plain torch
    code, on the inputs' device, traced by torch.compile), else of the NumPy module (on the CPU)."""

    def __init__(self, fn: SymgradOp, module, recipe, torch_module=None):
        self.fn, self.module, self._recipe = fn, module, recipe
        self.torch_module = torch_module
        self.op, self.params, self.ties = module.OP, module.PARAMS, module.TIES

    def __reduce__(self):
        return self._recipe, ()  # pickled as the call that makes it

    def __repr__(self) -> str:
        return f"symgrad.torch op {self.op} (ties={self.ties!r}, params={self.params})"

    def __call__(self, *tensors):
        output = self.fn(*tensors)  # checks the tensors
        if self.torch_module is not None:
            (_, indices), _ = self.torch_module.forward(*(t.detach() for t in tensors))
            return output, indices
        (_, indices), _ = self.module.forward(*(t.detach().cpu().numpy() for t in tensors))
        return output, torch.from_numpy(indices).to(output.device)


def expr(text: str, inputs=None, wrt=None, ties: str | None = None, name: str | None = None,
         **kwargs) -> SymgradOp:
    """An expression (symgrad.load_expr's arguments) as a function of torch tensors."""
    module = api.load_expr(text, inputs=inputs, wrt=wrt, ties=ties, name=name, **kwargs)
    found = _wrap(module, lambda: api.load_expr(text, inputs=inputs, wrt=wrt, ties=ties, name=name,
                                                backend="cuda", **kwargs),
                  torch_loader=lambda: api.load_expr(text, inputs=inputs, wrt=wrt, ties=ties, name=name,
                                                     backend="torch", **kwargs))
    return _made(found, "expr", (text,), dict(inputs=inputs, wrt=wrt, ties=ties, name=name, **kwargs))


# ----------------------------------------------------------------------------- nn modules

def _settings(ties, convention, nan, order) -> dict:
    return {"ties": ties, "convention": convention, "nan": nan, "order": order}


def _no(flag: bool, what: str, cls: str, why: str = "") -> None:
    if flag:
        raise ValueError(f"{cls}: {what} is not supported by symgrad.torch{why}")


class _Module(torch.nn.Module):
    """symgrad.torch's nn.Modules: a keyword argument a constructor does not take is a one-line
    TypeError with the closest name it takes (the CLI's did-you-mean) and all of them."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        names = [n for n in inspect.signature(init).parameters if n != "self"]

        @functools.wraps(init)
        def checked(self, *args, **kw):
            wrong = set(kw) - set(names)
            if wrong:
                raise unexpected(type(self).__name__, "keyword argument", wrong, names)
            init(self, *args, **kw)
        cls.__init__ = checked


class _OneInput(_Module):
    """An nn.Module around one symgrad op of one input (self.fn)."""

    def forward(self, x):
        return self.fn(x)

    def extra_repr(self) -> str:
        return f"{self.fn.params}, ties={self.fn.ties!r}"


class _Pool(_OneInput):
    _op = ""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False, *, ties=None, convention=None, nan=None, order=None):
        super().__init__()
        self.fn = op(self._op, kernel_size=kernel_size, stride=stride, padding=padding,
                     dilation=dilation, ceil_mode=ceil_mode, return_indices=return_indices,
                     **_settings(ties, convention, nan, order))


class MaxPool1d(_Pool):
    _op = "max_pool1d"


class MaxPool2d(_Pool):
    _op = "max_pool2d"


class MaxPool3d(_Pool):
    _op = "max_pool3d"


class _AdaptivePool(_OneInput):
    _op = ""

    def __init__(self, output_size, return_indices=False, *, ties=None, convention=None, nan=None,
                 order=None):
        super().__init__()
        self.fn = op(self._op, output_size=output_size, return_indices=return_indices,
                     **_settings(ties, convention, nan, order))


class AdaptiveMaxPool1d(_AdaptivePool):
    _op = "adaptive_max_pool1d"


class AdaptiveMaxPool2d(_AdaptivePool):
    _op = "adaptive_max_pool2d"


class AdaptiveMaxPool3d(_AdaptivePool):
    _op = "adaptive_max_pool3d"


class _Unpool(_Module):
    _op = ""

    def __init__(self, kernel_size, stride=None, padding=0, *, ties=None, convention=None,
                 nan=None, order=None):
        super().__init__()
        self._args = dict(kernel_size=kernel_size, stride=stride, padding=padding,
                          **_settings(ties, convention, nan, order))
        self.fn = op(self._op, **self._args)

    def forward(self, input, indices, output_size=None):
        if output_size is None:
            return self.fn(input, indices)
        spatial = self.fn.module.SPATIAL  # torch.nn accepts (N, C, *spatial) too: the spatial part
        return op(self._op, output_size=tuple(output_size)[-spatial:], **self._args)(input, indices)


class MaxUnpool1d(_Unpool):
    _op = "max_unpool1d"


class MaxUnpool2d(_Unpool):
    _op = "max_unpool2d"


class MaxUnpool3d(_Unpool):
    _op = "max_unpool3d"


class _Activation(_OneInput):
    def __init__(self, name: str, params: dict, inplace: bool, settings: dict):
        super().__init__()
        _no(inplace, "inplace=True", type(self).__name__)
        self.fn = op(name, **params, **settings)


class ReLU(_Activation):
    def __init__(self, inplace=False, *, ties=None, convention=None, nan=None, order=None):
        super().__init__("relu", {}, inplace, _settings(ties, convention, nan, order))


class ReLU6(_Activation):
    def __init__(self, inplace=False, *, ties=None, convention=None, nan=None, order=None):
        super().__init__("relu6", {}, inplace, _settings(ties, convention, nan, order))


class Hardtanh(_Activation):
    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False, *, ties=None, convention=None,
                 nan=None, order=None):
        super().__init__("hardtanh", {"min_val": min_val, "max_val": max_val}, inplace,
                         _settings(ties, convention, nan, order))


class LeakyReLU(_Activation):
    def __init__(self, negative_slope=0.01, inplace=False, *, ties=None, convention=None,
                 nan=None, order=None):
        super().__init__("leaky_relu", {"negative_slope": negative_slope}, inplace,
                         _settings(ties, convention, nan, order))


# ----------------------------------------------------------------------------- segments (issue 33)

class GlobalMaxPool(_Module):
    """PyTorch Geometric's ``global_max_pool(x, batch, size)`` as an nn.Module: each graph's
    feature-wise max over its nodes (x: (N, ...), batch: (N,) the graph of each node, in any
    order), through symgrad's scatter_max (dim 0, include_self=False, onto zeros: a graph with no
    node gives 0, as PyG's ``scatter(..., reduce="max")``) under a chosen tie policy.  Its backward
    is a gather (each node reads its graph's winner or count): deterministic on a GPU, where PyG's
    CUDA scatter max picks a tied winner by a race.  ``size``, the number of graphs, defaults to
    batch.max() + 1, read eagerly: pass it under torch.compile(fullgraph=True)."""

    def __init__(self, *, ties=None, convention=None, nan=None, order=None):
        super().__init__()
        self.fn = op("scatter_max", dim=0, include_self=False, **_settings(ties, convention, nan, order))

    def forward(self, x, batch, size=None):
        if not isinstance(x, torch.Tensor) or x.ndim == 0:
            raise ValueError(f"GlobalMaxPool: x must be a tensor of at least 1 dim (nodes first), got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        if not isinstance(batch, torch.Tensor) or tuple(batch.shape) != tuple(x.shape[:1]):
            raise ValueError(f"GlobalMaxPool: batch must be a tensor of shape ({x.shape[0]},) (the graph "
                             f"of each node), got {getattr(batch, 'shape', type(batch).__name__)}")
        if size is None:
            size = int(batch.max()) + 1 if batch.numel() else 0
        index = batch.reshape((-1,) + (1,) * (x.ndim - 1)).expand(x.shape)
        return self.fn(x.new_zeros((size,) + tuple(x.shape[1:])), index, x)

    def extra_repr(self) -> str:
        return f"ties={self.fn.ties!r}"


__all__.append("GlobalMaxPool")


# ----------------------------------------------------------------------------- bags (issue 33)

class EmbeddingBag(_Module):
    """``torch.nn.EmbeddingBag(num_embeddings, embedding_dim, mode="max", ...)`` through symgrad's
    embedding_bag_max under a chosen tie policy (convention='torch': PyTorch's CPU rule, bit for
    bit); its parameter ``weight`` as PyTorch's (N(0, 1), padding_idx's row zeroed, or ``_weight``).
    The gradient reaches weight only, each bag's added onto its winner's (or hits') table rows in
    index order.  mode must be "max"; max_norm, scale_grad_by_freq, sparse and per_sample_weights
    are not supported."""

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, mode="max", sparse=False, _weight=None,
                 include_last_offset=False, padding_idx=None, device=None, dtype=None, *, ties=None,
                 convention=None, nan=None):
        super().__init__()
        _no(mode != "max", f"mode={mode!r}", "EmbeddingBag", " (embedding_bag_max: mode 'max' only)")
        for flag, what in ((max_norm is not None, "max_norm"), (scale_grad_by_freq, "scale_grad_by_freq"),
                           (sparse, "sparse")):
            _no(flag, what, "EmbeddingBag")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.include_last_offset, self.padding_idx, self.mode = include_last_offset, padding_idx, mode
        self.fn = op("embedding_bag_max", include_last_offset=include_last_offset, padding_idx=padding_idx,
                     **_settings(ties, convention, nan, None))
        if _weight is None:
            _weight = torch.empty((num_embeddings, embedding_dim), device=device, dtype=dtype).normal_()
            if padding_idx is not None:
                with torch.no_grad():
                    _weight[padding_idx].fill_(0)
        self.weight = torch.nn.Parameter(_weight)

    def forward(self, input, offsets=None, per_sample_weights=None):
        _no(per_sample_weights is not None, "per_sample_weights", "EmbeddingBag", " (mode 'max')")
        if isinstance(input, torch.Tensor) and input.ndim == 2 and offsets is None:  # a bag per row
            input, offsets = bridge.bags_per_row(input, self.include_last_offset,
                                                 lambda n: torch.arange(n, device=input.device))
        return self.fn(input, self.weight, offsets)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, mode='max', ties={self.fn.ties!r}"
                + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""))


__all__.append("EmbeddingBag")


class RoIPool(_Module):
    """``torchvision.ops.RoIPool(output_size, spatial_scale)`` through symgrad's roi_max_pool under a
    chosen tie policy (convention='torch': torchvision's CPU rule); ``forward(input, rois)`` with
    rois a (K, 5) tensor of (batch index, x1, y1, x2, y2) in input's dtype (a list of boxes per
    image is not taken).  Its backward adds each bin's gradient in (box, bin) order, no atomics."""

    def __init__(self, output_size, spatial_scale: float, *, ties=None, convention=None, nan=None):
        super().__init__()
        self.output_size, self.spatial_scale = output_size, spatial_scale
        self.fn = op("roi_max_pool", output_size=output_size, spatial_scale=spatial_scale,
                     **_settings(ties, convention, nan, None))

    def forward(self, input, rois):
        if not isinstance(rois, torch.Tensor):
            raise TypeError(f"RoIPool: rois must be a (K, 5) tensor of (batch index, x1, y1, x2, y2), "
                            f"got {type(rois).__name__}")
        return self.fn(input, rois.to(input.dtype))

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, ties={self.fn.ties!r}"


__all__.append("RoIPool")


# ----------------------------------------------------------------------------- losses (issue 30)

def _loss(name: str, inputs: tuple, margin, reduction, settings: dict):
    fn = framework_losses.kink(op, name, margin, settings)
    return framework_losses.loss(name, fn, torch, inputs, reduction)


def l1_loss(input, target, *, reduction="mean", ties=None, convention=None, nan=None):
    """F.l1_loss(input, target, reduction=...) through symgrad's l1_loss (framework_losses.py);
    under torch.compile use L1Loss (its op is made in the constructor)."""
    return _loss("l1_loss", (input, target), None, reduction, _settings(ties, convention, nan, None))


def margin_ranking_loss(input1, input2, target, margin=0.0, *, reduction="mean", ties=None,
                        convention=None, nan=None):
    """F.margin_ranking_loss(input1, input2, target, margin, reduction=...) (framework_losses.py)."""
    return _loss("margin_ranking_loss", (input1, input2, target), margin, reduction,
                 _settings(ties, convention, nan, None))


def hinge_embedding_loss(input, target, margin=1.0, *, reduction="mean", ties=None, convention=None,
                         nan=None):
    """F.hinge_embedding_loss(input, target, margin, reduction=...) (framework_losses.py)."""
    return _loss("hinge_embedding_loss", (input, target), margin, reduction, _settings(ties, convention, nan, None))


class _Loss(_Module):
    """torch.nn's loss modules (the op made here, eagerly: torch.compile traces forward)."""
    _name = ""

    def __init__(self, margin, size_average, reduce, reduction, settings):
        super().__init__()
        _no(size_average is not None or reduce is not None, "size_average/reduce (deprecated)", type(self).__name__)
        framework_losses.losses.check_reduction(self._name, reduction)
        self.margin, self.reduction = margin, reduction
        self.fn = framework_losses.kink(op, self._name, margin, settings)

    def forward(self, *inputs):
        return framework_losses.loss(self._name, self.fn, torch, inputs, self.reduction)

    def extra_repr(self) -> str:
        return (f"margin={self.margin}, " if self.margin is not None else "") + \
            f"reduction={self.reduction!r}, ties={self.fn.ties!r}"


class L1Loss(_Loss):
    _name = "l1_loss"

    def __init__(self, size_average=None, reduce=None, reduction="mean", *, ties=None, convention=None, nan=None):
        super().__init__(None, size_average, reduce, reduction, _settings(ties, convention, nan, None))


class MarginRankingLoss(_Loss):
    _name = "margin_ranking_loss"

    def __init__(self, margin=0.0, size_average=None, reduce=None, reduction="mean", *, ties=None,
                 convention=None, nan=None):
        super().__init__(margin, size_average, reduce, reduction, _settings(ties, convention, nan, None))


class HingeEmbeddingLoss(_Loss):
    _name = "hinge_embedding_loss"

    def __init__(self, margin=1.0, size_average=None, reduce=None, reduction="mean", *, ties=None,
                 convention=None, nan=None):
        super().__init__(margin, size_average, reduce, reduction, _settings(ties, convention, nan, None))


__all__ += ["l1_loss", "margin_ranking_loss", "hinge_embedding_loss", "L1Loss", "MarginRankingLoss",
            "HingeEmbeddingLoss"]


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, *, reduction="mean", ties=None,
                      convention=None, nan=None):
    """F.multi_margin_loss(input, target, p=1, margin, weight, reduction=...) (framework_multi_margin.py)."""
    margin, reduction, kink = framework_multi_margin.settings_of(p, margin, reduction,
                                                                 _settings(ties, convention, nan, None))
    return framework_multi_margin.torch_loss(kink)(input, target, margin, weight, reduction)


class MultiMarginLoss(_Module):
    """torch.nn.MultiMarginLoss (p=1; weight a buffer, as torch.nn's) through symgrad's hinge."""

    def __init__(self, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean", *,
                 ties=None, convention=None, nan=None):
        super().__init__()
        _no(size_average is not None or reduce is not None, "size_average/reduce (deprecated)", "MultiMarginLoss")
        self.p = p
        self.margin, self.reduction, kink = framework_multi_margin.settings_of(
            p, margin, reduction, _settings(ties, convention, nan, None))
        self.register_buffer("weight", weight)
        self.fn, self.ties = framework_multi_margin.torch_loss(kink), kink["ties"]

    def forward(self, input, target):
        return self.fn(input, target, self.margin, self.weight, self.reduction)

    def extra_repr(self) -> str:
        return f"p={self.p}, margin={self.margin}, reduction={self.reduction!r}, ties={self.ties!r}"


__all__ += ["multi_margin_loss", "MultiMarginLoss"]
