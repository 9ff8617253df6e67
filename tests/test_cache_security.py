"""The cache against a hostile or broken file system (issue 16): it runs, unpickles and deletes
only what is symgrad's and this user's, every read is bounded and never follows a link, and
every error is one line that names the file.

* `cache clear` removes only symgrad's files (provenance header, hash lines, its derivations and
  temporary files), never a foreign .py or .pickle, and reports what `cache info` counts;
* derivations are unpickled only after an HMAC under a per-user secret kept outside the cache
  checks out: a planted, forged or copied file is derived again, and without a usable secret
  nothing is read from disk;
* cache directories are 0700 and files 0600; an entry others can write or own is never used
  nor written into (the module is generated into a private temporary directory);
* a FIFO, a link to /dev/zero, a directory or a huge file where a module, a hash or a catalog
  file should be neither hangs nor eats memory;
* where nothing can be written, load() raises one ValueError naming the place; a path with a
  newline, a full disk and a binary file give one error line naming the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import os
import pickle
import stat
import subprocess
import sys
import textwrap
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest

import symgrad
from symgrad import api, cache, cli, derivations, pipeline
from symgrad.ops import resolve

ROOT = Path(__file__).resolve().parents[1]
POSIX_OWNERS = hasattr(os, "getuid")
ROOT_USER = POSIX_OWNERS and os.geteuid() == 0
NOBODY = 65534  # a uid that is not ours (chown needs root)


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A fresh cache and secret of the test's own, and no module or derivation in memory."""
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SYMGRAD_KEY_FILE", str(tmp_path / "config" / "symgrad" / "key"))
    monkeypatch.setattr(api, "_LOADED", {})
    monkeypatch.setattr(derivations, "_MEMO", {})
    monkeypatch.setattr(derivations, "_WARNED", [])  # as a new process: no warning given yet
    pipeline._build.cache_clear()  # an op built earlier in this process derives nothing again
    return tmp_path


def run_cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def one_error_line(rc, stdout, stderr) -> str:
    assert rc == 2 and stdout == "", (rc, stdout, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("symgrad: error: "), stderr
    return lines[0]


def fresh(monkeypatch) -> None:
    """As a new process: nothing loaded or derived in memory."""
    monkeypatch.setattr(api, "_LOADED", {})
    monkeypatch.setattr(derivations, "_MEMO", {})


def counting_derive(monkeypatch) -> list:
    """Record every derivation that actually runs (instead of coming from a cache)."""
    ran, real = [], derivations._derive

    def derive(op, display=True):
        ran.append(op.name)
        return real(op, display)
    monkeypatch.setattr(derivations, "_derive", derive)
    return ran


def module_entry(root: Path) -> Path:
    (module,) = root.glob("numpy/*/*.py")
    return module


# ----------------------------------------------------------------------------- cache clear

def test_clear_never_deletes_a_foreign_file_inside_the_cache(env, monkeypatch):
    symgrad.load("relu", ties="split")
    root = env / "cache"
    module = module_entry(root)
    foreign = {  # what a user might keep there; none of it carries symgrad's marks
        module.parent / "__pycache__" / "helper.py": "print('mine')\n",
        module.parent / ".notes.tmp": "my scratch file\n",
        root / "derivations" / "model.pickle": "weights\n",
        root / "derivations" / ".0123456789abcdef.tmp": "mine too\n",
    }
    for path, text in foreign.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    cache.clear(root)
    for path, text in foreign.items():
        assert path.read_text() == text, f"clear deleted {path}"
    assert not module.exists() and not cache.hash_path(module).exists()
    assert not list((root / "derivations").glob("*[0-9a-f].pickle"))  # symgrad's own went


def test_info_counts_what_clear_removes(env, monkeypatch):
    """The numbers `cache info` shows are the numbers `cache clear` removes (issue 15: info
    counted derivations in the size but not the entries, clear reported one count and removed
    more)."""
    for slope in (0.25, 0.75):
        symgrad.load("leaky_relu", negative_slope=slope)
    symgrad.derive("max_pool1d", ties="first", kernel_size=2)  # a derivation with no module
    root = env / "cache"
    on_disk = [p for p in root.rglob("*") if p.is_file()]
    derived = [p for p in on_disk if p.parent.name == "derivations"]
    want = {"modules": 2, "derivations": len(derived), "files": len(on_disk),
            "bytes": sum(p.stat().st_size for p in on_disk)}
    assert len(derived) == 3
    got = cache.info(root)
    assert {k: got[k] for k in want} == want
    removed = cache.clear(root)
    assert {k: removed[k] for k in want} == want and removed["kept"] == 0
    assert [p for p in root.rglob("*") if p.is_file()] == []


def test_clear_does_not_walk_into_an_entry_that_is_a_link_to_a_file(env):
    """A link named like an entry (to a file, to a directory of generated files) is left alone,
    and so is what it points at, even when that carries symgrad's header."""
    root = env / "cache"
    elsewhere = env / "generated"
    out = symgrad.generate("relu", elsewhere)  # a file with symgrad's provenance header
    (root / "numpy").mkdir(parents=True)
    (root / "numpy" / ("a" * 20 + "-" + "b" * 12)).symlink_to(elsewhere, target_is_directory=True)
    (root / "numpy" / ("c" * 20 + "-" + "d" * 12)).symlink_to(out)
    n = cache.clear(root)
    assert out.exists() and n["modules"] == 0 and n["files"] == n["derivations"]  # relu's derivation


# ----------------------------------------------------------------------------- derivations

def _entry_of(op) -> Path:
    return derivations.directory() / f"{derivations.key(op)}.pickle"


def test_a_forged_derivation_is_not_served(env, monkeypatch):
    """A well-formed pickle of a Derivation (another op's) planted under an op's key: the cache
    must not serve it, since it was not written under this user's secret."""
    op = resolve("max_pool1d", "split", kernel_size=3)
    other = symgrad.derive("relu", ties="split")
    path = _entry_of(op)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(dataclasses.replace(other, op=None), protocol=pickle.HIGHEST_PROTOCOL))
    fresh(monkeypatch)
    ran = counting_derive(monkeypatch)
    d = derivations.derive(op)
    assert ran == ["max_pool1d"] and d.partials != other.partials


