"""symgrad.torch ops under torch.func (grad, vmap, jacrev, jacfwd, jvp, hessian), with symgrad's
derived backward and jvp.

torch.func refuses an autograd.Function whose forward takes ctx (symgrad.torch's eager
``_Forward``), and cannot hand a transformed (wrapped) tensor to the NumPy or C module.  Under a
torch.func transform ``SymgradOp.__call__`` calls ``call`` instead: three autograd.Functions of
the functorch-ready form (``forward`` without ctx, ``setup_context``, a ``vmap`` staticmethod),
whose forward runs on plain tensors, below every transform, through the same implementations as
the registered operators (``SymgradOp._forward_impl``, ``_backward_impl``, ``_jvp_impl``):

* ``_Forward``: the inputs -> the output and the module's saved arrays; backward is ``_Backward``
  (the module's backward), jvp is ``_Jvp`` (the module's jvp);
* ``_Backward``: grad_output, the inputs, the output and the saved arrays -> the gradients; its
  derivative is the module's jvp in grad_output and ``SymgradOp._second_order`` in the inputs (0
  for the piecewise-linear ops), so grad of grad and hessian (jacrev of jacrev) work;
* ``_Jvp``: tangents, the inputs, the output and the saved arrays -> the output's tangent.

So the tie policy is the module's under every transform.  ``vmap`` of each of them (and so
vmap(grad), jacrev and jacfwd, which vmap the backward or the jvp) merges the batch into the
op's own leading dims where the op is batch-agnostic over them: the elementwise ops and
expressions (inputs of one shape: the batch and every dim flattened into one) and max pooling and
adaptive max pooling (the batch and the dims before (C, *spatial) flattened into N); the result
is one call of the module, checked against the saved state's shapes.  Every other op (the
reductions, whose ``dim`` a merged batch would move, maxout, fractional pooling, unpooling,
the segments, bags and order statistics) and every other case (a broadcast between inputs, an
empty batch) is a Python loop over the batch: one call per example, stacked.

Under torch.compile of a transform (torch.compile(torch.func.grad(f))) ``call`` is not traced
(torch.compiler.disable: a graph break; fullgraph=True raises): Dynamo would otherwise trace the
torch backend's forward and differentiate it, without the tie policy.
"""

from __future__ import annotations

import math

import torch

from .ops import OPS

# the op kinds batch-agnostic over their leading dims: the number of trailing dims each example
# keeps as it is (None: the op's spatial dims + 1, the channel)
_MERGED_KINDS = {"elementwise": 0, "expression": 0, "pool": None, "adaptive": None}


def active() -> bool:
    """Whether a torch.func transform (grad, vmap, jvp, ...) is active."""
    return torch._C._are_functorch_transforms_active()


@torch.compiler.disable
def call(op, tensors):
    """op(*tensors) under a torch.func transform: what SymgradOp.__call__ returns (never traced by
    torch.compile: see _apply)."""
    results = _apply(_Forward, op, *tensors)
    return op._returned(list(results), op._layout(tensors))


@torch.compiler.disable
def _apply(function, *args):
    """function.apply(*args), never traced by torch.compile: the implementations run NumPy or C
    code, so a compiled torch.func transform breaks its graph here (fullgraph=True: an error)
    instead of differentiating the torch backend's forward without the policy."""
    return function.apply(*args)


# ----------------------------------------------------------------------------- the functions

class _Forward(torch.autograd.Function):
    """The module's forward: (op, *inputs) -> (output, *saved arrays)."""

    @staticmethod
    def forward(op, *tensors):
        return tuple(op._forward_impl(list(tensors)))

    @staticmethod
    def setup_context(ctx, inputs, output):
        op, *tensors = inputs
        out, *arrays = output
        ctx.op, ctx.n_inputs = op, len(tensors)
        ctx.mark_non_differentiable(*arrays)
        ctx.save_for_backward(*tensors, out, *arrays)
        ctx.save_for_forward(*tensors, out, *arrays)

    @staticmethod
    def backward(ctx, grad_output, *_):
        op = ctx.op
        tensors, out, arrays = _unpack(ctx.saved_tensors, ctx.n_inputs)
        if grad_output is None:
            return (None,) * (1 + ctx.n_inputs)
        return (None, *op._input_grads(_backward(op), grad_output, tensors, out, arrays))

    @staticmethod
    def jvp(ctx, _, *tangents):
        op = ctx.op
        tensors, out, arrays = _unpack(ctx.saved_tensors, ctx.n_inputs)
        ts = [_tangent(tangents[k], tensors[k]) for k in op._differentiable]
        return (_jvp(op)(ts, tensors, out, arrays),) + (None,) * len(arrays)

    @staticmethod
    def vmap(info, in_dims, op, *tensors):
        return _vmapped(_Forward, info, in_dims[1:], (op,), tensors, op, len(tensors))


