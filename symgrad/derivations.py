"""The on-disk cache of derivations, beside the module cache (``<cache dir>/derivations/``).

A derivation depends on the op, its normalized parameters, the tie policy and order (the key also
names the NaN rule, convention and padding mode), on symgrad's own derivation code (``derive.py``,
``policy.py``, ``indicators.py``, ``ops.py``) and on SymPy; the key of an entry hashes all of them, so editing one of those files or upgrading SymPy never serves a
stale derivation.  Entries are pickles, written atomically, and read only when the file and its
directory belong to the user and are writable by nobody else, through an unpickler that finds
classes of SymPy and symgrad only (no function: a planted pickle cannot run code); an entry that
cannot be read is derived again and replaced, and a cache directory that cannot be written only
costs the time of deriving again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import pickle
import threading
from pathlib import Path

import sympy

from . import __version__
from .derive import Derivation
from .derive import derive as _derive
from .ops import Op

SOURCES = ("derive.py", "policy.py", "indicators.py", "ops.py")  # what a derivation is made by

_MEMO: dict = {}
_LOCK = threading.Lock()
_ANNOUNCE: list = []  # callbacks told of each derivation about to run (the CLI's progress line)


@contextlib.contextmanager
def announcing(callback):
    """Within the block, call callback(op) before each derivation that is found in neither this
    process nor the disk cache, i.e. before the work that can take seconds."""
    _ANNOUNCE.append(callback)
    try:
        yield
    finally:
        _ANNOUNCE.remove(callback)


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """Hash of the code that derives: symgrad's derivation modules, its version, SymPy's version."""
    h = hashlib.sha256(f"symgrad {__version__} sympy {sympy.__version__}".encode())
    for name in SOURCES:
        h.update((Path(__file__).resolve().parent / name).read_bytes())
    return h.hexdigest()


def key(op: Op, display: bool = True) -> str:
    """The cache key of an op's derivation: op, parameters, policy, what is kept for display, and
    the code that derives."""
    blob = json.dumps({"op": op.name, "params": {k: repr(v) for k, v in op.params.items()},
                       "ties": op.ties, "order": op.order, "nan": op.nan, "convention": op.convention,
                       "padding_mode": op.padding_mode, "display": display, "code": code_hash()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def directory() -> Path:
    from .cache import DERIVATIONS, cache_dir
    return cache_dir() / DERIVATIONS


def derive(op: Op, display: bool = True) -> Derivation:
    """derive.derive(op, display): from this process, else from the disk cache, else derived (and
    then stored in both)."""
    k = key(op, display)
    with _LOCK:
        if k in _MEMO:
            return dataclasses.replace(_MEMO[k], op=op)  # the caller's op, not an equal one's
    path = directory() / f"{k}.pickle"
    d = _read(path, op)
    if d is None:
        for callback in list(_ANNOUNCE):
            callback(op)
        d = _derive(op, display)
        _write(path, dataclasses.replace(d, op=None))  # the op is the caller's (its spec holds code)
    with _LOCK:
        return _MEMO.setdefault(k, d)


class _Unpickler(pickle.Unpickler):
    """Unpickles classes of SymPy, symgrad and a few builtin containers and nothing else: no
    function is ever found, so a planted pickle cannot call os.system, exit or anything else
    (it fails to load, and the derivation is derived again and replaced)."""

    _BUILTINS = {"tuple", "list", "dict", "set", "frozenset", "int", "float", "complex", "bool",
                 "str", "bytes", "slice", "range", "NoneType"}

    def find_class(self, module: str, name: str):
        root = module.partition(".")[0]
        if root in ("sympy", "symgrad", "mpmath") or (module == "builtins" and name in self._BUILTINS):
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        if module == "copyreg" and name == "_reconstructor":
            return _reconstructor
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a derivation")


def _reconstructor(cls, base, state):
    """copyreg._reconstructor for the classes _Unpickler allows only."""
    if not (isinstance(cls, type) and isinstance(base, type)):
        raise pickle.UnpicklingError("copyreg._reconstructor of something other than classes")
    import copyreg
    return copyreg._reconstructor(cls, base, state)


def _read(path: Path, op: Op) -> Derivation | None:
    from .cache import trusted
    if not trusted(path):  # another user's file is never unpickled
        return None
    try:
        with open(path, "rb") as f:
            d = _Unpickler(f).load()
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a damaged or foreign entry is derived again and replaced
        return None
    if not isinstance(d, Derivation):
        return None
    return dataclasses.replace(d, op=op)


def _write(path: Path, d: Derivation) -> None:
    from .files import write_atomic
    try:
        write_atomic(path, pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL))
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass  # no cache (or a derivation that does not pickle): the derivation is still returned
