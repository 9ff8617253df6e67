"""What `pip install .` ships: every package of the source tree and every template folder is named
in pyproject.toml (setuptools is given an explicit list, so a new subpackage left out of it imports
from a checkout, where the tests run, but not from an installed copy)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package(folder: Path) -> str:
    return ".".join(folder.relative_to(ROOT).parts)


def test_every_package_is_installed():
    packages = {_package(init.parent) for init in (ROOT / "symgrad").rglob("__init__.py")
                if "__pycache__" not in init.parts}
    missing = sorted(packages - set(CONFIG["packages"]))
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}"


def test_every_template_folder_is_package_data():
    data = CONFIG["package-data"]
    missing = []
    for folder in sorted({t.parent for t in (ROOT / "symgrad").rglob("*.jinja")}):
        # the nearest package above the folder and the glob relative to it
        package = folder
        while not (package / "__init__.py").exists():
            package = package.parent
        glob = "/".join((*folder.relative_to(package).parts, "*.jinja"))
        if glob not in data.get(_package(package), []):
            missing.append(f"{_package(package)}: {glob}")
    assert not missing, f"pyproject.toml package-data lacks {missing}"


def _install_lines():
    """Every `pip install ...` that the README, the package's messages, the tests and the
    benchmarks print, with where it is."""
    import re
    files = [ROOT / "README.md", *(ROOT / "symgrad").rglob("*.py"), *(ROOT / "symgrad").rglob("*.jinja"),
             *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    files.remove(Path(__file__).resolve())  # this file quotes the wrong line in a docstring
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"pip install ([^`);&\n]*)", line):
                yield f"{path.relative_to(ROOT)}:{n}", m.group(1)


def test_install_lines_install_from_the_checkout():
    """symgrad is not on a package index: `pip install "symgrad[torch]"` fails in a fresh
    environment ('No matching distribution found'); its extras install from the checkout,
    `pip install ".[torch]"`, and each extra named there exists."""
    import re
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    wrong = []
    for where, args in _install_lines():
        if "symgrad[" in args or re.search(r"(^|\s)['\"]?symgrad(\s|$)", args):
            wrong.append(f"{where}: pip install {args}")
        for extra in re.findall(r"\.\[([\w,]+)\]", args):
            wrong += [f"{where}: no extra {e!r}" for e in extra.split(",") if e not in extras]
    assert not wrong, wrong


def test_framework_extras_carry_ml_dtypes():
    """A framework's bfloat16 tensors reach symgrad as ml_dtypes' bfloat16: the torch and jax
    extras install it, so that bfloat16 does not need a third extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in ("torch", "jax"):
        assert any(d.startswith("ml_dtypes") for d in extras[name]), (name, extras[name])
