"""The `symgrad` command line: list, derive, generate, cache.  Wiring only; the work is in the API.

Every error is one line on stderr and exit status 2; a stale --check exits 1 with a diff.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import warnings
from pathlib import Path

from . import __version__, api, backends, catalog, derivations, naming
from . import files as _files
from . import policy as _policy
from .backends.common import cli_arguments, settings_lines
from .conventions import CONVENTIONS, PRESETS
from .derive import ALL_VARIABLES_UP_TO
from .ops import OPS, ORDERS, Param, resolve
from .pipeline import render
from .printers import text
from .suggest import closest as _closest
from .aminmax import NOT_A_MODULE
from . import hinge as _hinge

MAX_ITEMS = 12  # per derivation step, unless --full
WIDTH = 100  # `symgrad derive` text lines are wrapped to this width where they can be
CONTINUATION = "      "  # the indent of a wrapped line's continuation lines


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage + message)
        raise UsageError(message)


def _unrecognized(argv: list[str], flags) -> UsageError:
    """The error for arguments nobody took, with the known flag closest to the first unknown one."""
    first = next((a.split("=", 1)[0] for a in argv if a.startswith("-")), None)
    close = _closest(first, flags) if first else None
    return UsageError(f"unrecognized arguments: {' '.join(argv)}"
                      + (f"; did you mean {close}?" if close and close != first else ""))


def _number(s: str):
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None


def _int_or_none(s: str):  # --dim, and output sizes whose 'none' entries keep the input size
    if s.lower() == "none":
        return None
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or 'none', got {s!r}") from None


def _out_dir(s: str) -> Path:
    if not s:
        raise argparse.ArgumentTypeError("expected a directory, got ''")
    return Path(s)


def _add_param(parser: argparse.ArgumentParser, p: Param) -> None:
    flag = naming.cli_flag(p.name)
    if p.kind == "bool" and p.default is True:  # (include_self) --include-self / --no-include-self
        parser.add_argument(flag, dest=p.name, action=argparse.BooleanOptionalAction, default=None,
                            help=p.help)
    elif p.kind == "bool":
        parser.add_argument(flag, dest=p.name, action="store_true", default=None, help=p.help)
    elif p.kind == "ints" and p.none_entries:  # an entry 'none' keeps that input size
        parser.add_argument(flag, dest=p.name, type=_int_or_none, nargs="+", help=p.help)
    elif p.kind == "ints":
        parser.add_argument(flag, dest=p.name, type=int, nargs="+", help=p.help)
    elif p.kind == "int":
        parser.add_argument(flag, dest=p.name, type=int, help=p.help)
    elif p.kind == "dim":
        parser.add_argument(flag, dest=p.name, type=_int_or_none, nargs="+", help=p.help)
    elif p.kind == "ratios":
        parser.add_argument(flag, dest=p.name, type=_number, nargs="+", help=p.help)
    else:
        parser.add_argument(flag, dest=p.name, type=_number, help=p.help)


def _op_params(op: str, argv: list[str], flags: list[str] = ()) -> dict:
    """Parse an op's own parameters (spelled as in PyTorch, with dashes); flags: the command's
    own flags, for the suggestion when an argument is not recognized."""
    if op == "aminmax":
        raise ValueError(NOT_A_MODULE)
    if op in _hinge.OPS:  # composed at the host level (hinge.py)
        raise ValueError(_hinge.not_a_module(op))
    if op not in OPS:
        close = _closest(op, [*OPS, *_hinge.OPS])  # (the composed losses too)
        hint = f"; did you mean {close!r}?" if close else ""
        raise ValueError(f"unknown op {op!r}{hint} (expected one of: {', '.join(OPS)})")
    parser = _Parser(prog=f"symgrad ... {op}", add_help=False)
    for p in OPS[op].params:
        _add_param(parser, p)
    ns, rest = parser.parse_known_args(argv)
    if rest:
        raise _unrecognized(rest, [naming.cli_flag(p.name) for p in OPS[op].params] + flags)
    params = {}
    for p in OPS[op].params:
        v = getattr(ns, p.name)
        if v is None:
            continue
        if isinstance(v, list):
            if p.kind == "dim" and None in v:
                if len(v) > 1:
                    raise ValueError("--dim takes ints, or 'none' alone")
                v = None
            elif p.none_entries:
                v = tuple(v)  # (None,) stays a value: every output size is the input's
            else:
                v = v[0] if len(v) == 1 else tuple(v)
        params[p.name] = v
    return params


def _add_settings(p: argparse.ArgumentParser) -> None:
    p.add_argument("--convention", choices=tuple(PRESETS), default=None,
                   help="framework preset: tie policy, NaN rule and argument order per op")
    p.add_argument("--ties", choices=_policy.POLICIES, default=None, help="tie policy (overrides --convention)")
    p.add_argument("--nan", choices=tuple(_policy.ALL_NAN_RULES), default=None,
                   help="NaN rule (overrides --convention)")
    p.add_argument("--order", choices=ORDERS, default=None,
                   help="argument order of an elementwise op's max/min (overrides --convention)")


def _add_expr(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expr", default=None, metavar="EXPR",
                   help='an expression instead of an op, e.g. "Max(x*y, x + y, 0)" (parsed, never '
                   'evaluated)')
    p.add_argument("--inputs", nargs="+", default=None, metavar="NAME",
                   help="--expr: the input names in order, separated by spaces or commas (default: "
                   "in order of first appearance)")
    p.add_argument("--wrt", nargs="+", default=None, metavar="NAME",
                   help="--expr: the inputs whose gradients backward returns, separated by spaces or "
                   "commas (default: all; None for the others)")
    p.add_argument("--name", default=None, help="--expr: the module name (a lowercase identifier)")


def _expr_op(ns, argv):
    """The Op of --expr (and the refusals of flags that do not apply to it)."""
    if argv:  # first: the value of an unknown flag may have been taken for the op
        raise _unrecognized(argv, ns.flags)
    if ns.op:
        raise ValueError(f"give an op or --expr, not both (got op {ns.op!r})")
    if ns.order is not None:
        raise ValueError("--order applies to catalog ops; an expression keeps its argument order")
    from .expr import make_op
    op, _ = make_op(ns.expr, ns.name, _names(ns.inputs), _names(ns.wrt), ns.ties, ns.convention, ns.nan)
    return op


def _names(values: list[str] | None) -> list[str] | None:
    """--inputs/--wrt names: separated by spaces (`--inputs x y`, as the pages print them) or by
    commas (`--inputs x,y`); an empty name stays, for the parser to refuse."""
    return None if values is None else [n.strip() for v in values for n in v.split(",")]


def _no_expr_flags(ns) -> None:
    for flag in ("inputs", "wrt", "name"):
        if getattr(ns, flag, None) is not None:
            raise ValueError(f"--{flag} applies to --expr only")


def _resolve(ns, argv):
    return resolve(ns.op, ns.ties, convention=ns.convention, nan=ns.nan, order=ns.order,
                   **_op_params(ns.op, argv, ns.flags))


def _parser() -> argparse.ArgumentParser:
    top = _Parser(prog="symgrad", description="Derive max-family backward rules and generate code.")
    top.add_argument("--version", action="version", version=f"symgrad {__version__}")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="ops, their parameters, the tie policies")
    c = sub.add_parser("conventions", help="each op's gradient at ties, kinks, NaN and inf, per "
                       "convention and policy")
    c.add_argument("--update", type=Path, metavar="FILE",
                   help="rewrite the table between the conventions-table markers of FILE")
    c.add_argument("--check", type=Path, metavar="FILE",
                   help="exit 1 with a diff if FILE's table is stale; write nothing")
    c.add_argument("--expr", default=None, metavar="EXPR",
                   help="an expression's gradient at each of its kinks and ties, per policy and "
                   "under PyTorch's and JAX's autodiff, flagging where the two differ")
    c.add_argument("--inputs", nargs="+", default=None, metavar="NAME",
                   help="--expr: the input names in order (default: in order of first "
                   "appearance)")
    d = sub.add_parser("derive", help="print the derivation of an op's (or an expression's) backward")
    d.add_argument("op", nargs="?")
    _add_settings(d)
    _add_expr(d)
    d.add_argument("--full", action="store_true", help="after the rule, the whole derivation: every item "
                   "of every step")
    d.add_argument("--format", choices=("text", "markdown", "latex"), default="text",
                   help="text (default), a Markdown page with math and a routing picture, or a "
                   "standalone LaTeX document")
    d.add_argument("--out", type=_out_dir, default=None, help="--format markdown: write the page "
                   "into this directory as a file beside its picture, as the catalog does")
    g = sub.add_parser("generate", help="generate an op's module, or the whole catalog")
    g.add_argument("op", nargs="?")
    _add_settings(g)
    _add_expr(g)
    g.add_argument("--backend", choices=backends.NAMES + ("all",), default="numpy",
                   help=", ".join(f"{b.name} ({b.help})" for b in backends.REGISTRY.values())
                   + ", or all (every backend)")
    g.add_argument("--out", type=_out_dir, default=None, help="output directory")
    g.add_argument("--catalog", action="store_true", help="regenerate every catalog entry")
    g.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff if stale")
    g.add_argument("--force", action="store_true", help="overwrite files without symgrad's header")
    c = sub.add_parser("cache", help="the cache of generated modules: info (where, how much) or clear")
    c.add_argument("action", choices=("info", "clear"))
    return top


# ----------------------------------------------------------------------------- commands

NBSP = "\u00a0"  # joins words that a wrapped line keeps together (a flag and its value)


def _fill(text: str, lead: str, indent: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=lead, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False).replace(NBSP, " ")


def _columns(rows: list[tuple[str, list[str]]], out, indent: str = "  ") -> None:
    """rows of (name, paragraphs): the paragraphs start in one column, after the longest name, each
    on its own line, wrapped to WIDTH under themselves."""
    width = max(len(name) for name, _ in rows)
    for name, paragraphs in rows:
        lead = f"{indent}{name:<{width}}  "
        for i, text in enumerate(paragraphs):
            print(_fill(text, lead if i == 0 else " " * len(lead), " " * len(lead)), file=out)


def cmd_list(out) -> int:
    print("ops:", file=out)
    rows = []
    for name, spec in OPS.items():
        flags = [naming.cli_flag(p.name) + ("" if p.kind == "bool" else f"{NBSP}{p.name.upper()}")
                 + (f"{NBSP}(required)" if p.required else "") for p in spec.params]
        rows.append((name, [spec.summary] + ([" ".join(flags)] if flags else [])))
    _columns(rows, out)
    print(f"tie policies (--ties; default {_policy.DEFAULT_POLICY}):", file=out)
    _columns([(info.name, [info.rule]) for info in _policy.TIES.values()], out)
    print(f"NaN rules (--nan; default {_policy.DEFAULT_NAN}):", file=out)
    _columns([(r.name, [f"(with {'/'.join(r.policies)}) {r.rule}"])
              for r in _policy.ALL_NAN_RULES.values()], out)
    print(f"conventions (--convention): {', '.join(CONVENTIONS)}; `symgrad conventions` shows them",
          file=out)
    from .expr import CONSTANTS, KNOWN
    print("expressions (derive/generate --expr EXPR [--inputs ...] [--wrt ...] --name NAME):", file=out)
    print(_fill(f"numbers, inputs, {NBSP.join('+-*/')}{NBSP}**, {', '.join(CONSTANTS)} and "
                f"{', '.join(KNOWN)}", "  ", "  "), file=out)
    return 0


def cmd_conventions(ns, out) -> int:
    from . import table
    from .files import diff
    if ns.expr is not None:
        if ns.update or ns.check:
            raise ValueError("--expr prints its table; --update and --check apply to the op table")
        from . import expr_table
        print(expr_table.markdown(ns.expr, _names(ns.inputs)), end="", file=out)
        return 0
    if ns.inputs is not None:
        raise ValueError("--inputs applies to --expr only")
    md = table.markdown()
    target = ns.update or ns.check
    if target is None:
        print(md, end="", file=out)
        return 0
    text = _files.read_text(target, strict=True)  # a regular file, bounded; errors name it
    new = table.update(text, md)
    if ns.check:
        if new != text:
            print(diff(target, new), end="", file=out)
            print(f"symgrad: {target}'s conventions table is stale; run `symgrad conventions "
                  f"--update {target}`", file=sys.stderr)
            return 1
        print(f"{target}: conventions table up to date", file=out)
        return 0
    if new != text:
        _files.write_file(target, new, force=True)
    print(f"{'updated' if new != text else 'unchanged'} {target}", file=out)
    return 0


def _show(items, full: bool) -> list[str]:
    shown = items if full or len(items) <= MAX_ITEMS else items[:MAX_ITEMS]
    lines = [f"  {label} = {text(expr)}" if not label.startswith(" ") else f"  {label}: {text(expr)}"
             for label, expr in shown]
    if len(shown) < len(items):
        lines.append(f"  ... {len(items) - len(shown)} more (--full shows all)")
    return lines


def _breaks(line: str) -> list[str]:
    """line cut after each break opportunity: a product's '*' (not '**') and a space, outside the
    brackets of an indicator ([x0 > x1] stays whole)."""
    chunks, start, depth = [], 0, 0
    for i, ch in enumerate(line):
        depth += (ch == "[") - (ch == "]")
        power = line[i - 1:i] == "*" or line[i + 1:i + 2] == "*"
        if depth == 0 and (ch == " " or (ch == "*" and not power)):
            chunks.append(line[start:i + 1])
            start = i + 1
    return chunks + [line[start:]]


def wrap(line: str, width: int = WIDTH) -> list[str]:
    """A long derive line as lines of at most width characters, cut between the factors of a
    product or between words, continuation lines indented (a chunk longer than width, one
    indicator, stays whole): derivations of large windows print products of hundreds of factors.
    A command (a line that starts with spaces and `symgrad `) stays whole: it runs as printed."""
    if len(line) <= width or line.lstrip().startswith("symgrad "):
        return [line]
    lines, current = [], ""
    for chunk in _breaks(line):
        if current.strip() and len(current) + len(chunk.rstrip()) > width:
            lines.append(current.rstrip())
            current = CONTINUATION + chunk.lstrip()
        else:
            current += chunk
    return lines + [current.rstrip()]


def _print_wrapped(lines: list[str], out) -> None:
    print("\n".join(part for line in lines for part in wrap(line)), file=out)


def _progress():
    """A callback for derivations.announcing that prints one line on stderr before the first
    derivation a command runs (a large window takes seconds), only when stderr is a terminal."""
    shown = []

    def announce(op) -> None:
        if shown or not sys.stderr.isatty():
            return
        size = f" ({op.window_size()}-element window)" if op.spec.strategy.static else ""
        print(f"symgrad: deriving {op.name}{size}...", file=sys.stderr, flush=True)
        shown.append(op)
    return announce


def _steps_and_checks(d, full: bool) -> list[str]:
    """A derivation's steps and checks, as `symgrad derive` prints them."""
    lines = []
    for step in d.steps:
        if not step.items:  # a smooth expression has no max/min: no W-form, no delta terms
            continue
        lines += ["", f"== {step.title} ==", f"  ({step.note})"] + _show(list(step.items), full)
    return lines + ["", "== checks =="] + [f"  {c}" for c in d.checks]


