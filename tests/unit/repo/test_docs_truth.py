"""Docs describe the code as it is: every `rlfleet` command and flag, every config field and every
repository path that README.md and docs/*.md name exists; docs/configuration.md names every shipped
config and algorithm, docs/launcher.md every option of the commands it shows.

What is read, to have no false alarms (prose is never read, only code):

- commands: ``rlfleet SUB ...`` (also ``.venv/bin/rlfleet``, ``python -m rlfleet.cli``) in a fenced block or an
  inline code span; the flags after it up to a shell separator (`` | ``, ``;``, ``&&``, `` # ``) or the
  span's end, in a fenced block also on continuation lines (after a trailing ``\\``, or lines that start
  with ``[`` or ``-``, as a synopsis wraps); under a heading that names ``rlfleet SUB``, an inline span
  that starts with a flag. Each flag must be an option of that subcommand.
- config fields: the key of ``--set KEY=VALUE`` and of ``RLFLEET_SECTION__FIELD=`` anywhere in code; in an
  inline code span, a dotted name whose first part is a section of the experiment (``learner.device``,
  ``replay.tables[].columns: first_insert``, ``algorithm[dqn].lr``); in a fenced block, such a name in
  quotes (``overrides={"env.id": ...}``). Each must resolve in the pydantic models (common/config/ and
  every algorithm's config: ``algorithm.lr`` resolves when some algorithm has ``lr``); a list's items may
  be written ``[]``, ``[name]`` or ``.0``; below a dict field (``env.kwargs``) anything goes.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from pydantic import BaseModel

from rlfleet.cli.main import main as cli_group
from rlfleet.common.config.experiment import Experiment
from rlfleet.common.config.explain import describe

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Names the docs give on purpose although no field has them: each with why.
NOT_FIELDS = {
    "evaluator.epsilon": "configuration.md: removed, and refused when a file still sets it",
    "algorithm.clip_rnage": "algorithms.md: a misspelt field, to show that it is refused",
    "actor.0.weight": "algorithms.md: a tensor of SAC's published actor, not a config field",
}
# What the docs write where a field goes, for the reader to fill in.
PLACEHOLDERS = {"field", "section.field", "key"}

INVOCATION = re.compile(r"(?:(?<=[\s`(/])|^)(?:rlfleet|python -m rlfleet\.cli)\s+(-[-\w]+|[a-z][a-z-]*)")
SEPARATOR = re.compile(r"\s(?:\|\|?|;|&&|#)\s|\s#$|$")
FLAG = re.compile(r"(?<![\w./=-])(--?[A-Za-z][\w-]*)")
SET = re.compile(r"--set[\s=]+['\"]?([A-Za-z_][\w.\[\]]*)=")
ENV_VAR = re.compile(r"\bRLFLEET_([A-Z0-9_]+?__[A-Z0-9_]+?)(?==|\b)")


def is_model(ann: object) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


# the experiment's sections: what a dotted name in the docs must start with to be read as a field
SECTION_NAMES = tuple(name for name, info in Experiment.model_fields.items()
                      if is_model(info.annotation) or any(map(is_model, typing.get_args(info.annotation))))
DOTTED = re.compile(r"(?<![\w./$-])((?:" + "|".join(SECTION_NAMES)
                    + r")(?:\.[A-Za-z_]\w*|\.\d+|\[[^\]\s]*\])+)(?![\w(/-]|\.\w)")
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "csv", "json", "pt", "npz", "log", "txt", "gif", "png", "html"}


@dataclass(frozen=True)
class Mention:
    doc: Path
    line: int
    kind: str  # "command", "flag" or "field"
    name: str
    command: str = ""

    def __str__(self) -> str:
        what = {"command": "no command rlfleet {}", "flag": "rlfleet {1} has no option {0}",
                "field": "no config field {}"}[self.kind].format(self.name, self.command)
        return f"{self.doc.relative_to(ROOT)}:{self.line}: {what}"


# ---- what the code has -------------------------------------------------------------------------------

def cli_options() -> dict[str, set[str]]:
    """Subcommand ('' for the group itself) -> every option it takes, --help included."""
    ctx = click.Context(cli_group)
    out = {"": {o for p in cli_group.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}}
    for name in cli_group.list_commands(ctx):
        command = cli_group.get_command(ctx, name)
        assert command is not None
        out[name] = {o for p in command.params if isinstance(p, click.Option)
                     for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
    return out


def field_paths() -> tuple[set[str], set[str]]:
    """Every field's dotted path (list items as N, any algorithm's field as algorithm.<name>), and the
    paths of dict fields, below which any key goes."""
    paths, dicts = set(), set()
    for doc in describe(Experiment):
        path = re.sub(r"^algorithm\[[^\]]+\]", "algorithm", doc.path)
        paths.add(path)
        if doc.allowed.startswith("dict"):
            dicts.add(path)
    return paths, dicts


def unknown_field(name: str, paths: set[str], dicts: set[str]) -> bool:
    path = re.sub(r"^algorithm\[[^\]]*\]", "algorithm", name)
    path = re.sub(r"\[[^\]]*\]|\.\d+", ".N", path)
    parts = path.split(".")
    if any(".".join(parts[:i]) in dicts for i in range(1, len(parts))):
        return False
    return path not in paths


# ---- what the docs say -------------------------------------------------------------------------------

def code(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line, code, fenced): each line of a fenced block, and each inline code span of the prose (one
    that wraps onto the next line joined into one)."""
    lines = text.splitlines()
    prose, fenced = [], False
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            prose.append("")
        elif fenced:
            prose.append("")
            yield number, line, True
        else:
            prose.append(line)
    joined = "\n".join(prose)
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", joined):
        yield joined.count("\n", 0, m.start()) + 1, m.group(1).replace("\n", " "), False


