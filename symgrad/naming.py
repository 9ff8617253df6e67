"""Every emitted identifier and file name is made here."""

from __future__ import annotations

import hashlib
import json

from . import __version__
from .ops import Op

_ABBREV = {"kernel_size": "k", "stride": "s", "padding": "p", "dilation": "d", "ceil_mode": "ceil",
           "negative_slope": "slope", "min_val": "lo", "max_val": "hi", "min": "min", "max": "max",
           "dim": "dim", "keepdim": "keepdim", "pieces": "pieces",
           "output_size": "out", "output_ratio": "ratio", "temperature": "t"}


def _value(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, tuple):
        return "x".join(_value(e) for e in v)
    if v is None:
        return "none"
    s = repr(v).replace("-", "neg").replace(".", "p").replace("+", "")
    return s


MAX_NAME = 100  # longer names (huge parameter values) put a hash in place of the parameters


def module_name(op: Op) -> str:
    """A readable, unique module name: op, its non-default parameters, the policy."""
    parts = [op.name]
    for p in op.spec.params:
        v = op.params[p.name]
        default = p.default
        if p.name == "stride" and v == op.params.get("kernel_size"):
            continue
        if v == default and not p.required:
            continue
        parts.append(f"{_ABBREV[p.name]}{_value(v)}")
    if op.convention and all(how.startswith("convention") for _, how in op.origin):
        parts.append(op.convention)  # exactly the preset
        return _bounded("_".join(parts), op)
    if op.convention:
        parts.append(op.convention)
    parts.append(op.ties)
    if op.nan != "dominate" and op.spec.nan_rules != (op.nan,):  # (not when the op allows one rule)
        parts.append(f"nan{op.nan.replace('_', '')}")
    if op.order != "given":
        parts.append("rev")
    return _bounded("_".join(parts), op)


def _bounded(name: str, op: Op) -> str:
    if len(name) > MAX_NAME:  # stay far below file name limits (255 bytes)
        params = canonical(op, "")["params"]
        digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
        name = f"{op.name}_h{digest}_{op.ties}"
    return name


def canonical(op: Op, backend: str) -> dict:
    return {"op": op.name, "params": {k: (list(v) if isinstance(v, tuple) else v)
                                       for k, v in op.params.items()},
            "ties": op.ties, "nan": op.nan, "order": op.order, "convention": op.convention,
            "padding_mode": op.padding_mode, "backend": backend, "symgrad": __version__}


def key(op: Op, backend: str = "numpy") -> str:
    """Hash of everything that affects the generated code."""
    blob = json.dumps(canonical(op, backend), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def cli_flag(param: str) -> str:
    return "--" + param.replace("_", "-")


def cuda_source_name(op: Op) -> str:
    """The CUDA kernel source of an op: <module>.cu."""
    return module_name(op) + ".cu"


def cuda_loader_name(op: Op) -> str:
    """The CuPy loader of an op: <module>_cuda.py (apart from the NumPy module's name)."""
    return module_name(op) + "_cuda.py"


def cuda_namespace(op: Op) -> str:
    """The C++ namespace that holds an op's device code (several .cu files can share a unit)."""
    return "sg_" + module_name(op)


def cuda_kernel_pattern(op: Op) -> str:
    """extern "C" kernel names: <module>_<role>_<dtype>[_<layout>][_<index type>]."""
    return module_name(op) + "_{role}"
