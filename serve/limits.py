"""What one request may ask of a replica, checked before any engine work, and how long it may run (`timed`).

Each limit is a setting (serve/settings.py) and each refusal names it, so a client
can tell which knob it hit: a count of prompts or questions (413), max_tokens
above the cap (422), a prompt that does not fit the context (422 at that prompt),
and the work budget, which bounds what the per-field limits allow together:
prompts x n x (prompt tokens + max_tokens) x (logprobs + 1) token positions (413).
Without it one request within every field's limit could ask for half a million
generated tokens with 21 log-probabilities each.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError

from serve.settings import ServiceSettings


def invalid(loc: tuple, msg: str) -> RequestValidationError:
    """A 422 in FastAPI's own shape, for limits only the deployment knows."""
    return RequestValidationError([{"type": "value_error", "loc": ("body", *loc), "msg": msg}])


def check_count(n: int, limit: int, what: str) -> None:
    if n > limit:
        raise HTTPException(413, f"{n} {what} in one request; the service takes at most {limit}")


def check_new_tokens(settings: ServiceSettings, new_tokens: int) -> None:
    if new_tokens > settings.max_tokens_cap:
        raise invalid(
            ("max_tokens",), f"max_tokens {new_tokens} is above this service's cap of {settings.max_tokens_cap}"
        )


def check_room(settings: ServiceSettings, lengths: list[int], new_tokens: int, loc: Callable[[int], tuple]) -> None:
    """Each prompt's tokens (`lengths`) plus `new_tokens` fit the context; `loc(i)` names prompt i."""
    room = settings.max_model_len - new_tokens
    for i, n in enumerate(lengths):
        if n > room:
            raise invalid(
                loc(i),
                f"{n} prompt tokens + {new_tokens} new tokens exceed the model's context of {settings.max_model_len}",
            )


def request_work(lengths: list[int], new_tokens: int, n: int = 1, logprobs: int | None = None) -> int:
    """Token positions a request asks for: each prompt's tokens and new tokens, n times, each
    position carrying its own log-probability and `logprobs` alternatives."""
    return n * (sum(lengths) + len(lengths) * new_tokens) * ((logprobs or 0) + 1)


def check_work(
    settings: ServiceSettings, lengths: list[int], new_tokens: int, n: int = 1, logprobs: int | None = None
) -> None:
    work = request_work(lengths, new_tokens, n, logprobs)
    if work > settings.max_work_per_request:
        raise HTTPException(
            413,
            f"this request asks for {work:,} token positions (prompts x n x (prompt tokens + max_tokens) x (logprobs + 1)); "
            f"the service's max_work_per_request is {settings.max_work_per_request:,}",
        )


def check_answer_size(settings: ServiceSettings, entries: int) -> None:
    """An answer's `logprobs` entries (each token's and its alternatives': request_work over the tokens
    the answer lists), counted before any work: each is a JSON object of some 40 bytes, built on
    the replica's one preparation thread."""
    if entries > settings.max_logprobs_per_answer:
        raise HTTPException(
            413,
            f"this answer would hold {entries:,} log-probabilities (choices x (echoed prompt tokens + max_tokens) x (logprobs + 1)); "
            f"the service's max_logprobs_per_answer is {settings.max_logprobs_per_answer:,}",
        )


def timed(method):
    """An API method under the service's `request_timeout_s`: past it the method is cancelled
    (the engines drop its work: vLLM aborts its requests, the transformers engine stops its job at
    the next step), as when the client goes away, and the caller gets a 504 naming the setting."""

    @functools.wraps(method)
    async def run(self, body):
        limit = self.settings.request_timeout_s
        try:
            return await asyncio.wait_for(method(self, body), limit)
        except TimeoutError:
            raise HTTPException(
                504, f"the request ran past the service's request_timeout_s ({limit:g} s) and was stopped"
            ) from None

    return run