def heading_commands(text: str) -> list[str | None]:
    """For each line (from 1), the command its nearest heading names (``## `rlfleet up`: ...``), or None."""
    out: list[str | None] = [None]
    for line in text.splitlines():
        if line.startswith("#"):
            m = re.search(r"`(?:\S*/)?rlfleet ([a-z][a-z-]*)", line)
            out.append(m.group(1) if m else None)
        else:
            out.append(out[-1])
    return out


def commands(doc: Path, text: str) -> Iterator[Mention]:
    """Every rlfleet subcommand named and every flag given to one; under a heading that names a command,
    also an inline span that starts with a flag (`--resume RUN_DIR`)."""
    command: str | None = None
    continues = False
    under = heading_commands(text)
    for line, chunk, fenced in code(text):
        stripped = chunk.strip()
        if not (fenced and command is not None and (continues or stripped[:1] in ("[", "-"))):
            command = None
        if not fenced and stripped.startswith("-") and under[line] is not None:
            command = under[line]
        continues = fenced and stripped.endswith("\\")
        rest = chunk
        if (m := INVOCATION.search(chunk)) is not None:
            command, rest = m.group(1), chunk[m.start(1):]
            if command.startswith("-"):  # rlfleet --version
                command, rest = "", chunk[m.start(1):]
            else:
                yield Mention(doc, line, "command", command)
                rest = chunk[m.end(1):]
        if command is None:
            continue
        end = SEPARATOR.search(rest)
        assert end is not None
        for flag in FLAG.findall(rest[:end.start()]):
            yield Mention(doc, line, "flag", flag, command)
        if end.start() < len(rest.rstrip()):  # a separator ends the command
            command = None


def fields(doc: Path, text: str) -> Iterator[Mention]:
    for line, chunk, fenced in code(text):
        names = [k for k in SET.findall(chunk) if k.lower() not in PLACEHOLDERS]
        names += [v.lower().replace("__", ".") for v in ENV_VAR.findall(chunk)]
        if fenced:
            names += [m.group(1) for m in re.finditer(r"[\"']([a-z_][\w.\[\]]*)[\"']", chunk)
                      if DOTTED.fullmatch(m.group(1))]
        else:
            names += [n for n in DOTTED.findall(chunk) if n.rsplit(".", 1)[-1] not in FILE_SUFFIXES]
        for name in dict.fromkeys(names):
            yield Mention(doc, line, "field", name)


def problems(doc: Path, text: str) -> list[Mention]:
    options = cli_options()
    paths, dicts = field_paths()
    out = []
    for m in commands(doc, text):
        if m.kind == "command" and m.name not in options:
            out.append(m)
        elif m.kind == "flag" and m.command in options and m.name not in options[m.command]:
            out.append(m)
    out += [m for m in fields(doc, text) if m.name not in NOT_FIELDS and unknown_field(m.name, paths, dicts)]
    return out


# ---- the tests ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_and_field_the_docs_name_exists(doc: Path) -> None:
    found = problems(doc, doc.read_text())
    assert not found, "the docs name what the code does not have:\n" + "\n".join(map(str, found))


def test_the_docs_are_read() -> None:
    """The scan sees the commands and fields the docs are full of (a broken pattern would pass silently)."""
    mentions = [m for doc in DOCS for m in (*commands(doc, doc.read_text()), *fields(doc, doc.read_text()))]
    flags = {(m.command, m.name) for m in mentions if m.kind == "flag"}
    names = {m.name for m in mentions if m.kind == "field"}
    assert {("up", "--until-return"), ("up", "--resume"), ("eval", "--which"), ("train", "--serial")} <= flags
    assert {"learner.device", "env.id", "replay.durability", "security.mode"} <= names, sorted(names)
    assert len(flags) > 40 and len(names) > 80, (len(flags), len(names))


