"""The docs page of any op, written out: a max/min op's page (docs.py) or unpooling's and
logsumexp's (docs_special.py, built from docs.py's pieces), as Markdown or LaTeX, and the
catalog's pages with their index.  Above both page builders, so neither imports the other."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable

from . import derivations
from . import policy as _policy
from .backends.common import generator_hash
from .catalog_entries import CATALOG_FILE
from .conventions import PRESETS, preset_for
from .docs import FORMATS, PROVENANCE, Page, _op_label, _templates, latex_page, markdown_page
from .docs import page as _maxmin_page
from .docs_special import expression_page, special_page
from .ops import Op


def page(op: Op) -> Page:
    if op.spec.strategy.expression:  # a user's expression: its derivation's steps
        return expression_page(op)
    if op.spec.strategy.derivation == "order":  # sort, topk, cummax, cummin (docs_order.py)
        from .docs_order import order_page
        return order_page(op)
    return special_page(op) if op.spec.strategy.special else _maxmin_page(op)


def render_markdown(op: Op, image_src: Callable[[str], str] | None = None, pg: Page | None = None) -> str:
    """The Markdown page of an op (docs.markdown_page)."""
    return markdown_page(pg or page(op), image_src)


def render_latex(op: Op) -> str:
    return latex_page(page(op))


def render(op: Op, fmt: str) -> str:
    if fmt == "markdown":
        return render_markdown(op)
    if fmt == "latex":
        return render_latex(op)
    raise ValueError(f"unknown format {fmt!r}; expected one of: {', '.join(FORMATS)}")


# ------------------------------------------------------------------------------ catalog

@dataclass(frozen=True)
class CatalogPage:
    """An op's page as the catalog writes it: its file's stem, its Markdown, its picture (or None)."""
    stem: str
    markdown: str
    svg: str | None


def catalog_page(op: Op) -> CatalogPage:
    """The catalog's page of op: from this process, else from the disk cache of derivations, else
    rendered (a page derives, and reads its derivations back from that cache: most of a warm
    catalog run).  Its key names the op (derivations.key), generator_hash() (every module and
    template of symgrad, SymPy's version) and catalog.toml (a page says whether its op is listed),
    so an edit to any of them renders it anew."""
    def make() -> CatalogPage:
        pg = page(op)
        return CatalogPage(pg.module_name, render_markdown(op, image_src=lambda src: src, pg=pg), pg.svg)
    listed = hashlib.sha256(CATALOG_FILE.read_bytes()).hexdigest()
    blob = json.dumps({"catalog page": derivations.key(op), "generator": generator_hash(), "catalog": listed},
                      sort_keys=True)
    return derivations.memoized(hashlib.sha256(blob.encode()).hexdigest()[:24], CatalogPage, make)


def page_files(op: Op) -> dict[str, str]:
    """An op's page as files, as the catalog writes them (catalog_page): <stem>.md linking its
    picture <stem>.svg (where it has one)."""
    pg = catalog_page(op)
    return {f"{pg.stem}.md": pg.markdown} | ({f"{pg.stem}.svg": pg.svg} if pg.svg is not None else {})


def _preset_cell(convention: str, op) -> str:
    """The index's cell of an op's preset: its policy and NaN rule (none where the framework has
    no such op: roi_max_pool under jax)."""
    if op.name not in PRESETS[convention]:
        return "none"
    p = preset_for(convention, op.name, op.params)
    return f"{p.ties}, NaN {p.nan}" + (f", {p.order} order" if p.order != "given" else "")


def catalog_files(ops: list[Op]) -> dict[str, str]:
    """{relative path: text} of generated/docs: a page (+ picture) per entry, and an index."""
    files = {}
    rows = []
    for op in ops:
        pg = catalog_page(op)
        stem = pg.stem
        files[f"docs/{stem}.md"] = pg.markdown
        if pg.svg is not None:
            files[f"docs/{stem}.svg"] = pg.svg
        rows.append({"link": f"[`{_op_label(op)}`]({stem}.md)", "ties": op.ties, "nan": op.nan,
                     "torch": _preset_cell("torch", op), "jax": _preset_cell("jax", op),
                     "picture": "yes" if pg.svg is not None else ""})
    files["docs/index.md"] = _templates().get_template("docs/index.md.jinja").render(
        provenance=PROVENANCE, rows=rows, policies=list(_policy.TIES.values()))
    return files
