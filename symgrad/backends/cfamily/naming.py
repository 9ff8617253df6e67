"""The C identifiers that the C ("cpu") and CUDA sources make of an input's name (each backend
names its own files: ``backends/<name>/__init__.py``; module names and keys: ``symgrad/naming.py``).

The .c and the .cu spell every input name (which an expression's user chooses) and the names made
of it with symgrad's prefix: a macro of whatever headers the compiler includes on some machine
cannot replace them.  C, C++ and POSIX leave identifiers like sg_in_x to the program (the
implementation's own are __x, _X and a few listed families), and symgrad's own helpers in the
sources are never spelled sg_in_, sg_grad_, sg_g_ or sg_tangent_.  The NumPy module and the
loaders keep the names as given."""

from __future__ import annotations

C_ROLES = {"value": "sg_in_", "grad": "sg_grad_", "local": "sg_g_", "tangent": "sg_tangent_"}


def c_identifiers(name: str) -> dict:
    """{role: C identifier} of an input in a generated .c or .cu: its value, its gradient (array
    and reference), the kernels' local gradient and its tangent."""
    return {role: prefix + name for role, prefix in C_ROLES.items()}


def c_names(inputs) -> dict:
    """{symbol name: C identifier} for the printer: each input and its grad_<input>."""
    names = {}
    for name in inputs:
        ids = c_identifiers(name)
        names[name], names[f"grad_{name}"] = ids["value"], ids["grad"]
    return names
