"""Batched decoding for the transformers engine, each row sampling from its own random stream.

transformers' `generate` draws a whole batch's samples from one random stream, so a row's
sample depends on the rows beside it. `decode` runs the same step (the model on its KV cache,
the last position's logits through transformers' own warpers, a softmax, one multinomial draw)
but draws row r with a `torch.Generator` seeded `seeds[r]`. That keeps the engines' seed
contract (prompt i of a request samples from seed + i, serve/engine.py) at batch speed: one row
decodes to what `generate` samples for that prompt alone after `torch.manual_seed(seed)`, in a
batch of any size and company (tests/serve/test_seed_contract.py checks both against `generate`).
Without seeds the batch draws from the global stream in one call, as `generate` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from serve.engine import Sampling


@dataclass
class Decoded:
    """One row's new tokens (up to and including end-of-sequence, or `max_tokens` of them) and, when
    asked, per token its log-probability and the k most likely (token, log-probability) there."""

    tokens: list[int]
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


def warpers(s: Sampling) -> LogitsProcessorList:
    """transformers' processing of the logits before sampling, as `generate` builds it for these settings."""
    steps = LogitsProcessorList()
    if s.temperature > 0 and s.temperature != 1.0:
        steps.append(TemperatureLogitsWarper(s.temperature))
    if s.temperature > 0 and s.top_p < 1.0:
        steps.append(TopPLogitsWarper(s.top_p))
    return steps


@torch.inference_mode()
def decode(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    s: Sampling,
    seeds: list[int] | None,
    eos: int,
    pad: int,
    logprobs: int | None = None,
    pulse: Callable[[], None] = lambda: None,
) -> list[Decoded]:
    """Up to `s.max_tokens` new tokens for each left-padded row; greedy at temperature 0, else sampled,
    row r from `seeds[r]` when seeds are given. `logprobs=k` records each token's log-probability under
    the processed distribution (temperature and top_p applied, as vLLM's processed_logprobs): the
    chosen token's and the top k, per step, never the whole vocabulary's scores over the steps.
    `pulse()` is called before every forward: the engine's liveness signal, and where a job whose
    request went away stops (it raises)."""
    rows = input_ids.shape[0]
    if s.max_tokens == 0:
        return [Decoded([], [] if logprobs is not None else None) for _ in range(rows)]
    process = warpers(s)
    generators = None if seeds is None else [torch.Generator(input_ids.device).manual_seed(seed) for seed in seeds]
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    pulse()
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    finished = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
    steps, recorded = [], []
    for step in range(s.max_tokens):
        scores = process(input_ids, out.logits[:, -1].float())
        if s.temperature == 0:
            tokens = scores.argmax(-1)
        else:
            tokens = _sample(torch.softmax(scores, dim=-1), generators, finished)
        tokens = tokens.masked_fill(finished, pad)
        steps.append(tokens)
        if logprobs is not None:
            recorded.append(_logprob_entries(scores, tokens, logprobs))
        finished |= tokens == eos
        if finished.all() or step == s.max_tokens - 1:
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
        pulse()
        out = model(
            input_ids=tokens[:, None],
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    table = torch.stack(steps, dim=1).tolist()
    return [_row(r, table[r], recorded if logprobs is not None else None, eos) for r in range(rows)]


def _sample(probs: torch.Tensor, generators: list[torch.Generator] | None, finished: torch.Tensor) -> torch.Tensor:
    """One draw per row: from the global stream in one call, or row by row from its own generator
    (a finished row draws nothing, so it takes nothing from its stream)."""
    if generators is None:
        return torch.multinomial(probs, num_samples=1).squeeze(1)
    tokens = torch.zeros(probs.shape[0], dtype=torch.long, device=probs.device)
    for r in (~finished).nonzero().flatten().tolist():
        tokens[r] = torch.multinomial(probs[r : r + 1], num_samples=1, generator=generators[r])[0, 0]
    return tokens


def _logprob_entries(scores: torch.Tensor, tokens: torch.Tensor, k: int) -> tuple[list, list, list]:
    """Per row: the chosen token's log-probability, and the top k (values, ids), as Python lists."""
    logprobs = torch.log_softmax(scores, dim=-1)
    top = logprobs.topk(k, dim=-1)
    return logprobs.gather(1, tokens[:, None])[:, 0].tolist(), top.indices.tolist(), top.values.tolist()


def _row(r: int, drawn: list[int], recorded: list | None, eos: int) -> Decoded:
    """Row r's tokens up to its end-of-sequence (the padding drawn after it dropped), with its entries."""
    tokens = drawn[: drawn.index(eos) + 1] if eos in drawn else drawn
    if recorded is None:
        return Decoded(tokens)
    entries = [(own[r], list(zip(ids[r], values[r]))) for own, ids, values in recorded[: len(tokens)]]
    return Decoded(tokens, entries)
