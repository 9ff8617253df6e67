"""The on-disk caches: derivations (symgrad.derivations) and generated modules (symgrad.load)."""

from __future__ import annotations

import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import symgrad
from symgrad import api, derivations
from symgrad.ops import resolve


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(derivations, "_MEMO", {})
    return tmp_path / "cache"


def _no_deriving(op, display=True):
    raise AssertionError(f"derived {op.name} again instead of reading the cache")


def test_a_derivation_is_stored_and_read_back(cache, monkeypatch):
    op = resolve("max_pool1d", "split", kernel_size=3)
    d = derivations.derive(op)
    (entry,) = (cache / "derivations").glob("*.pickle")
    assert entry.stem == derivations.key(op)
    monkeypatch.setattr(derivations, "_MEMO", {})
    monkeypatch.setattr(derivations, "_derive", _no_deriving)
    again = derivations.derive(op)
    assert again.op is op
    assert again.partials == d.partials and again.checks == d.checks
    assert [s.items for s in again.steps] == [s.items for s in d.steps]


def test_the_key_names_op_parameters_policy_and_code(monkeypatch):
    keys = {derivations.key(resolve("max_pool2d", ties, kernel_size=k))
            for ties in ("first", "split") for k in (2, 3)}
    keys.add(derivations.key(resolve("amax", dim=1)))
    assert len(keys) == 5
    op = resolve("relu")
    before = derivations.key(op)
    monkeypatch.setattr(derivations, "code_hash", lambda: "edited derive.py")
    assert derivations.key(op) != before


def test_the_code_hash_changes_with_every_module_a_derivation_runs(tmp_path, monkeypatch):
    """The hash of the deriving code, computed over a copy of the package (nothing derived):
    equal to the installed package's where the copy is unedited, and changed by an edit to any
    of its modules, those the issue named (derive_special.py, expr.py, derivation.py, kinds/)
    and every module imported while deriving among them."""
    package = Path(derivations.__file__).resolve().parent
    copy = tmp_path / "symgrad"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "_generated"))
    monkeypatch.setattr(derivations, "__file__", str(copy / "derivations.py"))
    code_hash = derivations.code_hash.__wrapped__  # not the process's cached value
    base = code_hash()
    assert base == derivations.code_hash()  # where the package is does not count
    derivations.derive(resolve("max_pool1d", "split", kernel_size=2))  # imports what deriving runs
    ran = {Path(m.__file__).resolve().relative_to(package).as_posix() for m in list(sys.modules.values())
           if getattr(m, "__file__", None) and Path(m.__file__).resolve().is_relative_to(package)}
    named = {"derive.py", "derive_special.py", "expr.py", "derivation.py", "policy.py", "indicators.py",
             "ops.py", *(p.relative_to(copy).as_posix() for p in (copy / "kinds").glob("*.py"))}
    assert named <= {p.relative_to(copy).as_posix() for p in copy.rglob("*.py")}
    for name in sorted(named | ran):
        path = copy / name
        original = path.read_bytes()
        path.write_bytes(original + b"# an edit\n")
        assert code_hash() != base, name
        path.write_bytes(original)
    assert code_hash() == base


def test_a_damaged_entry_is_derived_again_and_replaced(cache, monkeypatch):
    op = resolve("clamp", min=0, max=1)
    path = cache / "derivations" / f"{derivations.key(op)}.pickle"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a pickle")
    d = derivations.derive(op)
    monkeypatch.setattr(derivations, "_MEMO", {})
    monkeypatch.setattr(derivations, "_derive", _no_deriving)
    assert derivations.derive(op).partials == d.partials


def test_an_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(blocker))
    monkeypatch.setattr(derivations, "_MEMO", {})
    d = symgrad.derive("relu", ties="split")
    assert d.partials


def test_ops_that_differ_only_in_their_nan_rule_keep_their_own_op(cache):
    torch_op = resolve("maximum", convention="torch")
    jax_op = resolve("maximum", convention="jax")
    assert torch_op.nan != jax_op.nan
    assert derivations.key(torch_op) != derivations.key(jax_op)
    assert derivations.derive(torch_op).op is torch_op
    assert derivations.derive(jax_op).op is jax_op
    assert derivations.derive(torch_op).op is torch_op  # from memory, still the caller's op


