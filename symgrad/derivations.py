"""The on-disk cache of derivations, beside the module cache (``<cache dir>/derivations/``).

A derivation depends on the op, its normalized parameters, the tie policy and order (the key also
names the NaN rule, convention and padding mode), on symgrad's own code and on SymPy; the key of an
entry hashes all of them (every Python module of the package, ``code_hash``: a derivation runs
derive.py, derive_special.py, expr.py, derivation.py, policy.py, indicators.py, ops.py, kinds/ and
what they import), so editing one of those files or upgrading SymPy never serves a stale
derivation.

Entries are pickles, and unpickling runs whatever the bytes say, so nothing is unpickled that this
user did not write: each entry starts with an HMAC-SHA256 of its key and its bytes under a
per-user secret kept outside the cache (``key_file()``, mode 0600), checked before anything is
unpickled.  A planted or copied file fails the check and is derived again and replaced; where the
secret cannot be read or created, derivations are neither read from disk nor written, and one
CacheWarning per process names the key file, why it cannot be used and how to fix it.  As a
second fence, the unpickler finds classes of SymPy and symgrad only (no function).  Entries are
read only when the file and its directory belong to the user and nobody else can write them, and
never through a link or past a size limit (``cache.read_private``); a cache directory that cannot
be written only costs the time of deriving again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import hmac
import io
import json
import os
import pickle
import secrets
import stat
import threading
import warnings
from pathlib import Path

import sympy

from . import __version__
from .derive import Derivation, Node, derive_window
from .derive import derive as _derive
from .ops import Op

KEY_FILE_ENV = "SYMGRAD_KEY_FILE"  # where the per-user secret is, if not in the config directory
MAGIC = b"symgrad derivation hmac-sha256 "  # + the MAC in hex + a newline, then the pickle

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
    """Hash of the code that derives: every Python module of symgrad (source_hash), its version,
    SymPy's version."""
    return source_hash(Path(__file__).resolve().parent)


def source_hash(root: Path) -> str:
    """Hash of the package at root: symgrad's and SymPy's versions, and every .py file under it
    (its path relative to root and its bytes, in path order; not the catalog an installed package
    carries in _generated/).  The whole package, not a list of the modules a derivation runs:
    such a list goes stale when a module starts importing another (the templates are left out:
    they print code, they do not derive)."""
    h = hashlib.sha256(f"symgrad {__version__} sympy {sympy.__version__}".encode())
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*.py")
                   if "_generated" not in p.relative_to(root).parts)
    for name, path in files:
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode() + data)
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
    def make() -> Derivation:
        for callback in list(_ANNOUNCE):
            callback(op)
        return _derive(op, display)
    # stored without the op: it is the caller's (its spec holds code)
    d = memoized(key(op, display), Derivation, make, lambda d: dataclasses.replace(d, op=None))
    return d if d.op is op else dataclasses.replace(d, op=op)  # the caller's op, not an equal one's


def window(n: int, ties: str, kind: str = "max") -> Node:
    """derive.derive_window(n, ties, kind), the derived extremum of a window x0..x{n-1} that the
    docs' worked examples show: from this process, else from the disk cache, else derived (and
    then stored in both)."""
    blob = json.dumps({"window": n, "ties": ties, "kind": kind, "code": code_hash()}, sort_keys=True)
    return memoized(hashlib.sha256(blob.encode()).hexdigest()[:24], Node,
                     lambda: derive_window(n, ties, kind))


def memoized(k: str, cls: type, make, stored=lambda value: value):
    """Entry k: from this process, else from the disk cache (a cls this user wrote), else made by
    make() and kept in both (stored(value) on disk).  k must name everything the value depends
    on, the code that makes it included."""
    with _LOCK:
        if k in _MEMO:
            return _MEMO[k]
    path = directory() / f"{k}.pickle"
    value = _load(path, cls)
    if value is None:
        value = make()
        _write(path, stored(value))
    with _LOCK:
        return _MEMO.setdefault(k, value)


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


def key_file() -> Path:
    """$SYMGRAD_KEY_FILE, else $XDG_CONFIG_HOME/symgrad/key, else ~/.config/symgrad/key: outside
    the cache, so that whoever can write the cache cannot also read the secret."""
    if os.environ.get(KEY_FILE_ENV):
        return Path(os.path.expanduser(os.environ[KEY_FILE_ENV]))
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "symgrad" / "key"


def secret() -> bytes | None:
    return _secret(str(key_file()))


class CacheWarning(UserWarning):
    """The derivation disk cache is off in this process: the per-user secret cannot be used."""


_WARNED: list = []  # the one CacheWarning of this process has been given


