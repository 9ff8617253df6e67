"""A generated expression module's header prints the command that regenerates it byte for byte:
the tie policy only where it was given (a default one given as --ties would make the file say
"(explicit)").  Oracle: the file itself, written again by the command its header prints."""

from __future__ import annotations

import shlex

import pytest

from symgrad import cli


@pytest.mark.parametrize("settings", [[], ["--ties", "split"]])
def test_an_expressions_header_command_rebuilds_it(settings, tmp_path, capsys):
    first, again = tmp_path / "first", tmp_path / "again"
    assert cli.main(["generate", "--expr", "Max(x, 0)", "--name", "hdr", *settings, "--out", str(first)]) == 0
    (module,) = first.iterdir()
    command = module.read_text(encoding="utf-8").splitlines()[1].removeprefix("#   ")
    argv = [str(again) if a == "DIR" else a for a in shlex.split(command)[1:]]
    assert ("--ties" in argv) == bool(settings), command
    assert cli.main(argv) == 0, argv
    assert (again / module.name).read_bytes() == module.read_bytes(), command