def test_the_check_catches_what_is_not_there() -> None:
    doc = ROOT / "docs" / "example.md"
    text = "\n".join([
        "Run `rlfleet up --config c.yaml --acters 2` or `rlfleet upp`.",  # 1: a flag, a command
        "```sh",
        ".venv/bin/rlfleet train --serial --config FILE \\",  # 3
        "    --until-retrun 475 | tee log   # --not-a-flag after the pipe",  # 4
        "rlfleet report RUN_DIR",  # 5
        "    [--outt DIR]",  # 6: a synopsis line
        "docker compose up --scale actor=4",  # 7: not rlfleet's
        "RLFLEET_LERNER__DEVICE=cuda rlfleet up --set learner.devise=cpu --set field=value",  # 8
        "```",
        "`learner.device` is fine, `replay.tables[].capcity` is not, `env.kwargs.anything` goes,",  # 10
        "`learner.py` is a file, `algorithm.lr` and `algorithm[dqn].n_step` are fields, `algorithm.lrr` is not.",
        "`evaluator.epsilon` is gone on purpose.",  # 12
        "## `rlfleet up`: a section",  # 13
        "`--resume RUN_DIR` is fine, `--resum RUN_DIR` and `--scale` are not options of up",  # 14
        "## Another section",  # 15
        "`--anything` goes here",  # 16
    ])
    found = {str(m).split(": ", 1)[0].rsplit(":", 1)[1] + " " + m.name for m in problems(doc, text)}
    assert found == {"1 --acters", "1 upp", "4 --until-retrun", "6 --outt", "8 lerner.device",
                     "8 learner.devise", "10 replay.tables[].capcity", "11 algorithm.lrr", "14 --resum",
                     "14 --scale"}, sorted(found)


def test_each_name_left_out_is_really_not_a_field() -> None:
    paths, dicts = field_paths()
    assert all(unknown_field(name, paths, dicts) for name in NOT_FIELDS), "a name in NOT_FIELDS is a field again"


def launcher_sections() -> dict[str, str]:
    """docs/launcher.md's sections by the command their heading names (``## `rlfleet up`: ...``)."""
    text = (ROOT / "docs" / "launcher.md").read_text()
    parts = re.split(r"^## ", text, flags=re.M)
    return {m.group(1): part for part in parts if (m := re.match(r"`rlfleet ([a-z-]+)", part))}


def synopsis_flags(section: str) -> set[str]:
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the section has no synopsis"
    return set(FLAG.findall(block.group(1)))


@pytest.mark.parametrize("command", ["up", "train"])
def test_launcher_md_synopsis_has_every_option(command: str) -> None:
    missing = cli_options()[command] - {"--help", "-h"} - synopsis_flags(launcher_sections()[command])
    assert not missing, f"docs/launcher.md: the synopsis of rlfleet {command} lacks {sorted(missing)}"


def test_launcher_md_names_every_option_of_the_commands_it_shows() -> None:
    doc = ROOT / "docs" / "launcher.md"
    text = doc.read_text()
    shown = {m.name for m in commands(doc, text) if m.kind == "command"}
    named = {flag for _, chunk, _ in code(text) for flag in FLAG.findall(chunk)}
    options = cli_options()
    missing = {c: sorted(options[c] - named - {"--help", "-h"}) for c in sorted(shown)}
    assert not any(missing.values()), f"docs/launcher.md does not name these options: {missing}"


# a path into the repository, in code: its first folder one of these (rlfleet/NAME without a suffix is
# an image name, rlfleet/actor)
REPO_PATH = re.compile(r"(?<![\w./-])((?:common|services|cli|bench|harness|tests|deploy|configs|docs)/[\w./-]*\w"
                       r"|rlfleet/[\w/-]+\.py)(?![\w<*])")


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = [f"{doc.relative_to(ROOT)}:{line}: {path}" for doc in DOCS for line, chunk, _ in code(doc.read_text())
               for path in REPO_PATH.findall(chunk) if not (ROOT / path).exists()]
    assert not missing, "the docs name files that are not there:\n" + "\n".join(missing)


def test_the_path_check_reads_paths_not_image_names() -> None:
    text = ("`common/tboard.py`, `rlfleet/actor:latest`, `rlfleet/runs.py`, `configs/<name>.yaml`,"
            " `RUN_DIR/learner/a.pt`")
    assert REPO_PATH.findall(text) == ["common/tboard.py", "rlfleet/runs.py"]


def test_configuration_md_names_every_algorithm() -> None:
    from rlfleet.common.algorithms.registry import BUILTIN

    text = (ROOT / "docs" / "configuration.md").read_text()
    missing = [name for name in BUILTIN if f"`{name}`" not in text and f"`name: {name}`" not in text]
    assert not missing, f"docs/configuration.md does not name the algorithms {missing}"


def test_configuration_md_names_every_shipped_config() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    named = set(re.findall(r"configs/([\w.-]+\.yaml)", text))
    shipped = {p.name for p in (ROOT / "configs").glob("*.yaml")}
    assert not shipped - named, f"docs/configuration.md does not name {sorted(shipped - named)}"
    assert not named - shipped, f"docs/configuration.md names configs that are not there: {sorted(named - shipped)}"
