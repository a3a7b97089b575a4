"""What both engines (vLLM, transformers + PEFT) take and return, and how a replica picks them.

An engine serves one base model and any number of LoRA adapters addressed by
name (`adapter=None` is the base model). `name` is "vllm" or "hf"; `max_choices`
is how many choices one-pass scoring handles with its tokenizer; the methods are async:
`generate(prompts, Sampling, adapter) -> [Completion]`,
`score(prompts, n_choices, adapter) -> [[logprob per choice]]`,
`add_adapter(name, path)`, `remove_adapter(name)`, `count_tokens(prompts)`,
`check_health()`, `shutdown()`; `counting_tokenizer` is the model's tokenizer
for use on the event loop (counting and truncating prompts).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from serve.settings import ServiceSettings, resolve_model


class EngineUnavailable(RuntimeError):
    """The engine died under a request (vLLM's engine-core process was killed, say). The replica
    fails its health check and Serve replaces it: the request may be sent again (HTTP: 503)."""


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None  # prompt i of a request samples with seed + i
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str  # "stop" (end of sequence or a stop string) or "length"
    completion_tokens: int
    prompt_tokens: int


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str | None:
    """`text` up to the earliest stop string, or None when none occurs."""
    hits = [text.index(s) for s in stop if s and s in text]
    return text[: min(hits)] if hits else None


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def build_engines(settings: ServiceSettings):
    """(generation engine, scoring engine) for this replica; the two are one object unless
    scoring goes through transformers beside a vLLM engine (the CPU default, see ServiceSettings.scoring)."""
    path = resolve_model(settings.model)
    kind = settings.engine
    if kind == "auto":
        kind = "vllm" if vllm_installed() else "hf"
    if kind == "vllm":
        from serve.vllm_engine import VLLMEngine

        engine = VLLMEngine(path, settings)
    else:
        from serve.hf_engine import HFEngine

        engine = HFEngine(path, settings)
    scoring = settings.scoring
    if scoring == "auto":
        scoring = "engine" if kind == "hf" or cuda_available() else "hf"
    if scoring == "hf" and kind == "vllm":
        from serve.hf_engine import HFEngine

        return engine, HFEngine(path, settings)
    return engine, engine
