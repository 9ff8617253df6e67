"""The public Python API: derive, generate, load, list_ops."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

from . import expr as _expr
from . import aminmax as _aminmax
from . import losses as _losses
from . import hinge as _hinge
from . import naming
from .derivations import derive as _derive
from .derive import Derivation
from .ops import OPS, resolve
from . import backends as _backends
from .backends.common import generator_hash
from .files import check_out, shown, write_all
from .pipeline import render
from .suggest import closest, unexpected
from . import cache as _cache
from .cache import cache_dir  # noqa: F401 (public: where load() keeps generated modules)

BACKENDS = _backends.NAMES
_PKG = Path(__file__).resolve().parent


def _check_backend(backend: object) -> _backends.Backend:
    """The backend called backend, resolved once here and carried down (backends.get)."""
    return _backends.get(backend)


def list_ops() -> dict:
    """{op name: {summary, inputs, params: {name: default}}} for every op."""
    return {name: {"summary": s.summary, "inputs": s.inputs,
                   "params": {p.name: ("required" if p.required else p.default) for p in s.params}}
            for name, s in OPS.items()}


SETTINGS = ("ties", "convention", "nan", "order")  # the keyword settings every op takes


def check_names(op: object, params: dict, settings=SETTINGS) -> None:
    """Misspelled names get the CLI's did-you-mean: an unknown op name close to one of OPS (a
    ValueError), a parameter the op does not take (a TypeError naming the closest of its
    parameters and the caller's settings, and all of them).  resolve() checks everything else."""
    if not isinstance(op, str):
        return
    if op == "aminmax":
        raise ValueError(_aminmax.NOT_A_MODULE)
    if op in _hinge.OPS:  # (hinge.py)
        raise ValueError(_hinge.not_a_module(op))
    if op not in OPS:
        close = closest(op, [*OPS, *_hinge.OPS])  # (the composed losses too)
        if close:
            raise ValueError(f"unknown op {op!r}; did you mean {close!r}? (expected one of: {', '.join(OPS)})")
        return
    names = [p.name for p in OPS[op].params]
    wrong = set(params) - set(names)
    if wrong:
        raise unexpected(op, "parameter", wrong, names + list(settings))


def derive(op: str, ties: str | None = None, convention: str | None = None, nan: str | None = None,
           order: str | None = None, **params) -> Derivation:
    """Derive op's backward under a tie policy; the result carries every step."""
    check_names(op, params)
    return _derive(resolve(op, ties, convention=convention, nan=nan, order=order, **params))


def generate(op: str, out: str | os.PathLike, ties: str | None = None, backend: str = "numpy",
             convention: str | None = None, nan: str | None = None, order: str | None = None,
             force: bool = False, **params) -> Path:
    """Write op's generated module into directory ``out``; return the path of its Python module
    (for backend="cuda" the CuPy loader; the .cu kernel source is written beside it)."""
    check_names(op, params, SETTINGS + ("backend", "force"))
    backend = _check_backend(backend)
    out = check_out(out)
    spec = resolve(op, ties, convention=convention, nan=nan, order=order, **params)
    return write_all(render(spec, backend), out, force)


# ----------------------------------------------------------------------------- loading

def catalog_dir() -> Path | None:
    """generated/ of a source checkout, or the copy installed inside the package."""
    for cand in (_PKG / "_generated", _PKG.parent / "generated"):
        if (cand / "numpy").is_dir():
            return cand
    return None


_LOADED: dict = {}
_LOCK = threading.Lock()


def _import(path: Path, key: str, source: str) -> ModuleType:
    """Execute exactly the source that was read (and verified), as a module at path."""
    modname = f"symgrad_generated.{path.stem}_{key}"
    if "symgrad_generated" not in sys.modules:  # the parent package, so that pickle finds Saved
        sys.modules["symgrad_generated"] = ModuleType("symgrad_generated")
        sys.modules["symgrad_generated"].__path__ = []
    spec = importlib.util.spec_from_loader(modname, loader=None, origin=str(path))
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    code = compile(source, str(path), "exec", dont_inherit=True)
    sys.modules[modname] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(modname, None)
        raise
    return module


def load(op: str, backend: str = "numpy", ties: str | None = None,
         convention: str | None = None, nan: str | None = None, order: str | None = None,
         **params) -> ModuleType:
    """Import the generated module of an op: from the committed catalog when it holds exactly this
    op, parameters and policy, otherwise generated into the per-user cache (keyed by a hash of
    everything that affects the code) and imported from there."""
    named = isinstance(op, str)  # (anything else: resolve() raises the TypeError)
    if named and op == "aminmax":  # amin and amax composed (aminmax.py)
        wrong = set(params) - set(_aminmax.PARAMS)
        if wrong:
            raise unexpected(op, "parameter", wrong, list(_aminmax.PARAMS + SETTINGS))
        settings = dict(backend=backend, ties=ties, convention=convention, nan=nan, order=order)
        return _aminmax.load(load, settings, params)
    if named and op in _hinge.OPS:  # composed of a generated module (hinge.py)
        settings = dict(backend=backend, ties=ties, convention=convention, nan=nan, order=order)
        return _hinge.load(load, op, settings, params)
    loss = named and op in _losses.LOSSES
    reduction = params.pop("reduction", "none") if loss else None  # (losses.py)
    check_names(op, params, ("backend",) + SETTINGS)
    backend = _check_backend(backend)
    spec = resolve(op, ties, convention=convention, nan=nan, order=order, **params)
    if not loss:
        return _load(spec, backend)
    return _losses.reduced(_load(spec, backend), spec, _losses.check_reduction(op, reduction))


def _load(spec, backend: _backends.Backend) -> ModuleType:
    key = naming.key(spec, backend.name)
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        names = list(backend.file_names(spec))
        catalog = catalog_dir()
        sources = None
        if catalog:  # the committed catalog, if it holds exactly this op (every file)
            got = [_cache.read_keyed(catalog / backend.name / n, key) for n in names]
            if all(g is not None for g in got):
                folder, sources = catalog / backend.name, got
        if sources is None:
            # the folder also names the generator's code: a module made by other code is not reused
            folder = cache_dir() / backend.name / f"{key}-{generator_hash()}"
            got = [_cache.read_entry(folder / n, key) for n in names]  # None unless intact
            if any(g is None for g in got):
                files = render(spec, backend)
                folder = _write_entry(folder, names, files)
                got = [files[n] for n in names]
            sources = got
        module = _import(folder / names[-1], key, sources[-1])
        _LOADED[key] = module
        return module


def _write_entry(folder: Path, names: list, files: dict) -> Path:
    """Write an entry into the cache; where the cache cannot be written (a file in its place,
    read-only, full, a directory or a special file in the way) or is not private (someone else's
    directory, or one others can write), into a private temporary directory instead, removed
    when the process exits.  Returns the folder the files are in.  The module is imported from
    the source just rendered either way, never read back."""
    if _cache.usable(folder):
        try:
            for n in names:  # the module last
                _cache.write_entry(folder / n, files[n])
            return folder
        except OSError:
            pass
    import tempfile
    try:
        private = _cache.temporary_directory()  # mode 0700, this process's own, removed at exit
        for n in names:
            _cache.write_entry(private / n, files[n])
    except OSError as exc:
        raise ValueError(f"cannot write the generated module {names[-1]}: not into the cache "
                         f"({shown(folder)}), nor into a temporary directory "
                         f"({shown(exc.filename or tempfile.gettempdir())}: {exc.strerror or exc})") from None
    return private


# ----------------------------------------------------------------------------- expressions

def derive_expr(expr: str, inputs=None, wrt=None, ties: str | None = None,
                convention: str | None = None, nan: str | None = None,
                name: str | None = None) -> Derivation:
    """Derive the backward of an expression such as "Max(x*y, x + y, 0)" (parsed safely, never
    evaluated); inputs: the input names in order (default: the free names in order of first
    appearance); wrt: the inputs whose gradients backward returns (default: all)."""
    op, _ = _expr.make_op(expr, name, inputs, wrt, ties, convention, nan)
    return _derive(op)


def load_expr(expr: str, name: str | None = None, backend: str = "numpy", inputs=None, wrt=None,
              ties: str | None = None, convention: str | None = None,
              nan: str | None = None) -> ModuleType:
    """Import the generated module of an expression (through the same cache as load()).

    ``forward(*inputs) -> (output, saved)``; ``backward(grad_output, saved)`` -> one entry per input, in
    input order: its gradient (summed back to its shape), or None for an input not in wrt."""
    backend = _check_backend(backend)
    op, _ = _expr.make_op(expr, name, inputs, wrt, ties, convention, nan)
    return _load(op, backend)


def generate_expr(expr: str, out: str | os.PathLike, name: str, backend: str = "numpy",
                  inputs=None, wrt=None, ties: str | None = None, convention: str | None = None,
                  nan: str | None = None, force: bool = False) -> Path:
    """Write an expression's module NAME_<policy>.py (or its CUDA files) into ``out``."""
    backend = _check_backend(backend)
    out = check_out(out)
    if name is None:
        raise TypeError("generate_expr needs name= (a lowercase identifier for the module), "
                        "which is missing")
    op, _ = _expr.make_op(expr, name, inputs, wrt, ties, convention, nan)
    return write_all(render(op, backend), out, force)