def _rule_then_steps(op, d, full: bool, full_command: str) -> list[str]:
    """The rule first (rule.py: one screen); with --full, every item of every step after it."""
    from .rule import rule_lines
    return rule_lines(op, d, None if full else full_command) + (_steps_and_checks(d, True) if full else [])


def cmd_derive_expr(ns, argv: list[str], out) -> int:
    op = _expr_op(ns, argv)
    if ns.out is not None:
        raise ValueError("derive --out writes a catalog op's page; an expression's page is printed")
    if ns.format != "text":  # the expression's page (pages.page: docs_special.expression_page)
        from . import pages
        with derivations.announcing(_progress()):
            print(pages.render(op, ns.format), end="", file=out)
        return 0
    with derivations.announcing(_progress()):
        d = api._derive(op)
    from .docs_special import _expr_command
    lines = [f"expression: {op.params['expr']}", f"inputs: {', '.join(op.params['inputs'])}; "
             f"gradients returned for: {', '.join(op.params['wrt'])}"] + settings_lines(op)
    lines += _rule_then_steps(op, d, ns.full, _expr_command(op, "derive", "--full"))
    _print_wrapped(lines, out)
    return 0


def cmd_derive(ns, argv: list[str], out) -> int:
    if ns.expr is not None:
        return cmd_derive_expr(ns, argv, out)
    _no_expr_flags(ns)
    if not ns.op:
        raise ValueError("derive needs an op (or --expr)")
    op = _resolve(ns, argv)
    if ns.out is not None:
        return _write_page(op, ns, out)
    if ns.format != "text":
        from . import pages
        print(pages.render(op, ns.format), end="", file=out)
        return 0
    full = ns.full
    with derivations.announcing(_progress()):
        d = api._derive(op)
    lines = [f"op: {op.describe()}"] + settings_lines(op)
    lines.extend(op.spec.strategy.describe(op, ALL_VARIABLES_UP_TO))
    args = cli_arguments(op)
    lines += _rule_then_steps(op, d, full, f"symgrad derive {op.name}{' ' + args if args else ''} --full")
    if full:
        lines += op.spec.strategy.backward(op)
    _print_wrapped(lines, out)
    return 0


