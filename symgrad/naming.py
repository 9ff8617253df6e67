"""The names every backend shares: module names, keys, CLI flags and the input names no backend
may take.  Each backend names its own files (``backends/<name>/__init__.py``); the C identifiers
made of an input's name are the C family's (``backends/cfamily/naming.py``)."""

from __future__ import annotations

import builtins
import hashlib
import json
import keyword
import re

from . import __version__
from .ops import Op

_ABBREV = {"kernel_size": "k", "stride": "s", "padding": "p", "dilation": "d", "ceil_mode": "ceil",
           "negative_slope": "slope", "min_val": "lo", "max_val": "hi", "min": "min", "max": "max",
           "dim": "dim", "keepdim": "keepdim", "pieces": "pieces",
           "output_size": "out", "output_ratio": "ratio", "temperature": "t",
           "return_indices": "indices"}
_ABBREV.update({"include_self": "self", "num_segments": "n", "indices_are_sorted": "sorted"})  # segments
_ABBREV.update({"k": "top", "descending": "desc", "stable": "stable", "largest": "largest",
                "sorted": "sorted"})  # order statistics (issue 29)


def _value(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, tuple):
        return "x".join(_value(e) for e in v)
    if v is None:
        return "none"
    s = repr(v).replace("-", "neg").replace(".", "p").replace("+", "")
    return s


# ----------------------------------------------------------------------------- reserved input names
#
# The one list of names an expression's input may not take, for every backend: each name here
# would break a generated NumPy module (a Python keyword or builtin, a name the module uses) or a
# generated .cu file (a C++ keyword or alternative token, a macro of nvcc's includes, the C math
# library).  An op can be generated for any backend, so a name reserved in one is refused for all.

# intermediate values of the generated code (u0, s0, h0, g_...) and the output
INTERNAL = re.compile(r"(?:[ush][0-9]+|g_.*|grad_.*|sg_.*|M_.*|FP_.*)")

C_WORDS = {
    "auto", "bool", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict",
    "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union",
    "unsigned", "void", "volatile", "while", "class", "namespace", "template", "typename", "this",
    "new", "delete", "operator", "private", "public", "protected", "virtual", "friend", "using",
    "true", "false", "nullptr", "typeid", "throw", "try", "catch", "explicit", "mutable",
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "half", "dim3",
    # C++11-20 keywords and alternative tokens, and macros nvcc and the .cu file define
    "alignas", "alignof", "asm", "char8_t", "char16_t", "char32_t", "wchar_t", "concept", "consteval",
    "constexpr", "constinit", "const_cast", "co_await", "co_return", "co_yield", "decltype",
    "dynamic_cast", "export", "noexcept", "reinterpret_cast", "requires", "static_assert",
    "static_cast", "thread_local", "and_eq", "bitand", "bitor", "compl", "not_eq", "or_eq", "xor",
    "xor_eq", "NULL", "EOF", "INT_MAX", "INT_MIN", "UINT_MAX", "LLONG_MAX", "LLONG_MIN",
    "SYMGRAD_STORAGE_TYPES",
}
# names the generated modules use for their own values
TEMPLATE_WORDS = {
    "np", "numpy", "dtype", "shape", "order", "operands", "output", "saved", "grad_output", "grads",
    "forward", "backward", "cp", "cupy", "ix", "index", "Saved", "INPUTS", "OP", "TIES", "PARAMS",
    "NamedTuple", "annotations", "out", "n", "i", "t", "tr", "acc", "T", "I", "lead", "axes",
    "wide", "name", "value", "array", "exc", "math",
    # fields of Saved and names of the generated modules besides forward/backward
    "output_shape", "input_shape", "jvp", "tangents", "PIECEWISE_LINEAR", "BLOCK",
}


# the C math library's functions and macros (expf(expf) would not compile; NAN is a macro)
C_MATH = {"NAN", "INFINITY", "HUGE_VAL", "HUGE_VALF", "HUGE_VALL", "MATH_ERRNO", "MATH_ERREXCEPT",
           "math_errhandling", "isnan", "isinf", "isfinite", "isnormal", "signbit", "fpclassify",
           "isgreater", "isless", "isunordered", "fmax", "fmin", "fmaxf", "fminf", "fma", "fmaf",
           "rsqrt", "rsqrtf", "exp10", "exp10f", "sincos", "sincosf", "nan", "nanf", "assert"}


def _reserved_by_backend() -> dict:
    """{backend: names an input may not take there}; an input name is refused if any has it."""
    import math
    from .backends.cfamily.macros import CUDA_MACROS  # (here, not above: an import cycle)
    libm = {n for n in dir(math) if not n.startswith("_") and callable(getattr(math, n))}
    libm |= {n + "f" for n in libm} | {n + "l" for n in libm}
    python = set(keyword.kwlist) | set(getattr(keyword, "softkwlist", [])) | set(dir(builtins))
    return {"numpy": frozenset(python | TEMPLATE_WORDS),
            "cuda": frozenset(C_WORDS | C_MATH | libm | CUDA_MACROS | TEMPLATE_WORDS | python)}


RESERVED_BY_BACKEND = _reserved_by_backend()
RESERVED = frozenset().union(*RESERVED_BY_BACKEND.values())


def is_reserved_name(name: str) -> bool:
    """Whether an input name is reserved: in RESERVED (for every backend: a module is generated
    for any backend from the same op) or a name of the generated code's own values."""
    return name in RESERVED or INTERNAL.fullmatch(name) is not None


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
        parts.append(f"{_ABBREV.get(p.name, p.name)}{_value(v)}")  # (new ops: the name itself)
    if op.convention and all(how.startswith("convention") for _, how in op.origin):
        parts.append(op.convention)  # exactly the preset
        return _bounded("_".join(parts), op)
    if op.convention:
        parts.append(op.convention)
    parts.append(op.ties)
    if op.nan != (op.spec.nan_rules or ("dominate",))[0]:  # (not the op's default rule)
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
    out = {"op": op.name, "params": {k: (list(v) if isinstance(v, tuple) else v)
                                      for k, v in op.params.items()},
           "ties": op.ties, "nan": op.nan, "order": op.order, "convention": op.convention,
           "padding_mode": op.padding_mode, "backend": backend, "symgrad": __version__}
    if op.zeros is not None:  # (absent where unset: the keys of other modules stay as they were)
        out["zeros"] = op.zeros
    if op.gradient != "sum":
        out["gradient"] = op.gradient
    if op.half_in_float:
        out["half_in_float"] = True
    if op.tangent_sum != "weights":
        out["tangent_sum"] = op.tangent_sum
    if op.broadcast_sum != "numpy":
        out["broadcast_sum"] = op.broadcast_sum
    if op.bfloat16_zeros is not None:
        out["bfloat16_zeros"] = op.bfloat16_zeros
    return out


def key(op: Op, backend: str = "numpy") -> str:
    """Hash of everything that affects the generated code."""
    blob = json.dumps(canonical(op, backend), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def cli_flag(param: str) -> str:
    return "--" + param.replace("_", "-")