class _Backward(torch.autograd.Function):
    """The module's backward: (op, n_inputs, grad_output, *inputs, output, *arrays) -> the gradients
    of the differentiable inputs."""

    @staticmethod
    def forward(op, n_inputs, grad_output, *rest):
        tensors, out, arrays = _unpack(rest, n_inputs)
        return tuple(op._backward_impl(grad_output, tensors, out, arrays))

    @staticmethod
    def setup_context(ctx, inputs, output):
        op, n_inputs, grad_output, *rest = inputs
        ctx.op, ctx.n_inputs = op, n_inputs
        ctx.save_for_backward(grad_output, *rest)
        ctx.save_for_forward(grad_output, *rest)

    @staticmethod
    def backward(ctx, *grads):
        op, (g, *rest) = ctx.op, ctx.saved_tensors
        tensors, out, arrays = _unpack(rest, ctx.n_inputs)
        in_g, in_inputs = op._backward_grads(_backward(op), _jvp(op), g, grads, tensors, out, arrays)
        return (None, None, in_g, *in_inputs) + (None,) * (len(rest) - len(tensors))

    @staticmethod
    def jvp(ctx, _, __, g_tangent, *___):
        """backward is linear in grad_output; for the piecewise-linear ops its derivative in the
        inputs is 0 almost everywhere (jacfwd of jacrev, hessian)."""
        op, (g, *rest) = ctx.op, ctx.saved_tensors
        if not op.module.PIECEWISE_LINEAR:
            raise NotImplementedError(f"{op.op}: forward mode over symgrad.torch's backward is supported "
                                      f"for the piecewise-linear ops only (use jacrev of jacrev)")
        return _backward(op)(_tangent(g_tangent, g), *_unpack(rest, ctx.n_inputs))

    @staticmethod
    def vmap(info, in_dims, op, n_inputs, *tensors):
        return _vmapped(_Backward, info, in_dims[2:], (op, n_inputs), tensors, op, n_inputs, 1)


class _Jvp(torch.autograd.Function):
    """The module's jvp: (op, n_inputs, *tangents, *inputs, output, *arrays) -> the output's
    tangent (one tangent per differentiable input).  Linear in the tangents; reverse mode through
    it is not derived (jacrev of jacfwd: use jacrev of jacrev)."""

    @staticmethod
    def forward(op, n_inputs, *rest):
        ts, rest = rest[:len(op._differentiable)], rest[len(op._differentiable):]
        tensors, out, arrays = _unpack(rest, n_inputs)
        return op._jvp_impl(list(ts), tensors, out, arrays)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.op = inputs[0]

    @staticmethod
    def backward(ctx, *_):
        raise NotImplementedError(f"{ctx.op.op}: reverse mode over symgrad.torch's jvp is not supported "
                                  f"under torch.func (use jacrev of jacrev, or hessian)")

    @staticmethod
    def vmap(info, in_dims, op, n_inputs, *tensors):
        lead = len(op._differentiable)
        return _vmapped(_Jvp, info, in_dims[2:], (op, n_inputs), tensors, op, n_inputs, lead)


def _backward(op):
    """backward(g, tensors, out, arrays) through _Backward (op._input_grads' argument)."""
    return lambda g, tensors, out, arrays: _apply(_Backward, op, len(tensors), g, *tensors, out, *arrays)


def _jvp(op):
    """jvp(tangents, tensors, out, arrays) through _Jvp."""
    return lambda ts, tensors, out, arrays: _apply(_Jvp, op, len(tensors), *ts, *tensors, out, *arrays)


