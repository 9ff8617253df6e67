"""Every committed derivation page's own Regenerate command rebuilds it byte for byte.

A page printed `symgrad derive abs --ties first --format markdown` while it said "tie policy:
first (default)": the command gave the tie policy explicitly, so the page it wrote said
"(explicit)"; and it printed the page with its picture inlined (a data: URI) where the committed
page links <stem>.svg.  The pages now print `... --format markdown --out DIR`.  The oracle is the committed page itself (generated/docs/, kept current by
`symgrad generate --catalog --check`)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from symgrad import cli

DOCS = Path(__file__).resolve().parent.parent / "generated" / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md") if "Regenerate: `symgrad derive" in p.read_text(encoding="utf-8"))
# the default run: a default tie policy, a policy and NaN rule an op fixes (nanmax), a preset
REPRESENTATIVE = ("abs_first.md", "nanmax_dimneg1_split.md", "amax_dimneg1_torch.md")


def _command(page: str, out: Path) -> list[str]:
    """The argv of the derive command a page prints after "Regenerate:" (DIR: out)."""
    text = (DOCS / page).read_text(encoding="utf-8")
    (command,) = re.findall(r"Regenerate: `(symgrad derive [^`]*)`", text)
    return [str(out) if a == "DIR" else a for a in shlex.split(command)[1:]]


def _regenerates(page: str, tmp_path: Path) -> None:
    """The page's command writes the page and its picture (if any) byte for byte."""
    argv = _command(page, tmp_path)
    assert "--out" in argv, argv  # the page is a file beside its picture
    assert cli.main(argv) == 0, argv
    written = sorted(p.name for p in tmp_path.iterdir())
    picture = page[:-3] + ".svg"
    assert written == sorted([page] + ([picture] if (DOCS / picture).exists() else [])), written
    for name in written:
        got, want = (tmp_path / name).read_bytes(), (DOCS / name).read_bytes()
        assert got == want, f"{name}: `symgrad {shlex.join(argv)}` writes another file; first differing line: " + next(
            (f"{a!r} != {b!r}" for a, b in zip(got.splitlines(), want.splitlines()) if a != b), "(lengths)")


def test_the_representative_pages_are_committed():
    assert set(REPRESENTATIVE) <= set(PAGES) and len(PAGES) > 50


@pytest.mark.parametrize("page", REPRESENTATIVE)
def test_a_pages_regenerate_command_rebuilds_it(page, tmp_path, capsys):
    _regenerates(page, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if p not in REPRESENTATIVE])
def test_every_pages_regenerate_command_rebuilds_it(page, tmp_path, capsys):
    _regenerates(page, tmp_path)


def test_derive_out_needs_a_markdown_page(tmp_path, capsys):
    """--out with another format, or with an expression: one error line, exit status 2."""
    for argv in (["derive", "abs", "--out", str(tmp_path)],
                 ["derive", "--expr", "Max(x, 0)", "--format", "markdown", "--out", str(tmp_path)]):
        capsys.readouterr()
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--out" in err, err
    assert not list(tmp_path.iterdir())
