"""The per-user cache of generated modules: where it is, verified reads, atomic writes, info, clear.

An entry is ``<cache>/<backend>/<key>-<generator hash>/<module>.py`` and, beside it, ``<module>.py.sha256``: the
SHA-256 of the module's bytes in ``sha256sum`` format.  An entry is used only when its hash and its
``# key:`` line both match; anything else (missing, truncated, edited, one half of the pair) reads
as absent and is generated again.  Both files are written atomically (``files.write_atomic``),
the module first and its hash second.  Generation is deterministic, so processes that fill the same
entry at once write the same bytes, and every interleaving leaves one intact entry.

The hash guards against damage, not against another user: an entry is read only when its files
and its directory belong to this user and nobody else can write them (``read_private``), which is
how the cache writes them (directories 0700, files 0600).  Reads never follow a link, never block
on a FIFO and never read more than a module can be (``files.read_bounded``).  ``clear`` walks the
cache through directory descriptors opened without following links, and removes only what
symgrad wrote.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
from pathlib import Path

from .files import HEADER_BYTES, MAX_FILE_BYTES, TEMPORARY, has_provenance, read_bounded, write_atomic

HASH_SUFFIX = ".sha256"
# <cache>/derivations/<key>.pickle: symgrad.derivations.memoized's entries (derivations, the docs'
# worked-example windows, the catalog's rendered pages), each counted as a derivation
DERIVATIONS = "derivations"
_KEY_DIR = re.compile(r"[0-9a-f]{20}(-[0-9a-f]{12})?")  # <key>-<generator hash> (backends.common.generator_hash)
_DERIVATION = re.compile(r"[0-9a-f]{24}\.pickle")  # a 24-digit key (derivations.key(op) and the others) + ".pickle"
_LIBRARY = re.compile(r"\w+\.[0-9a-f]{16}\.so")  # the cpu backend's library beside its module


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
        source = read_bounded(path, follow=True)[0].decode("utf-8")
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return source if key_line(source) == key else None


def private(st: os.stat_result) -> bool:
    """Owned by this user and writable by nobody else (always, where there is no POSIX owner:
    on Windows the cache is in the user's profile)."""
    return not hasattr(os, "getuid") or (
        st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def usable(folder: Path) -> bool:
    """A cache directory symgrad may read from and write into: absent (it will be made private),
    or a real directory (not a link) that is private."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and private(st)


def read_private(path: Path, limit: int = MAX_FILE_BYTES) -> bytes | None:
    """The bytes of a file this user wrote into a private directory, else None: a file that is
    a link, a FIFO, a device or a directory, larger than limit, or not private, or whose
    directory is not.  Ownership is checked on the very file that is read (fstat)."""
    if not path.parent.exists() or not usable(path.parent):
        return None
    try:
        data, st = read_bounded(path, limit)
    except (OSError, ValueError):
        return None
    return data if private(st) else None


def read_entry(path: Path, key: str) -> str | None:
    """The source of an intact entry (hash and key match, written by this user), else None."""
    data = read_private(path)
    recorded = read_private(hash_path(path), HEADER_BYTES)
    if data is None or recorded is None:
        return None
    recorded = recorded.split()
    if not recorded or recorded[0] != digest(data).encode():
        return None
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return source if key_line(source) == key else None


def write_entry(path: Path, source: str) -> None:
    """Write an entry: the module, then its hash (both atomic, owner-only)."""
    line = f"{digest(source.encode('utf-8'))}  {path.name}\n"
    for attempt in range(3):  # a concurrent `symgrad cache clear` may remove the directory
        try:
            write_atomic(path, source, private=True)
            write_atomic(hash_path(path), line, private=True)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def temporary_directory(prefix: str = "symgrad-") -> Path:
    """A new private directory (mode 0700) of this process's, for what cannot be kept in the
    cache; removed with its files when the process exits (not when a forked child does)."""
    import atexit
    import tempfile
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(_remove_at_exit, folder, os.getpid())
    return folder


def _remove_at_exit(folder: Path, pid: int) -> None:
    if os.getpid() == pid:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------------------- info and clear

_DIR_FLAGS = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_CLOEXEC", 0))
_HASH_LINE = re.compile(rb"[0-9a-f]{64}  \S+\n?")


@contextlib.contextmanager
def _directory(name, dir_fd: int | None = None, follow: bool = False):
    """A descriptor of the directory name (in dir_fd), opened without following a link unless
    follow (the cache location itself may be a link the user made); None where it is not one."""
    try:
        fd = os.open(name, _DIR_FLAGS & ~getattr(os, "O_NOFOLLOW", 0) if follow else _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _listdir(fd: int) -> list[str]:
    try:
        return sorted(os.listdir(fd))
    except OSError:
        return []


def _ours(dir_fd: int, name: str, derivations: bool) -> os.stat_result | None:
    """The lstat of a file symgrad wrote, else None.  In an entry: a module or kernel with
    symgrad's provenance header, a hash file in sha256sum format, or the temporary file of an
    atomic write of one of those; in derivations/: a derivation or its temporary file.  Never a
    link, never anything but a regular file, and only its first HEADER_BYTES are read."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    temporary = TEMPORARY.fullmatch(name)
    target = temporary.group(1) if temporary else name
    if derivations:
        return st if _DERIVATION.fullmatch(target) else None
    if not target.endswith(tuple(s + h for s in (".py", ".cu", ".c", ".so") for h in ("", HASH_SUFFIX))):
        return None
    if temporary:
        return st
    if name.endswith(".so"):  # the cpu backend's compiled kernels, named <module>.<source hash>.so
        return st if _LIBRARY.fullmatch(name) else None
    if name.endswith(HASH_SUFFIX):
        try:
            head = read_bounded(name, HEADER_BYTES, head=True, dir_fd=dir_fd)[0]
        except (OSError, ValueError):
            return None
        return st if _HASH_LINE.fullmatch(head) else None
    return st if has_provenance(name, follow=False, dir_fd=dir_fd) else None


def _sweep(root: Path, remove: bool) -> dict:
    """What info reports and clear removes, in one walk so that the two always agree:
    {'modules': entry directories (removed, for clear), 'derivations': derivation files,
    'files': symgrad's files in all, 'bytes': their size, 'kept': entry directories left in place
    because they hold something that is not symgrad's (clear only), 'failed': symgrad's files
    that could not be removed (clear only: a read-only cache), 'error': why the first of them
    could not (None: none)}.  clear counts only what it removed."""
    n = dict(modules=0, derivations=0, files=0, bytes=0, kept=0, failed=0, error=None)

    def take(dir_fd: int, name: str, st: os.stat_result) -> bool:
        if remove:
            try:
                os.unlink(name, dir_fd=dir_fd)  # unlink never follows a link
            except FileNotFoundError:  # removed at the same time by another process
                return False
            except OSError as exc:
                n["failed"] += 1
                n["error"] = n["error"] or exc.strerror or str(exc)
                return False
        n["files"] += 1
        n["bytes"] += st.st_size
        return True

    with _directory(root, follow=True) as root_fd:
        if root_fd is None:
            return n
        for backend in _listdir(root_fd):
            with _directory(backend, root_fd) as b_fd:
                if b_fd is None:  # a file, or a link out of the cache: never walked into
                    continue
                if backend == DERIVATIONS:
                    for name in _listdir(b_fd):
                        st = _ours(b_fd, name, derivations=True)
                        if st is not None and take(b_fd, name, st):
                            n["derivations"] += not TEMPORARY.fullmatch(name)
                    if remove:
                        with contextlib.suppress(OSError):
                            os.rmdir(backend, dir_fd=root_fd)
                    continue
                for entry in _listdir(b_fd):
                    if not _KEY_DIR.fullmatch(entry):
                        continue
                    failed = n["failed"]
                    with _directory(entry, b_fd) as e_fd:
                        if e_fd is None:
                            continue
                        for name in _listdir(e_fd):
                            st = _ours(e_fd, name, derivations=False)
                            if st is not None:
                                take(e_fd, name, st)
                    if not remove:
                        n["modules"] += 1
                        continue
                    try:
                        os.rmdir(entry, dir_fd=b_fd)
                        n["modules"] += 1
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        if n["failed"] > failed:  # holding a file of symgrad's that could not go
                            continue
                        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                            n["kept"] += 1  # not empty: something that is not symgrad's
                        else:
                            n["failed"] += 1
                            n["error"] = n["error"] or exc.strerror or str(exc)
                if remove:
                    with contextlib.suppress(OSError):
                        os.rmdir(backend, dir_fd=root_fd)  # a backend directory, once empty
    return n


def info(root: Path | None = None) -> dict:
    """{'location', 'modules', 'derivations', 'files', 'bytes'} of the cache: the entries of
    generated modules, the cached derivations, and the files and bytes of symgrad's that
    ``clear`` would remove (a foreign file inside the cache is neither counted nor removed)."""
    root = cache_dir() if root is None else root
    n = _sweep(root, remove=False)
    for name in ("kept", "failed", "error"):
        del n[name]
    return {"location": root, **n}


def clear(root: Path | None = None) -> dict:
    """Remove symgrad's files from the cache; return what was removed, counted as ``info`` counts
    (plus 'kept': entries left in place because they hold something else, 'failed': files of
    symgrad's that could not be removed, and 'error': why, for the first).  Only symgrad's files
    go (``_ours``: a module needs symgrad's provenance header, and nothing is reached through a
    symbolic link), so a cache location set by mistake to a directory of other files, or an entry
    that links elsewhere, loses nothing but symgrad's own files."""
    root = cache_dir() if root is None else root
    return {"location": root, **_sweep(root, remove=True)}
