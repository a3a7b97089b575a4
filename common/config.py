"""Configuration plumbing: frozen pydantic settings models filled from YAML plus `--set` overrides.

Every setting lives in one model (a `Settings`) with a default and a comment; YAML files only
say what differs. Loading rejects an unknown key or a value of the wrong type with a one-line
ConfigError that names the key's full dotted path, so a typo never silently falls back to a
default. Types are strict: an int may stand for a float, nothing else is converted. train/
(TrainConfig) and jobs/ (the experiment's config) declare their settings on this; it imports
nothing of the project.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key."""


class Settings(BaseModel):
    """A section of settings: declared fields only, strict types, frozen. Loaded (`build`) or
    replaced, a wrong value is a one-line ConfigError naming its path; made from keywords, it is
    pydantic's ValidationError (a ValueError too)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def replace(self, **changes) -> typing.Self:
        """A copy with `changes`, checked as loading checks them."""
        return build(type(self), {**dict(self), **changes})


def _located(cls: type[BaseModel], loc: tuple) -> tuple[str, type[BaseModel] | None]:
    """(dotted path, the model holding its last key) of a pydantic error location: section and field
    names and mapping keys, without the tags pydantic adds for a union's branches."""
    hint, owner, parts = cls, None, []
    for part in loc:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):  # `part` tags a branch: follow a model, drop the rest
            hint = next((a for a in args if getattr(a, "__name__", None) == part), None)
            continue
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            owner, field = hint, hint.model_fields.get(str(part))
            hint = field.annotation if field else None
        elif origin in (dict, list):
            hint = args[-1]
        else:
            hint = None
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts).lstrip("."), owner


def config_problem(cls: type[BaseModel], err: ValidationError, prefix: str = "") -> str:
    """One line naming the first key that is wrong, and how."""
    errors = err.errors()
    path, owner = _located(cls, errors[0]["loc"])
    same = [e for e in errors if _located(cls, e["loc"])[0] == path]
    key = ".".join(p for p in (prefix, path) if p)
    first = same[0]
    if first["type"] == "extra_forbidden":
        return f"unknown config key {key} (known: {', '.join(sorted(owner.model_fields))})"
    if first["type"] == "value_error":  # a model's own check: its message says what is wrong
        return f"{key + ': ' if key else ''}{first['msg'].removeprefix('Value error, ')}"
    if first["type"] == "missing":
        return f"{key}: required, not given"
    wants = " or ".join(dict.fromkeys(_wanted(e) for e in same))  # each branch of a union once
    return f"{key}: expected {wants}, got {type(first['input']).__name__} {first['input']!r}"


def _wanted(error: dict) -> str:
    """What one pydantic error says the value should be: "a valid integer", "'ddp' or 'fsdp'", "a mapping"."""
    return (
        "a mapping" if error["type"] in ("model_type", "dict_type") else error["msg"].removeprefix("Input should be ")
    )


def build(cls: type[BaseModel], data: dict | None, prefix: str = "") -> Any:
    """Model `cls` from a plain dict, every name and type checked; a ConfigError names the first wrong key."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(config_problem(cls, err, prefix)) from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b=value` overrides (value parsed as YAML) to a nested dict, returning a copy."""
    data = yaml.safe_load(yaml.safe_dump(data)) or {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {path}: {key} is not a section")
        try:
            node[keys[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({yaml_problem(err)})") from None
    return data


def yaml_problem(err: yaml.YAMLError) -> str:
    """What a YAML parser found wrong, and where, in one line: "found unexpected end of stream at line 3, column 1"."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{getattr(err, 'problem', None) or err}{where}"


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping, with errors that name the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {yaml_problem(err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


MAX_EXTENDS = 8  # a chain of `extends` longer than this is a loop or a mistake


def load_layered(first: Path, find=None) -> tuple[dict, list[Path]]:
    """A YAML file's settings with every file it `extends` merged under it (mappings key by key,
    anything else replaced whole), and the chain of files, the root first. `find(value, folder)`
    turns an `extends` value into a file; by default a path relative to the extending file's folder."""
    find = find or (lambda value, folder: folder / Path(value).expanduser())
    chain, layers = [Path(first)], []
    while True:
        data = load_yaml(chain[-1])
        parent = data.pop("extends", None)
        layers.append(data)
        if parent is None:
            break
        if not isinstance(parent, str):
            raise ConfigError(f"{chain[-1]}: extends must name one preset file, got {parent!r}")
        path = find(parent, chain[-1].parent)
        if path in chain:
            raise ConfigError(
                f"{chain[-1]}: extends {parent} makes a loop ({' -> '.join(p.name for p in [*chain, path])})"
            )
        if len(chain) >= MAX_EXTENDS:
            raise ConfigError(f"{chain[0]}: extends more than {MAX_EXTENDS} presets deep")
        chain.append(path)
    merged: dict = {}
    for layer in reversed(layers):
        merged = deep_merge(merged, layer)
    return merged, list(reversed(chain))


def deep_merge(base: dict, child: dict) -> dict:
    """`child` over `base`: mappings merged key by key, anything else replaced whole."""
    out = dict(base)
    for key, value in child.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load(
    cls: type[BaseModel], path: str | Path | None = None, overrides: list[str] = (), section: str | None = None
) -> Any:
    """Load settings model `cls` from a YAML file (optionally one top-level section of it) plus overrides."""
    data = load_yaml(path) if path else {}
    if section is not None:
        data = data.get(section) or {}
    return build(cls, apply_overrides(data, list(overrides)), section or "")


def to_dict(cfg: BaseModel) -> dict:
    """A plain, YAML/JSON-serialisable dict of a settings model."""
    return cfg.model_dump()