def _tangent(t, like):
    return t if t is not None else torch.zeros_like(like)


def _unpack(saved, n_inputs: int) -> tuple[list, torch.Tensor, list]:
    """(inputs, output, saved arrays) of a flat sequence of tensors, in that order."""
    return list(saved[:n_inputs]), saved[n_inputs], list(saved[n_inputs + 1:])


# ----------------------------------------------------------------------------- vmap

def _vmapped(function, info, in_dims, head: tuple, tensors, op, n_inputs: int, before: int = 0):
    """function.apply(*head, *tensors) over a batch (in_dims: each tensor's batch dim or None):
    one merged call where op allows it (_merge), else a loop over the batch.  The tensors are
    ``before`` tensors (grad_output, tangents), then the n_inputs inputs, the output, the arrays."""
    size = info.batch_size
    moved = [t if d is None else t.movedim(d, 0) for t, d in zip(tensors, in_dims)]
    full = [t if d is not None else t.expand(size, *t.shape) for t, d in zip(moved, in_dims)]
    merged = _merge(function, op, full, before, n_inputs, size)
    if merged is not None:
        args, shapes = merged
        results = _tuple(_apply(function, *head, *args))
        out = tuple(r.reshape(shape) for r, shape in zip(results, shapes))
    else:
        out = _loop(function, head, full, size)
    if function is _Jvp:  # one tensor
        return out[0], 0
    return out, (0,) * len(out)


def _tuple(results) -> tuple:
    return results if isinstance(results, tuple) else (results,)


def _loop(function, head: tuple, full: list, size: int) -> tuple:
    """One call per example, each result stacked along a new dim 0."""
    if size == 0:
        raise ValueError("symgrad.torch under vmap: an empty batch is not supported for this op")
    per = [_tuple(_apply(function, *head, *(t[b] for t in full))) for b in range(size)]
    return tuple(torch.stack(column) for column in zip(*per))


def _core(op) -> int | None:
    """How many trailing dims of an input one example of op keeps (None: op is not batch-agnostic)."""
    kind = "expression" if "expr" in op.params else getattr(OPS.get(op.op), "kind", None)
    if kind not in _MERGED_KINDS:
        return None
    core = _MERGED_KINDS[kind]
    return core if core is not None else op.module.SPATIAL + 1


def _merge(function, op, full: list, before: int, n_inputs: int, size: int):
    """(the tensors with the batch merged into their leading dims, the shapes to give back each
    result) for one call of op's function, or None where op needs a loop: an op whose kind is not
    batch-agnostic, inputs of different shapes, an empty batch, or saved arrays whose shapes do not
    follow the inputs' leading dims."""
    core = _core(op)
    inputs = full[before:before + n_inputs]
    example = tuple(inputs[0].shape[1:])
    if core is None or size == 0 or any(tuple(t.shape[1:]) != example for t in inputs) or len(example) < core:
        return None
    lead = example[:len(example) - core]
    rows = size * math.prod(lead)
    merged_inputs = [t.reshape(rows, *t.shape[1 + len(lead):]) for t in inputs]
    slice_layout = op._layout([t[0] for t in inputs])
    layout = op._layout(merged_inputs)
    ends = [*layout.arrays, layout.output]
    slices = [*slice_layout.arrays, slice_layout.output]
    if any(len(s) < len(lead) or tuple(s[:len(lead)]) != lead or (rows, *s[len(lead):]) != tuple(m)
           for (m, _), (s, _) in zip(ends, slices)):
        return None
    args = [t.reshape(rows, *t.shape[1 + len(lead):]) for t in full]
    return args, _result_shapes(function, op, full[before:before + n_inputs], size, slice_layout)


def _result_shapes(function, op, inputs: list, size: int, slice_layout) -> list:
    """The batched shape of each result of function (its batched inputs ``inputs``): _Forward's
    (output, *arrays), _Backward's gradients (the differentiable inputs'), _Jvp's output."""
    if function is _Forward:
        return [(size, *s) for s, _ in (slice_layout.output, *slice_layout.arrays)]
    if function is _Backward:
        return [tuple(inputs[k].shape) for k in op._differentiable]
    return [(size, *slice_layout.output[0])]
