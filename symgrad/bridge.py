"""What the framework bridges (symgrad.torch, symgrad.jax) share: a generated module's saved
state as a flat list of arrays, and back.

A framework operator can pass only arrays between its forward, backward and jvp, while a module's
``Saved`` also holds shapes, a dtype and references to its inputs and output.  A ``Layout``
records, for one input signature (shapes and dtypes), where each field of ``Saved`` comes from:
a saved array (returned by the forward operator), an input, the output, or a fixed Python value.
The saved state's shapes and dtypes depend on the input shapes and dtypes only, so the layout
of a signature is known before any data flows (``layout_for`` runs the module once on zeros),
which is what the frameworks' tracing (torch.compile's fake tensors, jax.jit) needs.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import NamedTuple

import numpy as np

from .ops import OPS


class Field(NamedTuple):
    """Where one field of Saved comes from: "array" (position among the saved arrays), "input"
    (position among the inputs), "output", or "value" (a fixed Python value)."""

    source: str
    at: int = 0
    value: object = None


class Used(NamedTuple):
    """What a layout's fields refer to besides the saved arrays."""

    inputs: frozenset  # positions of the inputs Saved holds
    output: bool  # whether Saved holds the output


class Layout(NamedTuple):
    """The forward's results for one input signature."""

    fields: tuple  # one Field per field of Saved
    arrays: tuple  # (shape, NumPy dtype) of every saved array, in order
    output: tuple  # (shape, NumPy dtype) of the output
    # how many of the arrays, first, are outputs besides the output (an order statistic's
    # (values, indices): its indices), returned by the op too
    extra_outputs: int = 0

    @property
    def used(self) -> Used:
        """The inputs and whether the output join() reads (the others may be passed as None)."""
        return Used(frozenset(f.at for f in self.fields if f.source == "input"),
                    any(f.source == "output" for f in self.fields))


def contiguous(a: np.ndarray) -> np.ndarray:
    """a, or a C-contiguous copy (0-d arrays stay 0-d, unlike np.ascontiguousarray)."""
    return a if a.flags.c_contiguous else np.array(a, order="C")


def split(inputs: list, output, saved) -> tuple[Layout, list]:
    """The layout of a forward's result and the saved arrays to return: those that are neither an
    input nor the output (which the operators pass by reference, never twice).  A tuple output
    (an order statistic's (values, indices)) is its first array; the others (integer, no
    gradient) come first among the arrays."""
    extra = list(output[1:]) if isinstance(output, tuple) else []
    output = output[0] if isinstance(output, tuple) else output
    fields, arrays = [], [contiguous(a) for a in extra]
    for value in saved:
        if isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__"):
            k = next((k for k, x in enumerate(inputs) if value is x), None)
            j = next((j for j, x in enumerate(extra) if value is x), None)
            if k is not None:
                fields.append(Field("input", k))
            elif value is output:
                fields.append(Field("output"))
            elif j is not None:
                fields.append(Field("array", j))
            else:
                fields.append(Field("array", len(arrays)))
                arrays.append(contiguous(value) if isinstance(value, np.ndarray) else value)
        else:
            fields.append(Field("value", value=value))
    layout = Layout(tuple(fields), tuple((tuple(a.shape), np.dtype(a.dtype)) for a in arrays),
                    (tuple(output.shape), np.dtype(output.dtype)), len(extra))
    return layout, arrays


def first(output):
    """The output of a forward's result (of a tuple, its first array: the values)."""
    return output[0] if isinstance(output, tuple) else output


def join(module, layout: Layout, inputs: list, output, arrays: list):
    """The module's Saved value, rebuilt from the arrays and the layout."""
    values = []
    for field in layout.fields:
        if field.source == "array":
            values.append(arrays[field.at])
        elif field.source == "input":
            values.append(inputs[field.at])
        elif field.source == "output":
            values.append(output)
        else:
            values.append(field.value)
    return module.Saved(*values)


class Layouts:
    """The layouts of one module, by input signature ((shape, dtype name) of every input)."""

    def __init__(self, module, zeros=np.zeros):
        self.module = module
        self._zeros = zeros  # (shape, dtype) -> an array of the module's kind (NumPy or CuPy)
        self._known: dict = {}
        self._lock = threading.Lock()

    def known(self, signature: tuple) -> bool:
        return signature in self._known

    def remember(self, signature: tuple, layout: Layout) -> None:
        with self._lock:
            self._known.setdefault(signature, layout)

    def get(self, signature: tuple) -> Layout:
        """The layout of a signature, found by running the module on zeros the first time."""
        layout = self._known.get(signature)
        if layout is None:
            from .backends.cpu import framework_threads  # the cpu backend's module: one thread
            zeros = [self._zeros(shape, dtype=dtype) for shape, dtype in signature]
            output, saved = self.module.forward(*zeros, **framework_threads(self.module, lambda: 1))
            layout, _ = split(zeros, output, saved)
            self.remember(signature, layout)
        return layout


