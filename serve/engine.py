"""What both engines (vLLM, transformers + PEFT) take and return.

`Engine` is the contract; serve/vllm_engine.py and serve/hf_engine.py implement
it, and serve/engine_choice.py picks and builds them for a replica. An engine serves one base model and any number
of LoRA adapters addressed by name (`adapter=None` is the base model).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol


@dataclass(frozen=True)
class EngineKind:
    """What the choice of engine and the pipeline know of an engine without importing it (the vLLM
    engine's module imports vLLM, an optional extra). Each engine class carries its record as `kind`."""

    name: str  # a `service.engine` / `evaluate.engine` choice, and the engine's /health name
    cls: str  # "module:Class", imported only when a replica builds one (serve/engine_choice.py)
    # holds fully fine-tuned models of its base in the base's application (`add_model`)
    serves_full_models_beside_base: bool
    spans_tensor_parallel_ranks: bool  # a tensor-parallel replica's ranks hold its GPUs; else it loads onto one GPU
    scores_on_cpu: bool  # `scoring: auto` asks it to score on CPU; else the transformers engine beside it scores


ENGINES: dict[str, EngineKind] = {
    kind.name: kind
    for kind in (
        EngineKind(
            "vllm",
            "serve.vllm_engine:VLLMEngine",
            serves_full_models_beside_base=False,
            spans_tensor_parallel_ranks=True,
            scores_on_cpu=False,
        ),
        EngineKind(
            "hf",
            "serve.hf_engine:HFEngine",
            serves_full_models_beside_base=True,
            spans_tensor_parallel_ranks=False,
            scores_on_cpu=True,
        ),
    )
}
ENGINE_CHOICES = ("auto", *ENGINES)  # the option list, once: the service settings' and the experiment config's
# the engine that scores beside another (`scoring: hf`): prompt log-probabilities under LoRA (serve/vllm_engine.py)
SCORER = "hf"


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
    kind: EngineKind  # its capabilities, ENGINES[name]
    device: str  # "cuda" or "cpu": where its model runs, reported by /health
    continuous_batching: bool  # True: the engine batches concurrent calls itself; False: the deployment gathers them
    max_choices: int  # how many choices one-pass scoring handles with this tokenizer
    counting_tokenizer: Any  # the model's tokenizer, for the event loop (counting and truncating prompts)
    # complete_tokens takes prompt_logprobs and score_continuations is there (False on vLLM 0.32 with LoRA: see VLLMEngine)
    scores_prompts: bool

    async def generate(self, prompts: list[str], sampling: Sampling, adapter: str | None) -> list[Completion]: ...

    async def score(self, prompts: list[str], n_choices: list[int], adapter: str | None) -> list[list[float]]:
        """Per prompt, the log-probability of each choice letter, renormalised over the letters."""

    async def complete_tokens(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        adapter: str | None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
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

    async def score_continuations(
        self, prompt_ids: list[list[int]], continuations: list[list[list[int]]], adapter: str | None
    ) -> list[float]:
        """Where `scores_prompts`: per question and each of its choices in order, the summed
        log-probability of the choice's tokens (`continuations`) after the question's (`prompt_ids`),
        as lm-evaluation-harness's loglikelihood (cloze scoring, serve/cloze.py)."""

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