def _write_page(op, ns, out) -> int:
    """derive --format markdown --out DIR: the page and its picture as the catalog writes them."""
    if ns.format != "markdown":
        raise ValueError(f"derive --out writes a Markdown page: it needs --format markdown, got --format {ns.format}")
    from . import pages
    files = pages.page_files(op)
    _check_out_dir(ns.out)
    for name in files:  # refuse before writing anything, so nothing is half-done
        _files.check_writable(ns.out / name, files[name], False)
    for name in files:
        changed = _files.write_file(ns.out / name, files[name])
        print(f"{'wrote' if changed else 'unchanged'} {ns.out / name} (op {op.name}, {_settings_summary(op)})", file=out)
    return 0


def cmd_generate(ns, argv: list[str], out) -> int:
    if ns.catalog:
        if ns.op or argv or ns.expr is not None:
            raise ValueError("generate --catalog takes no op, --expr or op parameters")
        _no_expr_flags(ns)
        return _generate_catalog(ns.out or Path("generated"), ns.check, ns.force, out)
    if ns.expr is not None:
        op = _expr_op(ns, argv)
        if ns.name is None:
            raise ValueError("generate --expr needs --name NAME (a lowercase identifier)")
    else:
        _no_expr_flags(ns)
        if not ns.op:
            raise ValueError("generate needs an op (or --expr, or --catalog)")
    if ns.expr is None:
        op = _resolve(ns, argv)  # first: an unknown flag may be a misspelt --out
    if ns.out is None and not ns.check:
        raise ValueError("generate needs --out DIR")
    if ns.backend == "all":  # every backend that builds this op's kernel
        chosen = [b for b in backends.REGISTRY.values() if b.builds(op)]
    else:
        chosen = [backends.get(ns.backend)]
    with derivations.announcing(_progress()):
        files = {name: source for b in chosen for name, source in render(op, b).items()}
    _check_out_dir(ns.out or Path("."))
    paths = [(ns.out or Path(".")) / name for name in files]
    if ns.check:
        stale = 0
        for path in paths:
            d = _files.check_file(path, files[path.name])
            if d:
                print(d, end="", file=out)
                print(f"{path}: stale", file=sys.stderr)
                stale += 1
            else:
                print(f"{path}: up to date ({_settings_summary(op)})", file=out)
        return 1 if stale else 0
    _check_out_dir(ns.out)
    for path in paths:  # refuse before writing anything, so nothing is half-done
        _files.check_writable(path, files[path.name], ns.force)
    for path in paths:
        changed = _files.write_file(path, files[path.name], force=ns.force)
        print(f"{'wrote' if changed else 'unchanged'} {path} (op {op.name}, {_settings_summary(op)})",
              file=out)
    return 0


