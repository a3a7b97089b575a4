"""Which engines a replica runs, and building them: the one module that imports both engines.

serve/engine.py holds the types and the contract the engines share; keeping the choice here
means neither engine module imports the other, nor the module that imports both.
"""

from __future__ import annotations

import importlib.util

from serve.engine import ENGINES, SCORER, Engine
from serve.settings import ServiceError, ServiceSettings, resolve_model


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def engine_kinds(settings: ServiceSettings, on_gpu: bool) -> tuple[str, str]:
    """(generation engine, scoring engine), "vllm" or "hf", with `auto` resolved.

    A tensor-parallel replica on GPUs holds no GPU itself (its ranks do, serve/replica_placement.py):
    the transformers engine there would load the whole model onto a GPU of the node that another
    replica or a training worker may hold, so it is refused."""
    kind = settings.engine
    if kind == "auto":
        kind = "vllm" if vllm_installed() else "hf"
    scoring = settings.scoring
    if scoring == "auto":
        scoring = "engine" if ENGINES[kind].scores_on_cpu or on_gpu else SCORER
    scoring = kind if scoring == "engine" else scoring
    if (
        on_gpu
        and settings.tensor_parallel_size > 1
        and not all(ENGINES[k].spans_tensor_parallel_ranks for k in (kind, scoring))
    ):
        raise ServiceError(
            f"tensor_parallel_size={settings.tensor_parallel_size} on GPUs needs engine: vllm and scoring: engine; "
            "the transformers engine would load the whole model onto one GPU the replica does not hold"
        )
    return kind, scoring


def build_engines(settings: ServiceSettings) -> tuple[Engine, Engine]:
    """(generation engine, scoring engine) for this replica; the two are one object unless
    scoring goes through transformers beside a vLLM engine (the CPU default, see ServiceSettings.scoring)."""
    path = resolve_model(settings.model)
    kind, scoring = engine_kinds(settings, cuda_available())
    engine = engine_class(kind)(path, settings)
    return engine, engine if scoring == kind else engine_class(scoring)(path, settings)


def engine_class(kind: str) -> type:
    """The class of an engine kind, its module imported now (vLLM's imports vLLM)."""
    module, name = ENGINES[kind].cls.split(":")
    return getattr(importlib.import_module(module), name)
