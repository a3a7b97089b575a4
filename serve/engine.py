"""What both engines (vLLM, transformers + PEFT) take and return, and how a replica picks them.

`Engine` is the contract, `build_engines` the factory; serve/vllm_engine.py and
serve/hf_engine.py implement it. An engine serves one base model and any number
of LoRA adapters addressed by name (`adapter=None` is the base model).
"""

from __future__ import annotations

import asyncio
import importlib.util
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from serve.settings import ServiceError, ServiceSettings, resolve_model


class EngineUnavailable(RuntimeError):
    """The engine died under a request (vLLM's engine-core process was killed, say). The replica
    fails its health check and Serve replaces it: the request may be sent again (HTTP: 503)."""


class UnknownAdapter(LookupError):
    """A request names an adapter the engine does not hold (removed by a reconfigure while the
    request waited): the service answers 404, as for a name never registered."""


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


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probabilities at one position of a sequence: the token there and the `k` most likely."""

    token: int  # the token at this position (a prompt token, or the one generated)
    logprob: float  # its log-probability given the tokens before it; -inf where the sampler ruled it out
    top: tuple[tuple[int, float], ...]  # the k most likely (token id, log-probability), most likely first


@dataclass(frozen=True)
class TokenCompletion:
    """A completion of a token-id prompt, token by token (what /v1/completions answers with)."""

    token_ids: tuple[int, ...]  # the generated tokens; with a stop string, up to the one that completed it
    text: str  # their text, cut before a stop string
    finish_reason: str  # "stop" or "length", as `Completion`
    prompt_tokens: int
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per generated token, when asked
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # one per prompt token (the first None), when asked


class Engine(Protocol):
    """The engine contract the deployment (serve/app.py) relies on."""

    name: str  # "vllm" or "hf", reported by /health
    continuous_batching: bool  # True: the engine batches concurrent calls itself; False: the deployment gathers them
    max_choices: int  # how many choices one-pass scoring handles with this tokenizer
    counting_tokenizer: Any  # the model's tokenizer, for the event loop (counting and truncating prompts)
    scores_prompts: bool  # complete_tokens takes prompt_logprobs (False on vLLM 0.32 with LoRA: see VLLMEngine)

    async def generate(self, prompts: list[str], sampling: Sampling, adapter: str | None) -> list[Completion]: ...

    async def score(self, prompts: list[str], n_choices: list[int], adapter: str | None) -> list[list[float]]:
        """Per prompt, the log-probability of each choice letter, renormalised over the letters."""

    async def complete_tokens(
        self, prompts: list[list[int]], sampling: Sampling, adapter: str | None, logprobs: int | None = None, prompt_logprobs: int | None = None
    ) -> list[TokenCompletion]:
        """Completions of prompts given as token ids (used as they are: no special token is added).

        `logprobs=k`: each generated token's log-probability and the k most likely tokens at its
        position, from the distribution it was sampled from (temperature and top_p applied, as
        vLLM's `processed_logprobs`; at temperature 0, or 1 with top_p 1, the model's log-softmax).
        `prompt_logprobs=k`: the same for every prompt token but the first, from the model's raw
        log-softmax (what scoring a text needs: lm-evaluation-harness's loglikelihood). With
        `sampling.max_tokens == 0` nothing is generated: only the prompt is scored. Prompt i
        samples with seed + i, as in `generate`.
        """

    async def add_adapter(self, name: str, path: str) -> None: ...

    async def remove_adapter(self, name: str) -> None: ...

    def count_tokens(self, prompts: list[str]) -> list[int]: ...

    async def check_health(self) -> None:
        """Raises once the engine cannot serve (vLLM: its engine-core process died)."""

    def shutdown(self) -> None: ...


class BatchKey(NamedTuple):
    """What requests must share to go through one engine call when the deployment gathers them."""

    kind: str  # "generate" or "score"
    sampling: Sampling | None
    adapter: str | None
    alone: str | None = None  # a unique id keeps a request out of everyone else's batch (a seeded one)


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str | None:
    """`text` up to the earliest stop string, or None when none occurs."""
    hits = [text.index(s) for s in stop if s and s in text]
    return text[: min(hits)] if hits else None


async def gather_all(awaitables) -> list:
    """The awaitables' results, as `asyncio.gather`, except that once one fails the others are
    cancelled (a vLLM request cancelled is aborted in the engine) and that first error is raised:
    no engine work keeps running for a request that has already failed."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(a) for a in awaitables]
    except BaseExceptionGroup as errors:
        raise errors.exceptions[0] from None
    return [task.result() for task in tasks]


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
        scoring = "engine" if kind == "hf" or on_gpu else "hf"
    scoring = kind if scoring == "engine" else scoring
    if on_gpu and settings.tensor_parallel_size > 1 and "hf" in (kind, scoring):
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
    if kind == "vllm":
        from serve.vllm_engine import VLLMEngine

        engine = VLLMEngine(path, settings)
    else:
        from serve.hf_engine import HFEngine

        engine = HFEngine(path, settings)
    if scoring == "hf" and kind == "vllm":
        from serve.hf_engine import HFEngine

        return engine, HFEngine(path, settings)
    return engine, engine
