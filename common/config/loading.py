"""Reading the experiment file: YAML, then environment and ``--set`` overrides, then
validation, with every problem turned into one readable :class:`ConfigError`."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlfleet.common.config.algorithm import algorithm_class
from rlfleet.common.config.experiment import Experiment

ENV_PREFIX = "RLFLEET_"


class ConfigError(ValueError):
    """A configuration that cannot run; the message names every bad field."""


def _set_path(tree: Any, path: list[str], value: Any, source: str) -> None:
    node = tree
    for i, key in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(f"{source}: {'.'.join(path[: i + 1])}: index {key!r} out of range")
            idx = int(key)
            if last:
                node[idx] = value
            else:
                node = node[idx]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{source}: {'.'.join(path[:i])} is not a section")
        if last:
            node[key] = value
        else:
            node = node.setdefault(key, {})


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def env_overrides(environ: Mapping[str, str]) -> list[tuple[list[str], Any, str]]:
    out = []
    for key, text in sorted(environ.items()):
        if key.startswith(ENV_PREFIX) and "__" in key[len(ENV_PREFIX):] or key in _TOP_LEVEL_ENV:
            path = [p.lower() for p in key[len(ENV_PREFIX):].split("__")]
            out.append((path, _parse_value(text), f"environment {key}"))
    return out


_TOP_LEVEL_ENV = {f"{ENV_PREFIX}{name.upper()}" for name in ("name", "seed", "sync", "run_dir", "learners")}


def cli_overrides(sets: Iterable[str]) -> list[tuple[list[str], Any, str]]:
    out = []
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE, e.g. --set replay.durability=wal")
        key, text = item.split("=", 1)
        out.append((key.strip().split("."), _parse_value(text), f"--set {key}"))
    return out


def load(
    path: str | Path | None = None,
    sets: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    data: Mapping[str, Any] | None = None,
) -> Experiment:
    """Read the experiment file, apply env and --set overrides, validate."""
    tree: dict[str, Any] = dict(data or {})
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
        tree.update(loaded)
    environ = os.environ if environ is None else environ
    file_env = _env_id(tree)
    overrides = cli_overrides(sets)
    for keys, value, source in [*env_overrides(environ), *overrides]:
        _set_path(tree, keys, value, source)
    given = {tuple(keys) for keys, _, _ in overrides}
    if ("env", "id") in given and ("name",) not in given and _env_id(tree) not in (None, file_env):
        tree["name"] = env_run_name(str(_env_id(tree)), str((tree.get("algorithm") or {}).get("name", "")))
    return validate(tree)


def _env_id(tree: Mapping[str, Any]) -> Any:
    env = tree.get("env")
    return env.get("id") if isinstance(env, Mapping) else None


def env_run_name(env_id: str, algorithm: str) -> str:
    """The name of a run whose env.id was set on the command line (the file's name would name another
    env): the env's class or function (or registered id, lowercased, without its version) and the
    algorithm, e.g. ``mygrid-ppo`` for ``mymodule:MyGrid``."""
    base = env_id.split(":", 1)[1] if ":" in env_id else env_id.split("/")[-1]
    base = base.rsplit("-v", 1)[0] if "-v" in base else base
    slug = "".join(c if c.isalnum() else "-" for c in base.lower()).strip("-") or "env"
    return f"{slug}-{algorithm}" if algorithm else slug


def validate(tree: Mapping[str, Any]) -> Experiment:
    try:
        return Experiment.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, tree)) from None


def format_errors(exc: ValidationError, tree: Mapping[str, Any]) -> str:
    lines = []
    for err in exc.errors():
        parts = [str(p) for p in err["loc"] if not str(p).startswith("function-after")]
        section = None  # the algorithm's config class: pydantic puts the union's tag in the path
        if len(parts) > 1 and parts[0] == "algorithm" and (section := algorithm_class(parts[1])) is not None:
            del parts[1]
        loc = ".".join(parts)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = _allowed_fields(loc, section)
            close = difflib.get_close_matches(parts[-1], allowed.split(", "), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            lines.append(f"{loc}: unknown field; {hint}allowed fields: {allowed}")
        elif err["type"] in ("missing",):
            lines.append(f"{loc}: required field is missing")
        elif loc and err["type"] == "value_error" and isinstance(err.get("input"), dict):
            lines.append(f"{loc}: {msg}")
        elif loc:
            lines.append(f"{loc} = {err.get('input')!r}: {msg}")
        else:
            lines.append(msg)
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _allowed_fields(loc: str, section: Any = None) -> str:
    model: Any = Experiment
    for part in loc.split(".")[:-1]:
        if part.isdigit():
            continue
        if part == "algorithm" and model is Experiment and section is not None:
            model = section
            continue
        field = model.model_fields.get(part)
        if field is None:
            break
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        model = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), model)
    return ", ".join(sorted(model.model_fields))


def dump(cfg: Experiment) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