def test_a_derivation_copied_to_another_key_is_not_served(env, monkeypatch):
    """The MAC covers the key: a genuine entry renamed to another op's key is not that op's."""
    a = resolve("max_pool1d", "split", kernel_size=3)
    b = resolve("max_pool1d", "split", kernel_size=4)
    da = derivations.derive(a)
    _entry_of(b).write_bytes(_entry_of(a).read_bytes())
    fresh(monkeypatch)
    ran = counting_derive(monkeypatch)
    assert derivations.derive(b).partials != da.partials and ran == ["max_pool1d"]
    fresh(monkeypatch)
    assert derivations.derive(b).partials != da.partials and ran == ["max_pool1d"]  # and replaced


def test_the_secret_is_owner_only_and_outside_the_cache(env, monkeypatch):
    op = resolve("clamp", min=0, max=1)
    derivations.derive(op)
    key = env / "config" / "symgrad" / "key"
    assert derivations.key_file() == key
    assert not key.is_relative_to(env / "cache")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    fresh(monkeypatch)
    ran = counting_derive(monkeypatch)
    derivations.derive(op)
    assert ran == []  # read back: the same secret


@pytest.mark.parametrize("problem", ["cannot-be-created", "readable-by-others", "not-hex"])
def test_without_a_usable_secret_nothing_is_read_from_disk(env, monkeypatch, problem):
    key = env / "config" / "symgrad" / "key"
    if problem == "cannot-be-created":
        (env / "config").write_text("a file where the config directory should be\n")
    else:
        key.parent.mkdir(parents=True)
        key.write_text("ab" * 32 + "\n" if problem == "readable-by-others" else "not a key\n")
        key.chmod(0o644 if problem == "readable-by-others" else 0o600)
    op = resolve("max_pool1d", "last", kernel_size=3)
    with pytest.warns(derivations.CacheWarning):
        d = derivations.derive(op)
    path = _entry_of(op)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(dataclasses.replace(d, op=None)))  # what the old cache held
    fresh(monkeypatch)
    ran = counting_derive(monkeypatch)
    assert derivations.derive(op).partials == d.partials and ran == ["max_pool1d"]
    assert symgrad.load("max_pool1d", ties="last", kernel_size=3).forward(np.array([[1.0, 3.0, 2.0]]))[0].tolist() == [[3.0]]


