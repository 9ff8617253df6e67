"""The jax backend: an op's lowered kernel printed by ``printer.JaxCodePrinter`` as a JAX module
(jax.numpy and lax only: no host callback, no branch on array values), so it runs under jit, vmap,
grad and on every device JAX has.  Its interface is the NumPy module's: ``forward(*inputs) ->
(output, saved)``, ``backward(grad_output, saved)``, ``jvp(*tangents, saved)``, with the same
results bit for bit on the CPU.

It builds the kernels whose form is ``lower.ElementwiseKernel`` (the elementwise ops and
expressions); for the others ``render`` raises a ValueError naming the numpy backend."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import sympy as sp

from ... import naming
from ...lower import ElementwiseKernel, backward_plan
from ..common import docstring, environment, header
from ..host import preamble_context

# the paragraph the module's docstring ends with
JAX_NOTE = [
    "A JAX module (jax.numpy only: no host callback, no branch on array values), so forward, backward",
    "and jvp run under jax.jit, jax.vmap and jax.grad, on every device JAX has; on the CPU they give",
    "the NumPy backend's module's results bit for bit (where a broadcast input's gradient is summed,",
    "XLA adds in its own order: the same bits where the sums are exact)."]
from .printer import jax_code

if TYPE_CHECKING:  # the lowering hands its Artifacts to the backends
    from ...lower import Artifacts


# the templates, by the type of the lowered kernel
_TEMPLATES = {ElementwiseKernel: "jax/elementwise.py.jinja"}
FORMS = tuple(t.__name__ for t in _TEMPLATES)  # the kernel forms it builds (lower.kernel_form)


def _templates():
    return environment("jax", Path(__file__).parent / "templates")


def file_names(op) -> tuple[str, ...]:
    """The module (``<module name>_jax.py``: beside the NumPy module's file in one folder)."""
    return (naming.module_name(op) + "_jax.py",)


def render(art: Artifacts) -> dict[str, str]:
    """{file name: file text}: the JAX module of an op."""
    template = _TEMPLATES.get(type(art.kernel))
    if template is None:
        raise ValueError(f"{art.op.name}: the jax backend builds elementwise kernels (ops and "
                         f"expressions) only, not a {type(art.kernel).__name__}; use "
                         f"backend='numpy' (symgrad.jax.op runs it through a host callback)")
    ctx = context(art)
    return {file_names(art.op)[0]: _templates().get_template(template).render(**ctx)}


_GRADIENTS_DOC = "The gradient of every input that backward returns, in grad_output's shape (or a scalar)."


def _low_precision(op) -> dict:
    """How float16 and bfloat16 are computed, as the NumPy module computes them: in float32 and
    rounded once where the op computes half in float (a preset's half_in_float: both) or where
    it is bfloat16 outside a preset (the NumPy module's bfloat16 path); else in the dtype
    itself, each operation rounded (float16 in NumPy; bfloat16 under a preset, as JAX and
    PyTorch's clamp compute it)."""
    if op.half_in_float:
        wide = ("float16", "bfloat16")
        note = "float16 and bfloat16 are computed in float32 and rounded once (the op's convention)."
    elif op.convention:
        wide = ()
        note = ("float16 and bfloat16 are computed in their own dtype, each product, sum and "
                "quotient rounded (the op's convention, as the framework computes them).")
    else:
        wide = ("bfloat16",)
        note = ("bfloat16 is computed in float32 and rounded once; float16 in float16, each "
                "product, sum and quotient rounded (as NumPy computes float16).")
    return {"wide": repr(wide), "low_precision_note": note}


def context(art: Artifacts) -> dict:
    """The template context of an op's JAX module: finished strings only."""
    op, d, kernel = art.op, art.derivation, art.kernel
    wrt = tuple(kernel.wrt) if kernel.wrt is not None else tuple(kernel.inputs)
    # an expression shares nothing between its gradients' statements beyond what the NumPy module
    # shares: the same plan, so the same operations in the same order
    back_inter, shared, grads = backward_plan(kernel, wrt)
    inputs = list(kernel.inputs)
    output_lines = [(a.name, jax_code(a.expr)) for a in kernel.intermediates]
    gradient_lines = [(a.name, jax_code(a.expr)) for a in back_inter + shared + grads]
    code = "\n".join([c for _, c in output_lines + gradient_lines] + [jax_code(kernel.output)])
    helpers = [name for name in ("_maximum", "_minimum") if f"{name}(" in code]
    return {
        **preamble_context(header(op, "jax"), JAX_NOTE, ()),
        "docstring": docstring(op, d, kernel),
        "op": op.name, "ties": op.ties, "params": repr(op.params),
        "inputs": inputs,
        "inputs_tuple": repr(tuple(inputs)),
        "wrt_tuple": repr(wrt),
        "returned": [name for name in inputs if name in wrt],
        "piecewise_linear": art.piecewise_linear,
        "output_intermediates": output_lines,
        "output": jax_code(kernel.output),
        "gradient_lines": gradient_lines,
        "helpers": helpers,
        **_low_precision(op),
    }
