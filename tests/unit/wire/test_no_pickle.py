"""The wire never carries pickle: no module under common/ or services/ may import it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FORBIDDEN = {"pickle", "cPickle", "cloudpickle", "dill", "marshal", "_pickle", "shelve"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("__import__", "import_module"):
            names.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return names


def test_no_pickle_imports() -> None:
    files = [p for d in ("common", "services") for p in (ROOT / d).rglob("*.py")]
    assert files, "no sources found"
    offenders = {str(p.relative_to(ROOT)): sorted(imported_modules(p) & FORBIDDEN) for p in files}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"pickle-family imports: {offenders}"


def test_torch_load_always_weights_only() -> None:
    for d in ("common", "services"):
        for path in (ROOT / d).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "load" and \
                        getattr(node.func.value, "id", "") == "torch":
                    kws = {k.arg: k.value for k in node.keywords}
                    ok = isinstance(kws.get("weights_only"), ast.Constant) and kws["weights_only"].value is True
                    assert ok, f"{path}:{node.lineno}: torch.load without weights_only=True"


def test_the_scanner_finds_a_forbidden_import(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("import os\nfrom pickle import loads\nimport cloudpickle as cp\n")
    assert imported_modules(f) & FORBIDDEN == {"pickle", "cloudpickle"}