UNUSABLE_SECRETS = {  # how the key file is broken: (words the warning must say, a fix it must give)
    "directory-writable-by-others": ("a directory others can write (mode 0777)", "set $SYMGRAD_KEY_FILE"),
    "readable-by-others": ("is open to others (mode 0644)", "remove it"),
    "writable-by-group": ("is open to others (mode 0620)", "remove it"),
    "not-hex": ("does not hold a symgrad key", "remove it"),
    "a-directory": ("it is not a regular file", "remove it"),
    "a-link": ("it is a symbolic link", "remove it"),
    "cannot-be-created": ("which cannot be examined (Not a directory)", "set $SYMGRAD_KEY_FILE"),
}


def _break_secret(env: Path, problem: str) -> Path:
    """Make the key file unusable in the given way; returns its path."""
    key = env / "config" / "symgrad" / "key"
    if problem == "cannot-be-created":
        (env / "config").write_text("a file where the config directory should be\n")
        return key
    key.parent.mkdir(parents=True)
    if problem == "directory-writable-by-others":
        key.parent.chmod(0o777)  # as /tmp: whoever can write it can swap the key
        return key
    if problem == "a-directory":
        key.mkdir()
    elif problem == "a-link":
        (env / "real-key").write_text("ab" * 32 + "\n")
        (env / "real-key").chmod(0o600)
        key.symlink_to(env / "real-key")
    else:
        key.write_text("ab" * 32 + "\n" if problem != "not-hex" else "a forged key\n")
        key.chmod({"readable-by-others": 0o644, "writable-by-group": 0o620}.get(problem, 0o600))
    return key


@pytest.mark.parametrize("problem", sorted(UNUSABLE_SECRETS))
def test_an_unusable_secret_is_named_once_with_why_and_a_fix(env, monkeypatch, problem):
    """Without a usable secret the derivation disk cache is off: a warm run derives as long as a
    cold one.  That must not be silent: one CacheWarning per process names the key file, says why
    it cannot be used and how to fix it; everything still works."""
    if problem == "directory-writable-by-others" and not POSIX_OWNERS:
        pytest.skip("POSIX permissions")
    key = _break_secret(env, problem)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in (2, 3):  # two ops, each read and written: still one warning
            op = resolve("max_pool1d", "last", kernel_size=k)
            assert derivations.derive(op).partials
        assert symgrad.load("max_pool1d", ties="last", kernel_size=3).forward(
            np.array([[1.0, 3.0, 2.0]]))[0].tolist() == [[3.0]]
    ours = [w for w in caught if issubclass(w.category, derivations.CacheWarning)]
    assert len(ours) == 1 and len(caught) == 1, [str(w.message) for w in caught]
    text = str(ours[0].message)
    why, fix = UNUSABLE_SECRETS[problem]
    assert "\n" not in text and str(key) in text and why in text and fix in text, text
    assert "not cached on disk" in text


