"""docs/protocol.md is the authority: every message type and field in the code must be in it."""

from __future__ import annotations

import re
from pathlib import Path

from rlfleet.common.wire.codec import DTYPES, PROTOCOL_VERSION, REASONS
from rlfleet.common.wire.schema import MESSAGES, range_text

DOC = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()


def sections() -> dict[str, str]:
    parts = re.split(r"^### `([a-z_]+)`\s*$", DOC, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n## ")[0] for i in range(1, len(parts), 2)}


def table_names(text: str) -> set[str]:
    return set(re.findall(r"^\| `([A-Za-z_]+)` \|", text, flags=re.M))


def test_versions_agree() -> None:
    m = re.search(r"\*\*Protocol version: (\d+)\*\*", DOC)
    assert m, "docs/protocol.md must state '**Protocol version: N**'"
    assert int(m.group(1)) == PROTOCOL_VERSION


def test_every_message_type_and_field_is_documented() -> None:
    docs = sections()
    missing_types = sorted(set(MESSAGES) - set(docs))
    assert not missing_types, f"message types missing from docs/protocol.md: {missing_types}"
    for name, spec in MESSAGES.items():
        documented = table_names(docs[name])
        wanted = set(spec.fields) | set(spec.arrays)
        assert not wanted - documented, f"{name}: undocumented fields {sorted(wanted - documented)}"
        assert not documented - wanted, f"{name}: documented but not in code {sorted(documented - wanted)}"


def test_documented_types_exist_in_code() -> None:
    extra = sorted(set(sections()) - set(MESSAGES))
    assert not extra, f"docs/protocol.md documents types the code lacks: {extra}"


def test_dtypes_and_reasons_are_documented() -> None:
    for name in DTYPES:
        assert f"`{name}`" in DOC, name
    for reason in REASONS:
        assert f"`{reason}`" in DOC, reason


def test_every_int_field_states_the_range_the_decoder_checks() -> None:
    docs = sections()
    for name, spec in MESSAGES.items():
        for field_name, f in spec.fields.items():
            if f.kind != "int":
                continue
            assert f.bounds is not None
            row = re.search(rf"^\| `{field_name}` \| ([^|]+) \|", docs[name], flags=re.M)
            assert row, f"{name}.{field_name} has no row"
            want = f"int, {range_text(f.bounds)}"
            assert row.group(1).strip() == want, f"{name}.{field_name}: the doc says {row.group(1)!r}; code: {want!r}"


def test_every_reason_a_service_refuses_with_is_documented() -> None:
    """The reasons of the handlers' refusals (RequestError, the registry's BadMember, Dedup's refusals) are
    in docs/protocol.md too, not only the decoder's."""
    root = Path(__file__).resolve().parents[3]
    pattern = re.compile(r"""(?:RequestError|BadMember)\(\s*"([a-z_]+)"|^\s*return \("([a-z_]+)",""", re.M)
    found: set[str] = set()
    for folder in ("services", "common"):
        for path in (root / folder).rglob("*.py"):
            for m in pattern.finditer(path.read_text()):
                found.add(m.group(1) or m.group(2))
    assert {"too_many_members", "sender_forgotten", "bad_value"} <= found  # the pattern still finds them
    missing = sorted(r for r in found if f"`{r}`" not in DOC)
    assert not missing, f"reasons refused with but not in docs/protocol.md: {missing}"
