"""Finding a preset and reading it, with the presets it extends.

The shipped presets live in `configs/`, which the wheel installs as the package `jobs.presets`
(`jobs/presets` is a link to it in the checkout), so an installed copy finds them through
importlib.resources wherever it runs. `--config` takes a file's path or a shipped preset's name
(`tiny-evidence` or `tiny-evidence.yaml`).

A preset may start from another: `extends: tiny.yaml` (a path relative to the extending file, or
a shipped preset's name). The parent is read first and the child merged into it: mappings merge
key by key, at any depth; any other value (a list, a number, a string) replaces the parent's
whole. A child cannot remove a parent's key; a preset that needs fewer arms than its parent
should not extend it.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from common.config import ConfigError, load_layered

DEFAULT_PRESET = "tiny.yaml"


def presets_dir() -> Path:
    """The shipped presets' folder: configs/ in a checkout, jobs/presets in an installed wheel."""
    return Path(str(files("jobs.presets")))


def shipped_presets() -> list[str]:
    return sorted(p.name for p in presets_dir().glob("*.yaml"))


def find_preset(name_or_path: str | Path | None, relative_to: Path | None = None) -> Path:
    """The file a `--config` value (or an `extends` value, read relative to its file's folder)
    names: an existing path, else a shipped preset by name; an error lists the shipped ones."""
    if name_or_path is None:
        return presets_dir() / DEFAULT_PRESET
    path = Path(name_or_path).expanduser()
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
    if path.is_file():
        return path.resolve()
    if Path(name_or_path).parent == Path("."):  # a bare name: a shipped preset
        for candidate in (str(name_or_path), f"{name_or_path}.yaml"):
            if (presets_dir() / candidate).is_file():
                return (presets_dir() / candidate).resolve()
    raise ConfigError(
        f"config file {name_or_path} does not exist, and no shipped preset has that name ({', '.join(shipped_presets())})"
    )


def load_preset(name_or_path: str | Path | None) -> tuple[dict, list[Path]]:
    """A preset's settings with every preset it extends merged under it, and the chain of files
    it came from, the root first (an `extends` value is a path relative to its file, or a shipped name)."""
    return load_layered(find_preset(name_or_path), lambda value, folder: find_preset(value, relative_to=folder))


def describe_chain(chain: list[Path]) -> str:
    """`tiny.yaml <- tiny-evidence.yaml (in configs/)`: what a preset came from, for --plan."""
    folders = {str(p.parent) for p in chain}
    names = " <- ".join(p.name if len(folders) == 1 else str(p) for p in chain)
    return f"{names} (in {chain[0].parent})" if len(folders) == 1 else names
