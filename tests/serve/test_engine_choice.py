"""Engines declare what they can do (serve/engine.py ENGINES, carried by each class as `kind`), and the
choice of engines, the service and the pipeline read the record: a toy engine is one class and its
record, and the readers follow it without an edit."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from jobs.experiment.config import EvalConfig, ServiceConfig
from serve import engine_choice
from serve.engine import ENGINE_CHOICES, ENGINES, EngineKind
from serve.engine_choice import build_engines, engine_class, engine_kinds
from serve.hf_engine import HFEngine
from serve.settings import ServiceSettings


class ToyEngine:
    """A new engine, by one class: it records how it was built and declares its capabilities."""

    name = "toy"
    kind = EngineKind(
        "toy",
        f"{__name__}:ToyEngine",
        serves_full_models_beside_base=True,
        spans_tensor_parallel_ranks=True,
        scores_on_cpu=True,
    )

    def __init__(self, model_path: str, settings: ServiceSettings):
        self.model_path, self.settings = model_path, settings


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(ENGINES, "toy", ToyEngine.kind)
    # The option lists are built from ENGINES when their modules load: a toy added after that is not
    # in them (an engine added in serve/engine.py is), so the settings are made past validation.
    return ServiceSettings().model_copy(update={"engine": "toy", "scoring": "auto", "tensor_parallel_size": 4})


def test_the_option_list_is_written_once():
    assert ENGINE_CHOICES == ("auto", "vllm", "hf")
    for field in (
        ServiceSettings.model_fields["engine"],
        ServiceConfig.model_fields["engine"],
        EvalConfig.model_fields["engine"],
    ):
        assert get_args(field.annotation) == ENGINE_CHOICES
    with pytest.raises(ValidationError):
        ServiceSettings(engine="toy")  # not declared in serve/engine.py: refused by the option list


def test_each_engine_class_carries_its_record():
    assert engine_class("hf") is HFEngine and HFEngine.kind is ENGINES["hf"] and HFEngine.name == "hf"
    for name, kind in ENGINES.items():
        assert kind.name == name and kind.cls.split(":")[0].startswith("serve.")


def test_the_capabilities_decide_the_choice():
    # hf scores on CPU itself and cannot span tensor-parallel ranks; vLLM hands CPU scoring to hf
    assert engine_kinds(ServiceSettings(engine="hf", scoring="auto"), on_gpu=False) == ("hf", "hf")
    assert engine_kinds(ServiceSettings(engine="vllm", scoring="auto"), on_gpu=False) == ("vllm", "hf")
    with pytest.raises(ValueError, match="tensor_parallel_size=4"):
        engine_kinds(ServiceSettings(engine="hf", tensor_parallel_size=4), on_gpu=True)


def test_a_toy_engine_is_chosen_and_built_from_its_class_alone(toy, monkeypatch, tmp_path):
    assert engine_kinds(toy, on_gpu=False) == ("toy", "toy")  # scores on CPU itself
    assert engine_kinds(toy, on_gpu=True) == ("toy", "toy")  # spans tensor-parallel ranks: not refused
    monkeypatch.setattr(engine_choice, "resolve_model", lambda model: str(tmp_path))
    monkeypatch.setattr(engine_choice, "cuda_available", lambda: False)
    generation, scoring = build_engines(toy)
    assert isinstance(generation, ToyEngine) and scoring is generation and generation.model_path == str(tmp_path)


def test_the_pipeline_puts_full_models_beside_the_base_by_the_capability(toy, monkeypatch, tmp_path):
    """jobs/phases/evaluate.services asks the engines' records, not their names."""
    from jobs.experiment.arms import arm_models
    from jobs.experiment.config import load_experiment
    from jobs.phases import evaluate
    from jobs.rundir.manifest import Manifest
    from jobs.runtime.context import RunContext

    cfg = load_experiment(
        overrides=["arms={full: {numbers: teacher, train: {method: full}}}", "replicates=1", "evaluate.engine=vllm"]
    )
    models = {m.name: m for m in arm_models(cfg)}
    ctx = RunContext(cfg, tmp_path, Manifest(tmp_path), tmp_path, {"base": "/models/base"}, models, [], "app", 8, 1)
    apps = evaluate.services(ctx, ["base", "full/0"], {})
    assert len(apps) == 2  # vLLM: the full model in an application of its own
    monkeypatch.setattr(evaluate, "service_settings", lambda *args: toy)
    apps = evaluate.services(ctx, ["base", "full/0"], {})
    assert len(apps) == 1 and apps[0][3] == {"full-0": str(ctx.trained("full/0"))}  # the toy holds it beside its base
