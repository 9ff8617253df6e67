"""The documentation site's generated pages (docs/, built with Sphinx): written from the code when
the site is built, so the site describes whatever the catalog, the ops and the backends hold.

``write(folder)`` writes, under ``folder``:

* ``derivations/``: every catalog entry's derivation page with its routing picture and the index
  (``pages.catalog_files``: the pages `symgrad generate --catalog` writes to generated/docs/);
* ``_generated/``: Markdown pieces the hand-written pages include: the tie policies
  (``policy.TIES``), the ops (`symgrad list`), the backends and the ops each builds
  (``backends.REGISTRY``), and each CLI verb's ``--help``.

docs/conf.py calls it; ``SYMGRAD_DOCS_OPS=name,name,...`` keeps the first catalog page of each op
named (the test's quick build)."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from . import backends, cli, pages
from . import policy as _policy
from .catalog_entries import entries
from .ops import OPS

GENERATED = "_generated"
DERIVATIONS = "derivations"
SUBSET = "SYMGRAD_DOCS_OPS"  # op names: the first catalog page of each (a quick build)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def policies_md() -> str:
    rows = ["| policy | W's row of a max (a min reverses every comparison) | at a tie | subgradient |",
            "|---|---|---|---|"]
    for p in _policy.TIES.values():
        default = " (default)" if p.name == _policy.DEFAULT_POLICY else ""
        rows.append(f"| `{p.name}`{default} | `{_cell(p.formula('max'))}` | {_cell(p.rule)} | "
                    f"{'yes' if p.subgradient else 'no: a k-way tie sums to k'} |")
    return "\n".join(rows) + "\n"


def _captured(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cli.main(argv)
    return out.getvalue()


def _code(text: str) -> str:
    return f"```text\n{text.rstrip()}\n```\n"


def ops_md() -> str:
    return f"The output of `symgrad list`:\n\n{_code(_captured(['list']))}"


def cli_md() -> str:
    """`symgrad --help` and each verb's --help, as the parser prints them."""
    import argparse
    parts = [f"### `symgrad`\n\n{_code(_captured(['--help']))}"]
    verbs = next(a.choices for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    for verb in verbs:
        parts.append(f"### `symgrad {verb}`\n\n{_code(_captured([verb, '--help']))}")
    return "\n".join(parts)


def _builds(backend, spec) -> bool:
    from .lower import form_of
    forms = getattr(backend.package, "FORMS", None)
    return forms is None or form_of(spec.strategy) in forms


def backends_md() -> str:
    rows = ["| backend | writes | ops it builds |", "|---|---|---|"]
    for b in backends.REGISTRY.values():
        built = [name for name, spec in OPS.items() if _builds(b, spec)]
        ops = "every op" if len(built) == len(OPS) else ", ".join(f"`{n}`" for n in built)
        rows.append(f"| `{b.name}` | {_cell(b.help)} | {ops} |")
    return "\n".join(rows) + "\n"


def _catalog_ops() -> list:
    """The catalog's entries; with SYMGRAD_DOCS_OPS=name,name,... the first entry of each op named."""
    ops = entries()
    names = [n for n in os.environ.get(SUBSET, "").split(",") if n]
    first = {}
    for op in ops:
        first.setdefault(op.name, op)
    missing = [n for n in names if n not in first]
    if missing:
        raise ValueError(f"{SUBSET}: no catalog entry of {', '.join(missing)}; expected op names of "
                         f"catalog.toml, e.g. {', '.join(list(first)[:4])}")
    return [first[n] for n in names] if names else ops


def files() -> dict[str, str]:
    """{path relative to the docs folder: text} of every generated page."""
    out = {f"{DERIVATIONS}/{path.removeprefix('docs/')}": text
           for path, text in pages.catalog_files(_catalog_ops()).items()}
    out.update({f"{GENERATED}/policies.md": policies_md(), f"{GENERATED}/ops.md": ops_md(),
                f"{GENERATED}/cli.md": cli_md(), f"{GENERATED}/backends.md": backends_md()})
    return out


def write(folder: Path) -> list[Path]:
    """Write the generated pages under folder (its derivations/ replaced whole); the paths."""
    folder = Path(folder)
    for sub in (DERIVATIONS, GENERATED):
        for old in sorted((folder / sub).glob("*")) if (folder / sub).is_dir() else []:
            old.unlink()
    written = []
    for rel, text in files().items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
