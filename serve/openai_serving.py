"""The OpenAI-compatible serving: POST /v1/completions and POST /v1/chat/completions (docs/api.md).

A mixin of the deployment (serve/app.py `InferenceService`), kept apart from the native routes as
vLLM keeps its OpenAI serving apart from its engine: prompts become token ids here (a text through
the model's tokenizer, token ids checked against its vocabulary, chat messages through its chat
template), go to the engines' `complete_tokens`, and come back in OpenAI's shapes
(serve/openai_format.py). It uses the replica's engines, settings, metrics, adapters and
preparation thread (`_adapter`, `_off_loop`, `_prompt_scorer`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from jinja2 import TemplateError

from serve.engine import Sampling, TokenCompletion, gather_all
from serve.limits import (
    check_answer_size,
    check_count,
    check_new_tokens,
    check_room,
    check_work,
    invalid,
    request_work,
    timed,
)
from serve.openai_format import (
    NoChatTemplate,
    TokenTexts,
    chat_logprobs,
    chat_prompt_ids,
    completion_logprobs,
    joined,
    openai_answer,
    text_length,
)
from serve.schemas import ChatCompletionRequest, CompletionRequest

logger = logging.getLogger("ray.serve")


class OpenAIServing:
    """`completions` and `chat_completions`, each under request_timeout_s (`timed`)."""

    def _prompt_ids(self, prompts: list[str | list[int]]) -> list[list[int]]:
        """Each prompt's token ids: a text through the model's tokenizer with its special tokens
        (as vLLM's server tokenizes one), token ids as they are, once checked against the vocabulary."""
        tokenizer = self.engine.counting_tokenizer
        ids = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                ids.append(tokenizer(prompt, add_special_tokens=True).input_ids)
            elif max(prompt) >= len(tokenizer):
                raise invalid(
                    ("prompt", i),
                    f"token id {max(prompt)} is not in this model's vocabulary (ids 0..{len(tokenizer) - 1})",
                )
            else:
                ids.append(list(prompt))
        return ids

    def _check_fits(
        self,
        ids: list[list[int]],
        new_tokens: int,
        n: int,
        logprobs: int | None,
        loc: Callable[[int], tuple],
        echo: bool = False,
    ) -> None:
        """The checks of `_generate`, on token-id prompts each sampled `n` times, and the size of the
        answer's `logprobs` (an echo's prompt tokens count in each of its n choices)."""
        check_new_tokens(self.settings, new_tokens)
        check_count(len(ids) * n, self.settings.max_prompts_per_request, "prompts")
        lengths = [len(prompt) for prompt in ids]
        check_room(self.settings, lengths, new_tokens, loc)
        check_work(self.settings, lengths, new_tokens, n, logprobs)
        if logprobs is not None:
            check_answer_size(
                self.settings, request_work(lengths if echo else [0] * len(lengths), new_tokens, n, logprobs)
            )

    async def _complete(
        self, ids: list[list[int]], n: int, sampling: Sampling, adapter: str | None, logprobs: int | None, echo: bool
    ):
        """Choice j (prompt j // n, sampled with seed + j) from the generation engine, and, for echo with
        logprobs, each prompt's log-probabilities from the engine that scores prompts (both at once;
        when one fails, the other is cancelled)."""

        async def given(value):
            return value

        scorer = self._prompt_scorer() if echo and logprobs is not None else None
        expanded = [prompt for prompt in ids for _ in range(n)]
        nothing = () if logprobs is not None else None
        generation = (
            self.engine.complete_tokens(expanded, sampling, adapter, logprobs=logprobs)
            if sampling.max_tokens > 0
            else given([TokenCompletion((), "", "length", len(p), nothing) for p in expanded])
        )
        scoring = (
            scorer.complete_tokens(ids, Sampling(max_tokens=0, temperature=0.0), adapter, prompt_logprobs=logprobs)
            if scorer
            else given(None)
        )
        completions, scored = await gather_all([generation, scoring])
        prompt_tokens, completion_tokens = (
            sum(c.prompt_tokens for c in completions),
            sum(len(c.token_ids) for c in completions),
        )
        self.metrics.tokens(prompt_tokens, completion_tokens)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        return completions, scored, usage

    @timed
    async def completions(self, body: CompletionRequest) -> dict:
        adapter = self._adapter(body.model, field="model")
        check_new_tokens(self.settings, body.max_tokens)  # what can be counted before tokenizing, first
        check_count(len(body.prompts) * body.n, self.settings.max_prompts_per_request, "prompts")
        ids = await self._off_loop(self._prompt_ids, body.prompts)
        self._check_fits(ids, body.max_tokens, body.n, body.logprobs, lambda i: ("prompt", i), echo=bool(body.echo))
        sampling = Sampling(body.max_tokens, body.temperature, body.top_p, body.seed, body.stops)
        completions, scored, usage = await self._complete(
            ids, body.n, sampling, adapter, body.logprobs, bool(body.echo)
        )
        choices = await self._off_loop(self._completion_choices, body, ids, completions, scored)
        return openai_answer("cmpl", "text_completion", body.model, choices, usage)

    def _completion_choices(
        self, body: CompletionRequest, ids: list[list[int]], completions: list[TokenCompletion], scored
    ) -> list[dict]:
        """The choices' texts and `logprobs`; an echoed prompt's text and block are made once and shared by its n choices."""
        prompts, tokenizer = body.prompts, self.engine.counting_tokenizer
        texts, echoes = TokenTexts(tokenizer), {}
        nothing = ("", completion_logprobs(texts, [], []))  # what a choice echoes without `echo`
        choices = []
        for j, c in enumerate(completions):
            i = j // body.n
            if body.echo and i not in echoes:  # (text, logprobs block) of prompt i as its choices echo it
                text = prompts[i] if isinstance(prompts[i], str) else tokenizer.decode(ids[i])
                echoes[i] = (
                    text,
                    completion_logprobs(texts, ids[i], scored[i].prompt_logprobs)
                    if body.logprobs is not None
                    else nothing[1],
                )
            echoed, echo = echoes[i] if body.echo else nothing
            logprobs = None
            if body.logprobs is not None:
                logprobs = joined(echo, completion_logprobs(texts, c.token_ids, c.logprobs, offset=text_length(echo)))
            choices.append(
                {"index": j, "text": echoed + c.text, "finish_reason": c.finish_reason, "logprobs": logprobs}
            )
        return choices

    def _chat_ids(self, body: ChatCompletionRequest) -> list[int]:
        try:
            return chat_prompt_ids(
                self.engine.counting_tokenizer, [{"role": m.role, "content": m.text} for m in body.messages]
            )
        except NoChatTemplate as error:
            raise invalid(("messages",), str(error)) from error
        except (
            TemplateError
        ) as error:  # the template's own refusal (jinja raise_exception): its text stays in the log, not the answer
            logger.info("chat template refused a request's messages: %s", error)
            raise invalid(
                ("messages",), "the model's chat template cannot format these messages (roles or their order)"
            ) from error

    @timed
    async def chat_completions(self, body: ChatCompletionRequest) -> dict:
        adapter = self._adapter(body.model, field="model")
        ids = await self._off_loop(self._chat_ids, body)
        new_tokens = body.new_tokens or max(
            1, min(self.settings.max_tokens_cap, self.settings.max_model_len - len(ids))
        )
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        self._check_fits([ids], new_tokens, body.n, logprobs, lambda i: ("messages",))
        sampling = Sampling(new_tokens, body.temperature, body.top_p, body.seed, body.stops)
        completions, _, usage = await self._complete([ids], body.n, sampling, adapter, logprobs, echo=False)
        texts = TokenTexts(self.engine.counting_tokenizer)
        answers = await self._off_loop(
            lambda: [chat_logprobs(texts, c.logprobs) if logprobs is not None else None for c in completions]
        )
        choices = [
            {
                "index": j,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": c.finish_reason,
                "logprobs": lp,
            }
            for j, (c, lp) in enumerate(zip(completions, answers))
        ]
        return openai_answer("chatcmpl", "chat.completion", body.model, choices, usage)