def _settings_summary(op) -> str:
    origin = dict(op.origin)
    if op.spec.strategy.expression:
        return f"tie policy {op.ties} [{origin['ties']}], NaN rule {op.nan}"
    parts = [f"tie policy {op.ties} [{origin['ties']}]", f"NaN rule {op.nan} [{origin['nan']}]"]
    if op.spec.strategy.elementwise:
        parts.append(f"order {op.order} [{origin['order']}]")
    return ", ".join(parts)


def _check_out_dir(d: Path) -> None:
    try:
        _files.check_out(d)
    except ValueError as exc:
        raise ValueError(f"--out {_files.shown(d)}: {exc}") from None


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def cmd_cache(action: str, out) -> int:
    """info: the entries of generated modules, the cached derivations, and the files and bytes of
    symgrad's in the cache; clear removes exactly those and says so, counted the same way."""
    from . import cache
    n = cache.clear() if action == "clear" else cache.info()
    what = (f"{_count(n['modules'], 'module entry', 'module entries')}, "
            f"{_count(n['derivations'], 'derivation', 'derivations')}")
    files = _count(n["files"], "file", "files")
    if action == "clear" and n["failed"]:  # a read-only cache: one error line, exit status 2
        raise ValueError(f"could not remove {_count(n['failed'], 'file', 'files')} of symgrad's from "
                         f"{_files.shown(n['location'])} ({n['error']}); removed {what} ({files}, "
                         f"{n['bytes']} bytes)")
    if action == "clear":
        kept = (f"; kept {_count(n['kept'], 'module entry', 'module entries')} holding files that "
                f"are not symgrad's" if n["kept"] else "")
        print(f"removed {what} ({files}, {n['bytes']} bytes) from {_files.shown(n['location'])}{kept}",
              file=out)
    else:
        print(f"location: {_files.shown(n['location'])}\nentries: {what}\n"
              f"size: {n['bytes']} bytes ({n['bytes'] / 1024:.1f} KiB) in {files}", file=out)
    return 0


