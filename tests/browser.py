"""Open built HTML pages in headless Chromium (Debian's package) and report what a reader sees.

A harness page, written next to the pages, loads each page in an iframe, waits for MathJax to
finish typesetting (or for a page without it to load), and records per page: the math elements
Sphinx wrote and how many MathJax rendered, MathJax's error boxes, the visible text outside code
blocks (to find raw TeX or $$ left on screen), and each picture's load state (complete with a
natural width).  Chromium runs it with --dump-dom and the harness's result is read back from the
dumped DOM.  Internal links are resolved against the files (``broken_links``).
"""

from __future__ import annotations

import functools
import html
import json
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--allow-file-access-from-files"]
TEX_LEFT = re.compile(r"\$\$|\\\(|\\\)|\\\[|\\\]|\\(begin|end|frac|left|right|mathrm|text|cdot|sum|prod)\b")

HARNESS = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>harness</title></head><body>
<pre id="result">pending</pre>
<script>
const pages = %s;
const results = {};
function sleep(ms) { return new Promise(r => setTimeout(r, ms)); }
async function inspect(frame) {
  const win = frame.contentWindow, doc = frame.contentDocument;
  for (let i = 0; i < 200 && win.MathJax && !(win.MathJax.startup && win.MathJax.startup.promise); i++)
    await sleep(50);
  if (win.MathJax && win.MathJax.startup && win.MathJax.startup.promise) await win.MathJax.startup.promise;
  for (let i = 0; i < 100; i++) {
    const imgs = Array.from(doc.images);
    if (imgs.every(im => im.complete)) break;
    await sleep(50);
  }
  const hidden = Array.from(doc.querySelectorAll("pre, code, script, style"));
  hidden.forEach(e => e.style.display = "none");
  const text = doc.body.innerText;
  hidden.forEach(e => e.style.display = "");
  return {
    math: doc.querySelectorAll(".math").length,
    rendered: doc.querySelectorAll(".math mjx-container, mjx-container.MathJax").length,
    errors: doc.querySelectorAll("mjx-merror, [data-mjx-error]").length,
    mathjax: !!win.MathJax,
    text: text,
    images: Array.from(doc.images).map(im => ({src: im.getAttribute("src"), complete: im.complete,
                                                width: im.naturalWidth})),
  };
}
async function run() {
  for (const page of pages) {
    const frame = document.createElement("iframe");
    const loaded = new Promise(r => frame.onload = r);
    frame.src = page;
    document.body.appendChild(frame);
    await loaded;
    try { results[page] = await inspect(frame); } catch (e) { results[page] = {failed: String(e)}; }
    frame.remove();
  }
  document.getElementById("result").textContent = JSON.stringify(results);
}
run();
</script></body></html>
"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _dump_dom(url: str, budget_ms: int, timeout: int) -> str:
    with tempfile.TemporaryDirectory(prefix="symgrad-chromium-") as profile:
        r = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}",
                            f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
                           capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"chromium exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def inspect(root: Path, pages: list[str], timeout: int = 180) -> dict:
    """{page: what the browser saw} for pages (paths relative to root)."""
    harness = root / "_symgrad_browser_harness.html"
    harness.write_text(HARNESS % json.dumps(pages))
    try:
        dom = _dump_dom(harness.resolve().as_uri(), 30000 + 5000 * len(pages), timeout)
    finally:
        harness.unlink()
    m = re.search(r'<pre id="result">(.*?)</pre>', dom, flags=re.S)
    if m is None or m.group(1) == "pending":
        raise RuntimeError("the harness did not finish: " + dom[-500:])
    return json.loads(html.unescape(m.group(1)))


def problems(seen: dict) -> list[str]:
    """What a reader would see wrong on each page: unrendered or failed math, raw TeX on screen,
    pictures that did not load."""
    out = []
    for page, s in seen.items():
        if "failed" in s:
            out.append(f"{page}: {s['failed']}")
            continue
        if s["rendered"] < s["math"]:
            out.append(f"{page}: {s['math'] - s['rendered']} of {s['math']} formulas not rendered")
        if s["errors"]:
            out.append(f"{page}: {s['errors']} MathJax errors")
        raw = TEX_LEFT.search(s["text"])
        if raw:
            at = raw.start()
            out.append(f"{page}: raw TeX on screen: {s['text'][max(0, at - 40):at + 40]!r}")
        for im in s["images"]:
            if not (im["complete"] and im["width"] > 0):
                out.append(f"{page}: picture {im['src']} did not load")
    return out


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])
        if tag in ("img", "script") and a.get("src"):
            self.hrefs.append(a["src"])
        if tag == "link" and a.get("href"):
            self.hrefs.append(a["href"])


@functools.lru_cache(maxsize=None)
def _parsed(path: Path) -> _Links:
    p = _Links()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def broken_links(root: Path) -> list[str]:
    """Every internal link, picture, script and stylesheet of every page under root that names a
    file that is not there or an anchor the target page lacks; and any resource loaded from the
    network."""
    out = []
    for page in sorted(root.rglob("*.html")):
        for href in _parsed(page).hrefs:
            u = urlsplit(href)
            if u.scheme in ("http", "https"):
                if not href.startswith(("https://www.sphinx-doc.org", "https://alabaster.readthedocs.io",
                                        "https://github.com/bitprophet/alabaster")):
                    out.append(f"{page.relative_to(root)}: a network link {href}")
                continue
            if u.scheme or href.startswith("mailto:"):
                continue
            target = (page.parent / unquote(u.path)).resolve() if u.path else page
            if not target.exists():
                out.append(f"{page.relative_to(root)}: {href} (no such file)")
            elif u.fragment and target.suffix == ".html" and u.fragment not in _parsed(target).ids:
                out.append(f"{page.relative_to(root)}: {href} (no such anchor)")
    return out


def screenshot(url: str, png: Path, size: str = "1200,1600") -> None:
    with tempfile.TemporaryDirectory(prefix="symgrad-chromium-") as profile:
        subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=20000",
                        f"--window-size={size}", f"--screenshot={png}", url],
                       capture_output=True, timeout=120, check=True)
