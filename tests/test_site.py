"""The documentation site (docs/, Sphinx with MyST): it builds offline with warnings as errors, its
generated pages hold what the code holds, and in headless Chromium its math renders, its pictures
load and its internal links resolve; the browser check fails on a page whose math is left raw.

The default run builds the hand-written pages with the first catalog page of a few ops
(SYMGRAD_DOCS_OPS); the whole catalog is built with -m slow.  The browser tests need Debian's
chromium (.ci/run installs it); without it they skip, except under CI, where they fail.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import browser
from symgrad import backends, site
from symgrad.catalog_entries import entries
from symgrad.ops import OPS
from symgrad.policy import TIES as POLICY

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SUBSET = ["maximum", "relu", "max_pool2d", "max_unpool2d"]
BUILD = f'python -m sphinx -W --keep-going -b html docs docs/_build/html'


def build(tmp: Path, subset: list[str] | None) -> subprocess.CompletedProcess:
    """Copy docs/'s sources into tmp/docs and build them into tmp/html as the documented command
    does (warnings as errors)."""
    src = tmp / "docs"
    shutil.copytree(DOCS, src, ignore=shutil.ignore_patterns("_build", site.GENERATED, site.DERIVATIONS))
    shutil.copytree(ROOT / "examples", tmp / "examples")  # the tutorials include their scripts
    env = dict(os.environ)
    env.pop(site.SUBSET, None)
    if subset:
        env[site.SUBSET] = ",".join(subset)
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           str(src), str(tmp / "html")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="module")
def quick_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("site")
    r = build(tmp, SUBSET)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stderr == "", r.stderr  # no warning at all
    return tmp / "html"


def _needs_chromium():
    if browser.chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")


def test_the_documented_build_command_is_in_conf_and_readme():
    assert BUILD in (DOCS / "conf.py").read_text()
    assert BUILD in (ROOT / "README.md").read_text()


def test_the_site_holds_what_the_code_holds(quick_site):
    """Generated at build time: the subset's derivation pages (each with its formulas and, where
    the module draws one, its picture), every backend and every op, every policy."""
    stems = {Path(p).stem for p in site.pages.catalog_files(
        [next(op for op in entries() if op.name == n) for n in SUBSET]) if p.endswith(".md")}
    built = {p.stem for p in (quick_site / site.DERIVATIONS).glob("*.html")}
    assert built == stems
    text = {p.relative_to(quick_site).as_posix(): _visible(p) for p in quick_site.rglob("*.html")}
    assert all(f"{b.name} {b.help}" in text["backends.html"] for b in backends.REGISTRY.values())
    assert all(re.search(rf"\b{name}\b", text["cli.html"]) for name in OPS)
    assert all(f"{p.formula('max')} {p.rule}" in text["policies.html"] for p in POLICY.values())
    relu = next(p for p in built if p.startswith("relu"))
    assert "\\(" in text[f"{site.DERIVATIONS}/{relu}.html"]  # its formulas, for MathJax


def _visible(page: Path) -> str:
    """The page's text with its tags removed and its spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text())).split())


def test_the_site_loads_nothing_from_the_network_and_its_links_resolve(quick_site):
    assert browser.broken_links(quick_site) == []
    assert (quick_site / "_static" / "mathjax" / "tex-svg.js").is_file()


def _pages(root: Path) -> list[str]:
    chosen = ["index.html", "policies.html", "cli.html", "api.html", "backends.html", "study.html",
              "tutorials.html"]
    chosen += sorted(str(p.relative_to(root)) for p in (root / site.DERIVATIONS).glob("*.html"))
    return chosen


def test_in_chromium_math_renders_and_pictures_load(quick_site):
    _needs_chromium()
    pages = _pages(quick_site)
    seen = browser.inspect(quick_site, pages)
    assert set(seen) == set(pages)
    assert browser.problems(seen) == []
    derivation_pages = [p for p in pages if p.startswith(site.DERIVATIONS) and "index" not in p]
    assert all(seen[p]["math"] > 5 and seen[p]["rendered"] == seen[p]["math"] for p in derivation_pages)
    assert sum(len(seen[p]["images"]) for p in derivation_pages) >= 2  # maximum's and max_pool2d's


def test_the_browser_check_fails_on_unrendered_math(quick_site, tmp_path):
    """A built page without its MathJax script, and a page of raw $$ TeX: both reported."""
    _needs_chromium()
    page = next((quick_site / site.DERIVATIONS).glob("relu*.html"))
    copy = tmp_path / "site"
    shutil.copytree(quick_site, copy)
    stripped = copy / site.DERIVATIONS / page.name
    stripped.write_text(re.sub(r'<script[^>]*tex-svg\.js[^>]*></script>', "", stripped.read_text()))
    (copy / "raw.html").write_text("<html><body><p>The backward: $$\\frac{\\partial y}{\\partial x} = "
                                   "[x > 0]$$</p><img src=\"missing.svg\"></body></html>")
    seen = browser.inspect(copy, [f"{site.DERIVATIONS}/{page.name}", "raw.html", "index.html"])
    found = browser.problems(seen)
    assert any(f"{page.name}: " in p and "not rendered" in p for p in found)
    assert any(f"{page.name}: raw TeX on screen" in p for p in found)
    assert any("raw.html: raw TeX on screen" in p for p in found)
    assert any("raw.html: picture missing.svg did not load" in p for p in found)
    assert not any(p.startswith("index.html") for p in found)


@pytest.mark.slow
def test_the_whole_site_builds_and_renders(tmp_path):
    r = build(tmp_path, None)
    assert r.returncode == 0 and r.stderr == "", r.stdout[-3000:] + r.stderr[-3000:]
    html = tmp_path / "html"
    built = {p.stem for p in (html / site.DERIVATIONS).glob("*.html")}
    assert built == {Path(p).stem for p in site.pages.catalog_files(entries()) if p.endswith(".md")}
    assert browser.broken_links(html) == []
    if browser.chromium() is not None:
        assert browser.problems(browser.inspect(html, _pages(html))) == []