def _generate_catalog(out_dir: Path, check: bool, force: bool, out) -> int:
    _check_out_dir(out_dir)
    files = catalog.render_all()
    stale = catalog.stale_files(out_dir, files)
    if check:
        diffs = [_files.check_file(out_dir / rel, src) for rel, src in files.items()]
        diffs = [d for d in diffs if d]
        for p in stale:
            diffs.append(f"{p}: not in the catalog (would be removed)\n")
        if diffs:
            print("".join(diffs), end="", file=out)
            print(f"symgrad: {out_dir} is stale: {len(diffs)} file(s) differ; "
                  f"run `symgrad generate --catalog`", file=sys.stderr)
            return 1
        print(f"{out_dir}: {len(files)} files up to date", file=out)
        return 0
    _check_out_dir(out_dir)
    # refuse before writing anything, so nothing is half-done
    for rel in files:
        p = out_dir / rel
        if p.exists() and not force and not _files.has_provenance(p):
            raise ValueError(f"refusing to overwrite {_files.shown(p)}: it was not generated by symgrad "
                             f"(no provenance header); pass --force to replace it")
    changed = sum(_files.write_file(out_dir / rel, src, force=force) for rel, src in files.items())
    for p in stale:
        p.unlink()
    print(f"{out_dir}: {len(files)} files, {changed} written, {len(stale)} removed", file=out)
    return 0


