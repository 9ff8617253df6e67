"""Sphinx configuration of symgrad's documentation site.

Build it (offline, warnings as errors) from the repository root:

    pip install ".[docs]" && python -m sphinx -W --keep-going -b html docs docs/_build/html

The derivation pages, the policy, op and backend tables and the CLI's help are written from the
code when the build starts (symgrad/site.py), into docs/derivations/ and docs/_generated/ (not
committed).  Math is typeset in the browser by the MathJax copy that the sphinx-mathjax-offline
package ships, copied into _static/: the site loads nothing from the network.
"""

import importlib
import importlib.util
import shutil
from pathlib import Path

from symgrad import __version__, site

project = "symgrad"
author = "the symgrad authors"
copyright = "symgrad authors"
version = release = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.mathjax"]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_generated"]  # _generated/: pieces that pages include
html_theme = "alabaster"
html_theme_options = {"font_family": "sans-serif", "head_font_family": "sans-serif",
                      "page_width": "1100px", "sidebar_width": "230px"}
html_static_path = []
# the bundled MathJax (offline): typesets in SVG, needs no web fonts
mathjax_path = "mathjax/tex-svg.js"
MATHJAX_FILES = ("tex-svg.js", "input/tex/extensions")

autodoc_member_order = "bysource"
# the API pages import symgrad.torch and symgrad.jax; a framework that is not installed is mocked
autodoc_mock_imports = [m for m in ("torch", "jax") if importlib.util.find_spec(m) is None]


def _mathjax_folder() -> Path:
    try:
        package = importlib.import_module("sphinx-mathjax-offline")
    except ImportError:
        raise RuntimeError('the documentation needs its extra: pip install ".[docs]"') from None
    return Path(package.__file__).parent / "static" / "mathjax"


def _generate(app) -> None:
    site.write(Path(app.srcdir))


def _copy_mathjax(app, exc) -> None:
    if exc is not None or app.builder.format != "html":
        return
    source, target = _mathjax_folder(), Path(app.outdir) / "_static" / "mathjax"
    for rel in MATHJAX_FILES:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        if (source / rel).is_dir():
            shutil.copytree(source / rel, target / rel, dirs_exist_ok=True)
        else:
            shutil.copy2(source / rel, target / rel)


def setup(app):
    _mathjax_folder()  # a missing extra is one clear error before anything is built
    app.connect("builder-inited", _generate)
    app.connect("build-finished", _copy_mathjax)