def _unusable(path: str, why: str, fix: str) -> None:
    """Say once per process which secret cannot be used, why, and how to fix it: without it every
    derivation is derived again in every process (seconds for a large window), silently otherwise."""
    from .files import shown
    if _WARNED:
        return
    _WARNED.append(path)
    warnings.warn(f"derivations are not cached on disk (each process derives again): the key file "
                  f"{shown(path)} {why}; {fix}", CacheWarning, stacklevel=2)


@functools.lru_cache(maxsize=None)
def _secret(path: str) -> bytes | None:
    """The per-user secret at path (created on first use: 32 random bytes in hex, written
    atomically, mode 0600 in a directory made 0700), or None where it cannot be created or is not
    this user's alone (owned by another user, readable or writable by others, a link, in a
    directory others can write); then a CacheWarning says why, once per process."""
    from .cache import private, usable
    from .files import read_bounded, shown, write_atomic
    elsewhere = f"or set ${KEY_FILE_ENV} to a file in a directory only you can write"
    folder = Path(path).parent
    if not usable(folder):  # not made here (whoever can write the directory can swap the file)
        fix = (f"set ${KEY_FILE_ENV} to a file in a directory only you can write, or unset it for "
               f"the default ~/.config/symgrad/key" if os.environ.get(KEY_FILE_ENV) else
               f"make it a directory of yours that only you can write (chmod 700 {shown(folder)}) "
               f"or set ${KEY_FILE_ENV} to a file in one")
        _unusable(path, f"is in {_folder_problem(folder)}", fix)
        return None
    for _ in range(2):
        try:
            data, st = read_bounded(Path(path), 1024)
        except FileNotFoundError:
            try:
                write_atomic(Path(path), secrets.token_hex(32) + "\n", private=True)
            except OSError as exc:
                _unusable(path, f"cannot be created ({exc.strerror or exc})",
                          f"make its directory writable by you {elsewhere}")
                return None
            continue
        except ValueError as exc:  # a link, not a regular file, too large: its message says which
            _unusable(path, f"cannot be used ({str(exc).rpartition(': ')[2]})",
                      f"remove it (a new key is made on the next run) {elsewhere}")
            return None
        except OSError as exc:
            _unusable(path, f"cannot be read ({exc.strerror or exc})",
                      f"make it readable by you (chmod 600 {shown(path)}) {elsewhere}")
            return None
        text = data.strip()
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            _unusable(path, "belongs to another user",
                      f"remove it (a new key is made on the next run) {elsewhere}")
            return None
        if not private(st) or st.st_mode & 0o077:
            _unusable(path, f"is open to others (mode {stat.S_IMODE(st.st_mode):04o})",
                      f"remove it (a new key is made on the next run; chmod 600 keeps one others "
                      f"may have read) {elsewhere}")
            return None
        if len(text) != 64 or not all(c in b"0123456789abcdef" for c in text):
            _unusable(path, "does not hold a symgrad key (64 hexadecimal digits)",
                      f"remove it (a new key is made on the next run) {elsewhere}")
            return None
        return bytes.fromhex(text.decode())
    return None


def _folder_problem(folder: Path) -> str:
    """Why a directory is no place for the secret, in a few words."""
    from .files import shown
    name = shown(folder)
    try:
        st = os.lstat(folder)
    except OSError as exc:
        return f"{name}, which cannot be examined ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"{name}, a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{name}, which is not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{name}, a directory of another user"
    return f"{name}, a directory others can write (mode {stat.S_IMODE(st.st_mode):04o})"


def _mac(secret_key: bytes, k: str, data: bytes) -> bytes:
    """The MAC of an entry: its key (so a file copied to another op's name fails) and its bytes."""
    return hmac.new(secret_key, k.encode() + b"\n" + data, hashlib.sha256).hexdigest().encode()


def _load(path: Path, cls: type):
    """The entry at path if this user wrote it (its MAC checks) and it holds a cls, else None."""
    from .cache import read_private
    secret_key = secret()
    if secret_key is None:  # nothing unauthenticated is unpickled
        return None
    data = read_private(path)  # a regular file of this user's, not through a link, bounded
    if data is None or not data.startswith(MAGIC):
        return None
    mac, _, body = data[len(MAGIC):].partition(b"\n")
    if not hmac.compare_digest(mac, _mac(secret_key, path.stem, body)):
        return None  # planted, copied from another key, damaged, or made under another secret
    try:
        found = _Unpickler(io.BytesIO(body)).load()
    except Exception:  # noqa: BLE001 - a damaged entry is derived again and replaced
        return None
    return found if isinstance(found, cls) else None


def _write(path: Path, d) -> None:
    from .files import write_atomic
    secret_key = secret()
    if secret_key is None:
        return  # an entry that could not be authenticated would never be read
    try:
        body = pickle.dumps(d, protocol=pickle.HIGHEST_PROTOCOL)
        write_atomic(path, MAGIC + _mac(secret_key, path.stem, body) + b"\n" + body, private=True)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass  # no cache (or a derivation that does not pickle): the derivation is still returned