def test_cache_clear_removes_cached_derivations_and_info_counts_them(cache):
    from symgrad import cache as module_cache
    derivations.derive(resolve("max_pool1d", "last", kernel_size=5))
    (entry,) = (cache / "derivations").glob("*.pickle")
    assert module_cache.info(cache)["bytes"] == entry.stat().st_size
    (cache / "derivations" / "notes.txt").write_text("not symgrad's\n")
    module_cache.clear(cache)
    assert [p.name for p in (cache / "derivations").iterdir()] == ["notes.txt"]


class _Planted:
    """A pickle that runs a command when loaded (what an attacker would plant)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        import os
        return (os.system, (self.command,))


class _Exits:
    def __reduce__(self):
        import sys
        return (sys.exit, (3,))


@pytest.mark.parametrize("payload", ["command", "exit"])
def test_a_planted_pickle_is_never_run(cache, tmp_path, monkeypatch, payload):
    op = resolve("max_pool1d", "split", kernel_size=3)
    marker = tmp_path / "ran"
    planted = _Planted(f"touch {marker}") if payload == "command" else _Exits()
    entry = cache / "derivations" / f"{derivations.key(op)}.pickle"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(pickle.dumps(planted))
    monkeypatch.setattr(derivations, "_MEMO", {})
    d = derivations.derive(op)  # neither runs the command nor exits: derived again
    assert not marker.exists()
    monkeypatch.setattr(derivations, "_MEMO", {})
    monkeypatch.setattr(derivations, "_derive", _no_deriving)
    assert d.partials and derivations.derive(op).partials == d.partials  # and replaced


def test_a_derivation_in_a_directory_others_can_write_is_not_read(cache, monkeypatch):
    op = resolve("max_pool1d", "first", kernel_size=2)
    derivations.derive(op)
    folder = cache / "derivations"
    monkeypatch.setattr(derivations, "_MEMO", {})
    monkeypatch.setattr(derivations, "_derive", _no_deriving)
    assert derivations.derive(op).partials  # read back while private
    folder.chmod(0o777)
    try:
        monkeypatch.setattr(derivations, "_MEMO", {})
        with pytest.raises(AssertionError, match="derived max_pool1d again"):
            derivations.derive(op)
    finally:
        folder.chmod(0o755)


def test_cache_clear_never_follows_links_and_keeps_files_without_provenance(cache, tmp_path):
    from symgrad import cache as cache_mod
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('my work')\n")
    (project / "kernel.cu").write_text("// mine\n")
    backend = cache / "numpy"
    backend.mkdir(parents=True, exist_ok=True)
    (backend / ("a" * 20 + "-" + "b" * 12)).symlink_to(project, target_is_directory=True)
    foreign = backend / ("c" * 20 + "-" + "d" * 12)
    foreign.mkdir()
    (foreign / "notes.py").write_text("x = 1  # not generated by symgrad\n")
    (foreign / "notes.py.sha256").write_text("not a hash\n")
    (cache / "elsewhere").symlink_to(project, target_is_directory=True)  # a linked "backend"
    cache_mod.clear(cache)
    assert (project / "train.py").read_text() == "print('my work')\n" and (project / "kernel.cu").exists()
    assert (foreign / "notes.py").exists() and (foreign / "notes.py.sha256").exists()


def test_a_module_planted_where_others_can_write_is_not_run(cache, monkeypatch, tmp_path):
    """A module with a matching hash in a cache entry that others can write is not trusted: the
    hash guards against damage, not against another user of a shared cache."""
    from symgrad import cache as cache_mod
    monkeypatch.setattr(api, "_LOADED", {})
    module = symgrad.load("relu", ties="split")  # generated into the private cache
    path = Path(module.__file__)
    marker = tmp_path / "ran"
    planted = path.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n"
    path.write_text(planted)
    cache_mod.hash_path(path).write_text(f"{cache_mod.digest(planted.encode())}  {path.name}\n")
    path.parent.chmod(0o777)
    try:
        monkeypatch.setattr(api, "_LOADED", {})
        again = symgrad.load("relu", ties="split")
        assert not marker.exists()
        y, saved = again.forward(np.array([-1.0, 0.0, 2.0]))
        assert again.backward(np.ones(3), saved)[0].tolist() == [0.0, 0.5, 1.0]
    finally:
        path.parent.chmod(0o755)


def test_load_works_where_the_cache_cannot_be_written(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache would be\n")
    monkeypatch.setenv("SYMGRAD_CACHE_DIR", str(blocker))
    monkeypatch.setattr(api, "_LOADED", {})
    module = symgrad.load("relu", ties="split", convention=None)
    assert not str(module.__file__).startswith(str(blocker))
    y, _ = module.forward(np.array([-1.0, 2.0]))
    assert y.tolist() == [0.0, 2.0]


def test_a_cached_module_names_the_generator_hash_of_its_cache_folder(cache, monkeypatch):
    """The provenance header names the generator hash that keys the cache folder
    (<backend>/<key>-<generator hash>), in the NumPy module, the CUDA source and its loader; the
    committed catalog names none (its files would change with every edit of symgrad's code)."""
    from symgrad.backends.common import CATALOG_GENERATOR, generator_hash
    monkeypatch.setattr(api, "_LOADED", {})
    monkeypatch.setattr(api, "catalog_dir", lambda: None)
    m = symgrad.load("relu", ties="split")  # the catalog is not consulted here
    path = Path(m.__file__)
    assert path.parent.name.endswith("-" + generator_hash())
    head = path.read_text().splitlines()[:12]
    assert f"# generator: {generator_hash()}" in head
    from symgrad import backends
    from symgrad.pipeline import render
    for name, source in render(resolve("relu", "split"), backends.get("cuda")).items():
        prefix = "// generator: " if name.endswith(".cu") else "# generator: "
        assert prefix + generator_hash() in source.splitlines()[:12], name
    root = Path(__file__).resolve().parents[1] / "generated"
    for sub in ("numpy/relu_first.py", "cuda/relu_first.cu"):
        lines = (root / sub).read_text().splitlines()[:12]
        assert any(line.endswith("generator: " + CATALOG_GENERATOR) for line in lines), sub


# ----------------------------------------------------------------------------- catalog pages

def test_a_catalog_page_is_read_back_until_the_generator_or_the_catalog_changes(cache, monkeypatch):
    """generate --catalog reads each op's rendered docs page from the disk cache: the same text as
    rendering it, rendered anew under another generator hash (an edited module or template) or
    another catalog.toml, and a damaged entry is rendered again."""
    from symgrad import catalog_entries, pages
    op = resolve("max_pool1d", "split", kernel_size=3)
    rendered = pages.page(op)
    want = pages.render_markdown(op, image_src=lambda src: src, pg=rendered)  # the oracle: rendering it
    calls = []
    real_page = pages.page
    monkeypatch.setattr(pages, "page", lambda o: calls.append(o) or real_page(o))

    def fresh():  # a new process: nothing in memory, the disk cache as it is
        monkeypatch.setattr(derivations, "_MEMO", {})
        return pages.catalog_page(op)

    first = fresh()
    assert (first.stem, first.markdown, first.svg) == (rendered.module_name, want, rendered.svg)
    assert len(calls) == 1
    again = fresh()
    assert again == first and len(calls) == 1  # read back, not rendered
    entries = sorted((cache / "derivations").glob("*.pickle"))
    for entry in entries:
        entry.write_bytes(b"damaged")
    assert fresh() == first and len(calls) == 2
    monkeypatch.setattr(pages, "generator_hash", lambda: "an edited template")
    assert fresh() == first and len(calls) == 3
    edited = cache.parent / "catalog.toml"
    edited.write_bytes(catalog_entries.CATALOG_FILE.read_bytes() + b"\n# an edit\n")
    monkeypatch.setattr(pages, "CATALOG_FILE", edited)
    assert fresh() == first and len(calls) == 4
    assert fresh() == first and len(calls) == 4
