"""Docs describe the code as it is: every class docs/architecture.md names exists under that name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("common", "services", "cli")


def defined_classes() -> set[str]:
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            names |= {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    return names


def named_classes(text: str) -> set[str]:
    """CamelCase words in backticks or on the data-path diagrams: what the page presents as classes."""
    code, prose, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            code.append(line)
        else:
            prose.append(line)
    code += re.findall(r"`([^`]+)`", "\n".join(prose))
    words = {w for chunk in code for w in re.findall(r"\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b", chunk)}
    return words


def test_every_class_architecture_md_names_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = named_classes(text)
    assert len(named) > 40, sorted(named)  # the check sees the page's classes
    missing = sorted(named - defined_classes())
    assert not missing, f"docs/architecture.md names classes the code does not define: {missing}"


def test_the_check_sees_a_class_that_is_not_there() -> None:
    assert "NoSuchServer" in named_classes("the `NoSuchServer` part") - defined_classes()
