"""bridge.environ_reader: the bridges' per-call read of $SYMGRAD_CPU_BACKEND and
$SYMGRAD_NUM_THREADS sees what os.environ.get sees, set, changed and removed between calls.
Oracle: os.environ.get itself."""

from __future__ import annotations

import os

from symgrad import bridge

NAME = "SYMGRAD_TEST_ENVIRON_READER"


def _decoded(raw):
    return raw.decode() if isinstance(raw, bytes) else raw


def test_the_reader_sees_what_os_environ_get_sees(monkeypatch):
    read = bridge.environ_reader(NAME)
    monkeypatch.delenv(NAME, raising=False)
    assert read() is None and os.environ.get(NAME) is None
    for value in ("cpu", "numpy", "", " 3 "):
        monkeypatch.setenv(NAME, value)
        assert _decoded(read()) == os.environ.get(NAME) == value
    monkeypatch.delenv(NAME)
    assert read() is None
