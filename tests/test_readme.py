"""README.md is a front page: under 250 lines, the Quickstart's two commands, install lines from
the checkout, and every command and Python snippet in it runs as written, in a copy of the
checkout's tracked files (a clean clone), except the pip installs (tests/test_packaging.py checks
that each names an extra that exists), the test suite itself and the site build (tests/test_site.py
runs the documented command on the site's sources); its links into docs/ name pages that exist.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
QUICKSTART = [
    'pip install . && symgrad generate max_pool2d --kernel-size 3 --stride 2 --padding 1 --out example '
    '&& python examples/run_max_pool2d.py example',
    'pip install ".[test]" && python -m pytest',
]
NOT_RUN = ("pip install", "python -m pytest", "python -m sphinx")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def commands() -> list[str]:
    """Each shell command of the README, without comments, the parts joined by && that install or
    run the suite or build the site left out."""
    out = []
    for block in _blocks("sh"):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            parts = [p.strip() for p in line.split("&&") if p.strip() and not p.strip().startswith(NOT_RUN)]
            if parts:
                out.append(" && ".join(parts))
    return out


def test_the_front_page_is_short_and_keeps_the_quickstart():
    assert len(README.splitlines()) < 250
    blocks = [b.strip() for b in _blocks("sh")]
    assert blocks[:2] == QUICKSTART
    assert "symgrad[" not in README  # extras install from the checkout: pip install ".[torch]"
    for extra in ("torch", "jax", "cuda", "docs"):
        assert f'pip install ".[{extra}]"' in README


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The checkout's tracked files (and the new ones git does not ignore), copied."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    dest = tmp_path_factory.mktemp("clone")
    for f in files:
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    return dest


def test_every_command_runs_as_written(clone):
    cmds = commands()
    assert any("symgrad generate" in c for c in cmds) and any("examples/" in c for c in cmds)
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    for c in cmds:
        r = subprocess.run(c, shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{c}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        assert r.stdout.strip(), c


def test_every_python_snippet_runs_as_written(clone, capsys):
    snippets = _blocks("python")
    assert len(snippets) >= 2  # PyTorch and JAX
    for code in snippets:
        exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "0.3333" in out and "[0.  0.5 1. ]" in out  # the values the comments state


def test_links_into_the_site_name_existing_pages():
    links = re.findall(r"\]\(((?:docs|generated)/[^)#]+)", README)
    assert len(links) >= 10
    assert all((ROOT / link).is_file() for link in links), [lk for lk in links if not (ROOT / lk).is_file()]
