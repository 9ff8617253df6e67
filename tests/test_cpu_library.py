"""The cpu backend's library: compiled on first use, kept beside its module, and every fault on the
way one clear error line, or worked around as the README promises (issue 28 items 23 and 24).

* A cache cleared, read-only or full, or something in the library's place: the library is kept in
  a private temporary directory (removed at exit), or one ValueError names both places.
* A broken $CC (missing, unable to run, writing something that is not a library, failing with
  many lines, a library without the kernels, hanging past $SYMGRAD_COMPILE_TIMEOUT): one
  RuntimeError line, the compiler (and what it started) killed where it hangs.

Skipped when no C compiler is found, except under CI=true, where the compiler is required."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from pathlib import Path

import numpy as np
import pytest

import symgrad
from symgrad import api, cache, files

COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)
if COMPILER is None and os.environ.get("CI") != "true":
    pytest.skip("no C compiler (cc, gcc, clang or $CC) on this machine: the cpu backend needs one "
                "(required when CI=true)", allow_module_level=True)

X = np.array([-1.0, 0.0, 2.0])


@pytest.fixture
def relu(monkeypatch):
    """The cpu relu module as a new process finds it: its library not loaded yet (compiled once
    for the test session, in its cache)."""
    m = symgrad.load("relu", backend="cpu")
    m.forward(X)
    monkeypatch.setattr(m, "_library", None)
    return m


def _library_bytes(m) -> bytes:
    return m.library_path(m._source(), m.compiler()).read_bytes()


def _one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and "\r" not in message, message
    return message


def _works(m) -> Path:
    """The module computes relu (the oracle: max(x, 0)); the file of the library it loaded."""
    y, saved = m.forward(X)
    assert y.tolist() == [0.0, 0.0, 2.0]
    assert m.backward(np.ones(3), saved)[0].tolist() == [0.0, 0.0, 1.0]  # ties "first": 0 at 0
    return Path(m._library._name)


# ----------------------------------------------------------------------------- the cache (item 23)

def test_a_cache_cleared_between_load_and_the_first_call(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(api, "_LOADED", {})
    m = symgrad.load("relu", backend="cpu")
    assert cache.clear()["modules"] == 1  # the .c and the loader gone before anything compiled
    path = _works(m)
    assert not path.is_relative_to(tmp_path / "cache")  # not in a cache the user cleared
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert cache.info()["modules"] == 0


@pytest.mark.parametrize("fault", [errno.EROFS, errno.ENOSPC])
def test_a_read_only_or_full_cache_keeps_the_library_in_a_private_directory(relu, monkeypatch, fault):
    real, data = files.write_atomic, _library_bytes(relu)
    beside = relu.SOURCE.parent

    def refused(path, content, *args, **kwargs):
        if Path(path).is_relative_to(beside):
            raise OSError(fault, os.strerror(fault), str(path))
        return real(path, content, *args, **kwargs)
    monkeypatch.setattr(files, "write_atomic", refused)
    monkeypatch.setattr(relu, "library_path", lambda source, cc: beside / f"{relu.PREFIX}.{'0' * 16}.so")
    monkeypatch.setattr(relu, "_compile", lambda cc, source: data)  # as compiled (no compiler run)
    path = _works(relu)
    assert not path.is_relative_to(beside) and path.name == f"{relu.PREFIX}.{'0' * 16}.so"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_nowhere_to_write_the_library_is_one_value_error_naming_both_places(relu, monkeypatch):
    def full(path, content, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    data = _library_bytes(relu)
    monkeypatch.setattr(files, "write_atomic", full)
    monkeypatch.setattr(relu, "library_path", lambda source, cc: relu.SOURCE.with_name(f"{relu.PREFIX}.{'1' * 16}.so"))
    monkeypatch.setattr(relu, "_compile", lambda cc, source: data)
    with pytest.raises(ValueError) as info:
        relu.forward(X)
    message = _one_line(info)
    assert str(relu.SOURCE.parent) in message and "temporary directory" in message and "No space left" in message


def test_a_directory_in_the_librarys_place(relu, monkeypatch):
    path = relu.SOURCE.with_name(f"{relu.PREFIX}.{'2' * 16}.so")
    path.mkdir()
    data = _library_bytes(relu)
    try:
        monkeypatch.setattr(relu, "library_path", lambda source, cc: path)
        monkeypatch.setattr(relu, "_compile", lambda cc, source: data)
        loaded = _works(relu)
        assert loaded != path and path.is_dir()
    finally:
        path.rmdir()


# ----------------------------------------------------------------------------- a broken $CC (item 24)

def _fake(tmp_path: Path, name: str, body: str) -> Path:
    """A compiler: a shell script; "$out" is the library it is asked to write (the last argument)."""
    script = tmp_path / name
    script.write_text(f'#!/bin/sh\nfor a; do out="$a"; done\n{body}\n')
    script.chmod(0o755)
    return script


def _broken(relu, monkeypatch, cc) -> str:
    monkeypatch.setenv("CC", str(cc))
    with pytest.raises(RuntimeError) as info:
        relu.forward(X)
    return _one_line(info)


def test_cc_naming_no_program(relu, monkeypatch, tmp_path):
    message = _broken(relu, monkeypatch, tmp_path / "no-such-cc")
    assert "$CC" in message and "no-such-cc" in message and "names no program" in message


def test_cc_that_cannot_run(relu, monkeypatch, tmp_path):
    cc = tmp_path / "cc"
    cc.write_text("#!/no/such/interpreter\n")
    cc.chmod(0o755)
    message = _broken(relu, monkeypatch, cc)
    assert str(cc) in message and "No such file or directory" in message


def test_cc_that_writes_no_library(relu, monkeypatch, tmp_path):
    message = _broken(relu, monkeypatch, _fake(tmp_path, "cc", "exit 0"))
    assert "wrote no library" in message


def test_cc_that_writes_something_that_is_not_a_library(relu, monkeypatch, tmp_path):
    cc = _fake(tmp_path, "cc", 'echo "not a library" > "$out"')
    message = _broken(relu, monkeypatch, cc)
    assert "cannot be loaded" in message and str(cc) in message
    assert not relu.library_path(relu._source(), str(cc)).exists()  # not kept for the next process


def test_cc_that_fails_with_many_lines_gives_its_first_error(relu, monkeypatch, tmp_path):
    lines = "".join(f"echo 'k.c:{i}:1: note: line {i}' >&2\n" for i in range(30))
    cc = _fake(tmp_path, "cc", f"{lines}echo 'k.c:31:5: error: {'x' * 400}' >&2\n{lines}exit 1")
    message = _broken(relu, monkeypatch, cc)
    assert "exit status 1" in message and "k.c:31:5: error: xxx" in message and "(and 60 more lines)" in message
    assert len(message) < 600


def test_cc_that_makes_a_library_without_the_kernels(relu, monkeypatch, tmp_path):
    cc = _fake(tmp_path, "cc", f'exec {COMPILER} -shared -fPIC -x c /dev/null -o "$out"')
    message = _broken(relu, monkeypatch, cc)
    assert f"lacks its kernel {relu.PREFIX}_" in message
    assert not relu.library_path(relu._source(), str(cc)).exists()


def test_cc_that_hangs_is_stopped_after_the_timeout(relu, monkeypatch, tmp_path):
    """The compiler and what it started are killed: the sleep it runs is gone too."""
    pid_file = tmp_path / "pid"
    cc = _fake(tmp_path, "cc", f'sleep 30 &\necho $! > {pid_file}\nwait\nexit 0')
    monkeypatch.setenv("SYMGRAD_COMPILE_TIMEOUT", "1")
    start = time.monotonic()
    message = _broken(relu, monkeypatch, cc)
    assert time.monotonic() - start < 15
    assert "took more than 1 s" in message and "SYMGRAD_COMPILE_TIMEOUT" in message
    pid = int(pid_file.read_text())
    for _ in range(100):  # its sleep was killed with it (reaped by init a moment later)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "?"
        assert state == "Z", f"the compiler's child {pid} still runs"


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf"])
def test_a_bad_timeout_setting_is_one_value_error(relu, monkeypatch, value):
    monkeypatch.setenv("SYMGRAD_COMPILE_TIMEOUT", value)
    monkeypatch.setattr(relu, "library_path", lambda source, cc: relu.SOURCE.with_name(f"{relu.PREFIX}.{'3' * 16}.so"))
    with pytest.raises(ValueError, match="SYMGRAD_COMPILE_TIMEOUT must be a positive number of seconds") as info:
        relu.forward(X)  # a library to compile (none kept under that name)
    _one_line(info)
