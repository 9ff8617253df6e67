"""The per-user cache of generated modules: where it is, verified reads, atomic writes, info, clear.

An entry is ``<cache>/<backend>/<key>-<generator hash>/<module>.py`` and, beside it, ``<module>.py.sha256``: the
SHA-256 of the module's bytes in ``sha256sum`` format.  An entry is used only when its hash and its
``# key:`` line both match; anything else (missing, truncated, edited, one half of the pair) reads
as absent and is generated again.  Both files are written atomically (``files.write_atomic``),
the module first and its hash second.  Generation is deterministic, so processes that fill the same
entry at once write the same bytes, and every interleaving leaves one intact entry.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from .files import write_atomic

HASH_SUFFIX = ".sha256"
DERIVATIONS = "derivations"  # <cache>/derivations/<key>.pickle: symgrad.derivations' entries
_KEY_DIR = re.compile(r"[0-9a-f]{20}(-[0-9a-f]{12})?")  # <key>-<generator hash> (backends.common.generator_hash)


def cache_dir() -> Path:
    """$SYMGRAD_CACHE_DIR, else $XDG_CACHE_HOME/symgrad, else ~/.cache/symgrad.

    A relative XDG_CACHE_HOME is ignored, as the XDG base directory specification says."""
    if os.environ.get("SYMGRAD_CACHE_DIR"):
        return Path(os.path.expanduser(os.environ["SYMGRAD_CACHE_DIR"]))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "symgrad"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hash_path(path: Path) -> Path:
    return path.with_name(path.name + HASH_SUFFIX)


def key_line(source: str) -> str | None:
    """The value of the '# key:' line in a module's header."""
    for _, line in zip(range(20), source.splitlines()):
        for prefix in ("# key: ", "// key: "):  # Python modules, CUDA sources
            if line.startswith(prefix):
                return line[len(prefix):].strip()
    return None


def read_keyed(path: Path, key: str) -> str | None:
    """The source of a module whose '# key:' line is key, else None (no hash: the catalog)."""
    try:
        source = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return source if key_line(source) == key else None


def trusted(path: Path) -> bool:
    """Written by this user: the file and its directory belong to us and nobody else can write
    them, and the file is a regular file (not a link, FIFO or device).  The hash beside a module
    guards against damage; this guards against another user of a shared cache directory."""
    import stat
    if not hasattr(os, "getuid"):
        return True  # no POSIX ownership (Windows): the cache is in the user's profile
    try:
        for p in (path, path.parent):
            st = os.lstat(p)
            if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) \
                    or (p is path and not stat.S_ISREG(st.st_mode)):
                return False
    except OSError:
        return False
    return True


def read_entry(path: Path, key: str) -> str | None:
    """The source of an intact entry (hash and key match, written by this user), else None."""
    if not (trusted(path) and trusted(hash_path(path))):
        return None
    try:
        data = path.read_bytes()
        recorded = hash_path(path).read_text(encoding="ascii").split()
        source = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not recorded or recorded[0] != digest(data) or key_line(source) != key:
        return None
    return source


def write_entry(path: Path, source: str) -> None:
    """Write an entry: the module, then its hash (both atomic)."""
    line = f"{digest(source.encode('utf-8'))}  {path.name}\n"
    for attempt in range(3):  # a concurrent `symgrad cache clear` may remove the directory
        try:
            write_atomic(path, source)
            write_atomic(hash_path(path), line)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def entries(root: Path | None = None) -> list[Path]:
    """The entry directories <root>/<backend>/<key>/ (nothing else under root counts)."""
    root = cache_dir() if root is None else root
    found = []
    try:
        backends = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    for b in backends:
        if b.is_symlink():  # a link out of the cache is never walked into
            continue
        try:
            found += sorted(p for p in b.iterdir()
                            if p.is_dir() and not p.is_symlink() and _KEY_DIR.fullmatch(p.name))
        except OSError:
            continue
    return found


def info(root: Path | None = None) -> dict:
    """{'location', 'entries', 'bytes'} of the cache."""
    root = cache_dir() if root is None else root
    found = entries(root)
    size = 0
    for d in found:
        for dirpath, _, files in os.walk(d):
            for f in files:
                try:
                    size += os.lstat(os.path.join(dirpath, f)).st_size
                except OSError:
                    pass
    for p in _derivation_files(root):  # cached derivations count towards the size
        try:
            size += p.lstat().st_size
        except OSError:
            pass
    return {"location": root, "entries": len(found), "bytes": size}


def _derivation_files(root: Path) -> list[Path]:
    """symgrad's files in <root>/derivations/: cached derivations and their temporary files."""
    try:
        return sorted(p for p in (root / DERIVATIONS).iterdir() if p.is_file() and not p.is_symlink()
                      and (p.suffix == ".pickle" or (p.name.startswith(".") and p.name.endswith(".tmp"))))
    except OSError:
        return []


_HASH_LINE = re.compile(rb"[0-9a-f]{64}  \S+\n?")


def _ours(p: Path) -> bool:
    """A file symgrad wrote: a regular file (never a link) that is a module or kernel with
    symgrad's provenance header, a hash file in sha256sum format, or a temporary file of an
    atomic write."""
    from .files import has_provenance
    if p.is_symlink() or not p.is_file():
        return False
    n = p.name
    if n.endswith((".py", ".cu")):
        return has_provenance(p)
    if n.endswith((".py" + HASH_SUFFIX, ".cu" + HASH_SUFFIX)):
        try:
            with open(p, "rb") as f:
                return bool(_HASH_LINE.fullmatch(f.read(200)))
        except OSError:
            return False
    return n.startswith(".") and n.endswith(".tmp")


def clear(root: Path | None = None) -> int:
    """Remove every entry; return how many.  Only symgrad's files are removed (``_ours``: a module
    needs symgrad's provenance header, nothing is reached through a symbolic link): a directory
    that holds anything else is left in place (with that content), so a cache location set by
    mistake to a directory of other files, or an entry that links elsewhere, loses nothing but
    symgrad's own files."""
    root = cache_dir() if root is None else root
    removed = 0
    parents = set()
    for d in entries(root):
        for p in d.iterdir():
            if p.name == "__pycache__" and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            elif _ours(p):
                p.unlink(missing_ok=True)
        try:
            d.rmdir()
            removed += 1
            parents.add(d.parent)
        except OSError:
            pass  # not empty: something that is not symgrad's
    for p in _derivation_files(root):  # cached derivations go too (not counted as entries)
        p.unlink(missing_ok=True)
    if (root / DERIVATIONS).is_dir():
        parents.add(root / DERIVATIONS)
    for b in sorted(parents):
        try:
            b.rmdir()  # a backend directory, once its entries are gone
        except OSError:
            pass
    return removed
