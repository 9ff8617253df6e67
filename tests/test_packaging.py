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