def require_module(module, caller: str) -> None:
    """A TypeError unless module is a generated NumPy module (forward, backward, jvp, Saved)."""
    if not all(hasattr(module, a) for a in ("forward", "backward", "jvp", "Saved", "INPUTS")):
        raise TypeError(f"{caller}: expected a generated NumPy module (symgrad.load(...)), "
                        f"got {type(module).__name__}")
    if getattr(module, "PARAMS", {}).get("return_indices"):
        raise ValueError(f"{caller}: {module.OP} was loaded with return_indices=True, whose forward "
                         f"returns (output, indices); wrap the module loaded with "
                         f"return_indices=False (symgrad.torch.op(..., return_indices=True) "
                         f"returns the indices too)")


def bfloat16(caller: str) -> np.dtype:
    """ml_dtypes' bfloat16, the NumPy dtype of a framework's bfloat16 arrays (imported only when
    such an array arrives), or a TypeError naming the package."""
    try:
        import ml_dtypes
    except ModuleNotFoundError:
        raise TypeError(f"{caller}: bfloat16 needs the ml_dtypes package; install it with "
                        f"pip install ml_dtypes (or pip install \".[bfloat16]\" from symgrad's checkout)") from None
    return np.dtype(ml_dtypes.bfloat16)


def integer_inputs(module) -> tuple:
    """Positions of the inputs that are integers (unpooling's indices, the segments' index)."""
    if "expr" in module.PARAMS:
        return ()
    spec = OPS[module.OP]
    if spec.strategy.windows == "segments":  # windows given by an index (scatter_max, segment_max)
        return tuple(module.INPUTS.index(name) for name in spec.constant_inputs)
    if spec.strategy.windows == "bags":  # embedding_bag_max's input and offsets (roi's boxes: floats)
        from .kinds.bag import LAYOUTS
        return tuple(module.INPUTS.index(name) for name in LAYOUTS[module.OP]["integers"])
    return (module.INPUTS.index("indices"),) if spec.strategy.scatter else ()


def bags_per_row(input, include_last_offset: bool, arange) -> tuple:
    """PyTorch's embedding_bag with offsets None and a 2-d input (each row a bag): the 1-d input and
    the offsets of its rows (``arange(n)``: the framework's int64 range)."""
    rows, length = input.shape
    return input.reshape(-1), arange(rows + int(include_last_offset)) * length


def differentiable(module) -> tuple:
    """Positions of the inputs that the module's backward returns a gradient for (not the integer
    indices of unpooling, not an expression's inputs outside wrt)."""
    wrt = module.PARAMS.get("wrt") if "expr" in module.PARAMS else None
    integers = integer_inputs(module)
    constant = () if "expr" in module.PARAMS else OPS[module.OP].constant_inputs
    return tuple(k for k, name in enumerate(module.INPUTS)
                 if k not in integers and name not in constant and (wrt is None or name in wrt))


# ----------------------------------------------------------------------------- the module for CPU arrays

CPU_BACKEND_ENV = "SYMGRAD_CPU_BACKEND"  # auto (the default) | cpu | numpy
CPU_BACKEND_CHOICES = ("auto", "cpu", "numpy")
# the dtypes the bridges run through the cpu backend: float32 and float64, where it equals the NumPy
# module bit for bit (float16 stays with the NumPy module)
CPU_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def cpu_backend_choice() -> str:
    """$SYMGRAD_CPU_BACKEND: which module runs CPU arrays in symgrad.torch and symgrad.jax."""
    value = os.environ.get(CPU_BACKEND_ENV, "").strip().lower() or "auto"
    if value not in CPU_BACKEND_CHOICES:
        raise ValueError(f"${CPU_BACKEND_ENV} must be one of {', '.join(CPU_BACKEND_CHOICES)}, "
                         f"got {value!r}")
    return value


def module_for_cpu(numpy_module, load_cpu, choice: str, same_fields: bool = True):
    """The module that runs CPU arrays of CPU_DTYPES (other dtypes: the NumPy module): the cpu
    backend's (compiled C kernels, the same bits as the NumPy module) under choice "cpu" (errors
    raised: no compiler, a kernel form it does not build), or under "auto" where it is available (the
    op's kernel form is one it builds, its saved state has the NumPy module's fields unless
    same_fields is False (symgrad.torch, whose layouts follow the module: split's cpu module also
    saves its counts), a C compiler is found and the library compiles; else a warning, and the
    NumPy module); the NumPy module under "numpy" or where load_cpu is None (expressions,
    modules given to wrap)."""
    if choice == "numpy" or load_cpu is None:
        return numpy_module
    from .backends import cpu
    from .lower import form_of
    spec = OPS.get(numpy_module.OP)
    if choice == "auto" and ("expr" in numpy_module.PARAMS or spec is None or form_of(spec.strategy) not in cpu.FORMS):
        return numpy_module
    module = load_cpu()
    if choice == "auto" and (module.compiler() is None
                             or (same_fields and module.Saved._fields != numpy_module.Saved._fields)):
        # no compiler; or saved state of other fields (split's counts), which the frameworks'
        # traced graphs would carry as other arrays (torch.compile lost them): the NumPy module
        return numpy_module
    try:
        module.library()  # compiled (or loaded from the cache) now, not in the middle of a graph
    except Exception as exc:  # noqa: BLE001 - reported, then the NumPy module
        if choice == "cpu":
            raise
        warnings.warn(f"{numpy_module.OP}: the cpu backend's library could not be built ({exc}); "
                      f"using the NumPy backend (set ${CPU_BACKEND_ENV}=numpy to silence this)",
                      RuntimeWarning, stacklevel=3)
        return numpy_module
    return module