def test_the_cli_names_an_unusable_secret_in_one_line(env, monkeypatch):
    """The CLI: one 'symgrad: warning:' line on stderr for the whole command, the output as
    usual; and none at all where the secret is usable."""
    key = _break_secret(env, "directory-writable-by-others")
    out = env / "out"
    rc, stdout, stderr = run_cli("generate", "max_pool1d", "--kernel-size", "3", "--out", out)
    assert rc == 0 and "wrote" in stdout, (rc, stdout, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("symgrad: warning: "), stderr
    assert str(key) in lines[0] and "others can write" in lines[0]
    fresh(monkeypatch)
    rc, stdout, stderr = run_cli("generate", "relu", "--out", out)  # same process: said already
    assert rc == 0 and stderr == "", stderr
    monkeypatch.setenv("SYMGRAD_KEY_FILE", str(env / "private" / "key"))
    monkeypatch.setattr(derivations, "_WARNED", [])
    fresh(monkeypatch)
    rc, stdout, stderr = run_cli("generate", "max_pool1d", "--kernel-size", "4", "--out", out)
    assert rc == 0 and stderr == "", stderr


# ----------------------------------------------------------------------------- ownership

@pytest.mark.skipif(not POSIX_OWNERS, reason="POSIX permissions")
def test_cache_directories_and_files_are_owner_only(env, monkeypatch):
    old = os.umask(0o002)  # a umask that would let the group write
    try:
        symgrad.load("max_pool1d", ties="split", kernel_size=2)
    finally:
        os.umask(old)
    root = env / "cache"
    found = [root, *root.rglob("*")]
    assert len([p for p in found if p.is_file()]) == 3  # module, hash, derivation
    for p in found:
        want = 0o600 if p.is_file() else 0o700
        assert stat.S_IMODE(p.stat().st_mode) == want, p


def _plant(module: Path, marker: Path) -> None:
    """Edit a cached module to touch marker when run, with a matching hash beside it."""
    planted = module.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n"
    module.write_text(planted)
    cache.hash_path(module).write_text(f"{cache.digest(planted.encode())}  {module.name}\n")


OWNERSHIP = ["directory-writable-by-others", "directory-of-another-user",
             "module-of-another-user", "hash-of-another-user", "module-writable-by-group"]


@pytest.mark.skipif(not POSIX_OWNERS, reason="POSIX owners")
@pytest.mark.parametrize("problem", OWNERSHIP)
def test_an_entry_that_is_not_ours_alone_is_never_imported_nor_written_into(env, monkeypatch, problem):
    if "another-user" in problem and not ROOT_USER:
        pytest.skip("giving a file to another user needs root")
    module = module_entry_after_load(env)
    folder = module.parent
    marker = env / "ran"
    _plant(module, marker)
    target = {"directory": folder, "module": module, "hash": cache.hash_path(module)}[problem.split("-")[0]]
    if "another-user" in problem:
        os.chown(target, NOBODY, NOBODY)
    else:
        target.chmod(0o777 if target.is_dir() else 0o620)
    fresh(monkeypatch)
    again = symgrad.load("relu", ties="split")
    assert not marker.exists()
    y, saved = again.forward(np.array([-1.0, 0.0, 2.0]))
    assert again.backward(np.ones(3), saved)[0].tolist() == [0.0, 0.5, 1.0]
    if problem.startswith("directory"):  # a place others control is not written into either
        assert not Path(again.__file__).is_relative_to(folder)
        assert stat.S_IMODE(Path(again.__file__).parent.stat().st_mode) == 0o700
        assert module.read_text().endswith(f"open({str(marker)!r}, 'w').close()\n")  # left alone
    folder.chmod(0o700)


def module_entry_after_load(env) -> Path:
    symgrad.load("relu", ties="split")
    return module_entry(env / "cache")


# ----------------------------------------------------------------------------- bounded reads

def _limited(code: str, *args, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter with 2 GiB of address space at most, so that an unbounded
    read fails (instead of eating the machine) and a hang is a timeout."""
    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


def _make_special(path: Path, kind: str) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


LOAD_RELU = """
    import sys, numpy as np, symgrad
    from pathlib import Path
    from symgrad import api
    if sys.argv[1] != "-":
        api.catalog_dir = lambda: Path(sys.argv[1])
    m = symgrad.load("relu", ties="split")
    print(m.__file__)
    print(m.forward(np.array([-1.0, 2.0]))[0].tolist())
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_a_special_file_in_the_catalog_is_never_read(tmp_path, kind):
    """Where the committed catalog holds a FIFO (a read would block), a link to /dev/zero (a
    read never ends) or a directory under the module's name: load() generates it instead."""
    catalog = tmp_path / "catalog"
    name = symgrad.generate("relu", tmp_path / "out", ties="split").name
    (catalog / "numpy").mkdir(parents=True)
    _make_special(catalog / "numpy" / name, kind)
    r = _limited(LOAD_RELU, catalog, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[1] == "[0.0, 2.0]"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
@pytest.mark.parametrize("which", ["module", "hash"])
def test_a_special_file_in_a_cache_entry_is_regenerated(env, kind, which):
    r = _limited(LOAD_RELU, "-", timeout=60)
    module = Path(r.stdout.splitlines()[0])
    good = module.read_bytes()
    _make_special(module if which == "module" else cache.hash_path(module), kind)
    r = _limited(LOAD_RELU, "-", timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines()[1] == "[0.0, 2.0]", r.stderr[-2000:]
    if kind != "directory":  # replaced in place, atomically
        assert r.stdout.splitlines()[0] == str(module) and module.read_bytes() == good
        assert cache.read_entry(module, cache.key_line(good.decode())) == good.decode()


@pytest.mark.parametrize("which", ["module", "hash"])
def test_a_huge_file_in_a_cache_entry_is_not_read(env, monkeypatch, which):
    """A module or hash file grown (sparse) to 256 MiB: refused by its size, not read."""
    module = module_entry_after_load(env)
    target = module if which == "module" else cache.hash_path(module)
    with open(target, "r+b") as f:
        f.truncate(256 << 20)
    fresh(monkeypatch)
    tracemalloc.start()
    try:
        m = symgrad.load("relu", ties="split")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"load() allocated {peak >> 20} MiB"
    assert m.forward(np.array([-1.0, 2.0]))[0].tolist() == [0.0, 2.0]
    assert target.stat().st_size < 1 << 20  # regenerated


# ----------------------------------------------------------------------------- unwritable, errors

def test_load_where_nothing_can_be_written_raises_one_value_error(env, monkeypatch):
    def full(path, content, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    monkeypatch.setattr(cache, "write_atomic", full)
    with pytest.raises(ValueError) as info:
        symgrad.load("relu", ties="split")
    message = str(info.value)
    assert "\n" not in message and str(env / "cache") in message and "No space left" in message


def test_load_where_the_cache_is_full_falls_back_to_a_private_directory(env, monkeypatch):
    real = cache.write_atomic

    def full_cache(path, content, *args, **kwargs):
        if Path(path).is_relative_to(env / "cache"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, content, *args, **kwargs)
    monkeypatch.setattr(cache, "write_atomic", full_cache)
    m = symgrad.load("relu", ties="split")
    assert not Path(m.__file__).is_relative_to(env / "cache")
    assert m.forward(np.array([-1.0, 2.0]))[0].tolist() == [0.0, 2.0]


@pytest.mark.parametrize("fault", [errno.EROFS, errno.EACCES])
def test_clear_on_a_cache_it_cannot_change_says_so_and_counts_only_what_it_removed(env, monkeypatch, fault):
    """A read-only cache (unlink fails with EROFS; EACCES as a non-root user meets a folder it
    cannot write): one error line and exit status 2, nothing counted as removed, and the cache as
    it was; clear() counts the failures apart."""
    symgrad.load("relu", ties="split")
    before = cache.info()
    assert before["modules"] == 1 and before["derivations"] >= 1

    def refused(path, *args, **kwargs):
        raise OSError(fault, os.strerror(fault), path)
    monkeypatch.setattr(os, "unlink", refused)
    monkeypatch.setattr(os, "rmdir", refused)
    line = one_error_line(*run_cli("cache", "clear"))
    assert os.strerror(fault) in line and f"could not remove {before['files']} files" in line
    assert "removed 0 module entries, 0 derivations (0 files, 0 bytes)" in line
    n = cache.clear()
    assert n["failed"] == before["files"] and n["modules"] == n["derivations"] == n["files"] == n["kept"] == 0
    monkeypatch.undo()
    assert cache.info(env / "cache") == before


def test_a_path_with_a_newline_gives_one_error_line(tmp_path, monkeypatch):
    odd = tmp_path / "a\nb"
    odd.write_text("a file, not a directory\n")
    line = one_error_line(*run_cli("generate", "relu", "--out", odd))
    assert "a\\nb" in line
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(tmp_path / "c\nd"))
    rc, out, err = run_cli("cache", "info")
    assert rc == 0 and err == "" and len(out.splitlines()) == 3 and "c\\nd" in out.splitlines()[0]


def test_a_full_disk_error_names_the_file(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as the kernel says it: no file
    monkeypatch.setattr(os, "fsync", full)
    line = one_error_line(*run_cli("generate", "relu", "--out", tmp_path))
    assert "No space left on device" in line and str(tmp_path / "relu_first.py") in line
    assert list(tmp_path.iterdir()) == []  # nothing half-written, no temporary left


def test_a_binary_file_error_names_the_file(tmp_path):
    binary = tmp_path / "README.md"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" * 10)
    line = one_error_line(*run_cli("conventions", "--check", binary))
    assert str(binary) in line