def _run(argv: list[str]) -> int:
    parser = _parser()
    ns, rest = parser.parse_known_args(argv)
    # the command's own flags, for a suggestion when an argument is not recognized
    ns.flags = [f for a in parser._subparsers._group_actions[0].choices[ns.command]._actions
                for f in a.option_strings if f.startswith("--")]
    if ns.command in ("list", "conventions", "cache") and rest:
        raise _unrecognized(rest, ns.flags)
    if ns.command == "list":
        return cmd_list(sys.stdout)
    if ns.command == "conventions":
        return cmd_conventions(ns, sys.stdout)
    if ns.command == "derive":
        return cmd_derive(ns, rest, sys.stdout)
    if ns.command == "cache":
        return cmd_cache(ns.action, sys.stdout)
    return cmd_generate(ns, rest, sys.stdout)


def _one_line_warnings(previous):
    """showwarning for the CLI: symgrad's own warnings (the derivation cache is off) as one line
    on stderr, others as before."""
    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, derivations.CacheWarning):
            print(f"symgrad: warning: {message}", file=sys.stderr, flush=True)
        else:
            previous(message, category, filename, lineno, file, line)
    return show


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _one_line_warnings(warnings.showwarning)
                return _run(argv)
        finally:  # here (--help too), so that a closed pipe is caught below, not at the exit
            sys.stdout.flush()
    except (UsageError, ValueError, TypeError) as exc:
        print(f"symgrad: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader closed the pipe (`symgrad derive ... | head`): not an error; stdout goes to
        # /dev/null so that the interpreter's final flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        name = _files.shown(exc.filename) if exc.filename is not None else ""
        print(f"symgrad: error: {exc.strerror or exc}: {name}".rstrip(": "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("symgrad: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
