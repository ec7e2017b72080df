"""The rooms keep their doors: who may import whom, and private names stay home.

common/ is what everything shares and imports neither services/ nor cli/; a service imports common/ only
(never cli/, the command line that runs it); cli/ may import both. harness/ (what tests and benchmarks
share) is never imported by the product, and benchmarks never import tests/. A role's service module is named in
common/roles.py as a string, not imported: cli/dispatch.py imports it. Read from the source (the AST of
every module, imports inside functions too), so a lazy import cannot slip past.

The product installs as one package, ``rlfleet``: common/, services/ and cli/ stay top-level folders of the
repository and import as ``rlfleet.common``, ``rlfleet.services`` and ``rlfleet.cli`` (rlfleet/ links to
them), so nothing installs a top-level ``common``. Their rooms are told apart by the second name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("common", "services", "cli", "rlfleet", "harness", "bench", "tests")
PRODUCT = ("common", "services", "cli")  # import names rlfleet.common, rlfleet.services, rlfleet.cli
# What each package must never import: the product never the test harness; benchmarks never the tests
# (what both need is in harness/); the Python API (rlfleet/) sits on the command line's code, not under it.
FORBIDDEN = {
    "common": ("services", "cli", "rlfleet", "harness", "bench", "tests"),
    "services": ("cli", "rlfleet", "harness", "bench", "tests"),
    "cli": ("rlfleet", "harness", "bench", "tests"),
    "rlfleet": ("harness", "bench", "tests"),
    "harness": ("bench", "tests"),
    "bench": ("tests",),
}


def modules(*packages: str) -> Iterator[tuple[str, Path]]:
    """(dotted import name, path) of every .py file under ``packages`` (rlfleet/'s links to the product's
    folders are not followed: each file is seen once, from its own folder)."""
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts[0] in PRODUCT:
                parts = ("rlfleet", *parts)
            yield ".".join(parts), path


def room(dotted: str) -> str:
    """The package a module name is in: rlfleet.common.x is in common, rlfleet.training in rlfleet."""
    parts = dotted.split(".")
    return parts[1] if parts[0] == "rlfleet" and len(parts) > 1 and parts[1] in PRODUCT else parts[0]


def imports(module: str, path: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line, imported module, imported name or None) of every import statement in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve it against this module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield node.lineno, base, alias.name


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_across_a_forbidden_door(package: str) -> None:
    bad = []
    for module, path in modules(package):
        for line, target, name in imports(module, path):
            targets = [target] if name is None else [target, f"{target}.{name}"]
            for full in targets:
                if room(full) in FORBIDDEN[package]:
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {full}")
    assert not bad, f"{package}/ must not import {' or '.join(FORBIDDEN[package])}/:\n" + "\n".join(bad)


def test_no_private_name_is_imported_from_another_module() -> None:
    """A leading underscore says "only this module uses it": another module that needs it needs a public
    name (or the code belongs where the name is)."""
    bad = []
    for module, path in modules(*PACKAGES):
        for line, target, name in imports(module, path):
            if room(target) not in PACKAGES:
                continue  # a library's private names are its business
            names = [*target.split("."), *([name] if name else [])]
            private = [n for n in names if is_private(n)]
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {'.'.join(names)}")
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


def test_the_product_is_imported_by_its_package_name_only() -> None:
    """``import common`` would work from the repository's root and nowhere else (nothing installs it), and a
    module imported under two names is two modules (two registries, two classes of one name)."""
    bad = [f"{path.relative_to(ROOT)}:{line} imports {target}"
           for module, path in modules(*PACKAGES) for line, target, _ in imports(module, path)
           if target.split(".")[0] in PRODUCT]
    assert not bad, "import the product as rlfleet.common, rlfleet.services, rlfleet.cli:\n" + "\n".join(bad)
    links = {p.name: p.readlink() for p in (ROOT / "rlfleet").iterdir() if p.is_symlink()}
    assert links == {name: Path("..", name) for name in PRODUCT}, links


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The walker finds lazy, relative and private imports (a check that sees nothing passes forever)."""
    path = tmp_path / "mod.py"
    path.write_text("import os\n\ndef f():\n    from rlfleet.services.actor import main\n"
                    "    from .sib import _hidden\n")
    found = list(imports("rlfleet.common.pkg.mod", path))
    assert (4, "rlfleet.services.actor", "main") in found
    assert (5, "rlfleet.common.pkg.sib", "_hidden") in found
    assert (1, "os", None) in found
    assert is_private("_hidden") and not is_private("__version__") and not is_private("main")
    assert room("rlfleet.services.actor") == "services" and room("rlfleet.training") == "rlfleet"
    assert room("common.envs") == "common" and room("numpy") == "numpy"
