"""The pieces of the OpenAI-compatible answers that engines do not make: token texts, `logprobs`
blocks, and the chat prompt.

They follow vLLM's OpenAI server (vllm/entrypoints/openai/completion/serving.py in vLLM 0.32), so
clients written against it, lm-evaluation-harness's `local-completions` among them, read this
service's answers unchanged: the same token texts, the same top-alternatives dicts (the token itself
first, then the k most likely), the same -9999.0 for a log-probability of minus infinity, and
`text_offset` counted over the tokens' texts from 0.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence

from serve.engine import TokenLogprob

FLOOR = -9999.0  # minus infinity (a token the sampler ruled out) as vLLM and OpenAI write it: JSON has no infinity


def token_texts(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token's text decoded alone; a SentencePiece word start ("▁") keeps its space, as in vLLM."""
    pieces = tokenizer.convert_ids_to_tokens(list(ids))
    texts = []
    for text, piece in zip(tokenizer.batch_decode([[token] for token in ids]), pieces):
        texts.append(
            " " + text if isinstance(piece, str) and piece.startswith("▁") and not text.startswith(" ") else text
        )
    return texts


def finite(logprob: float) -> float:
    return max(logprob, FLOOR)


class TokenTexts:
    """`token_texts` for one request's answers, each distinct id decoded once: an echo of n choices
    with 20 alternatives a position would otherwise decode its prompt's ids n x 21 times."""

    def __init__(self, tokenizer):
        self.tokenizer, self.known = tokenizer, {}

    def __call__(self, ids: Sequence[int]) -> list[str]:
        if missing := [i for i in dict.fromkeys(ids) if i not in self.known]:
            self.known.update(zip(missing, token_texts(self.tokenizer, missing)))
        return [self.known[i] for i in ids]


def completion_logprobs(
    texts: TokenTexts, ids: Sequence[int], entries: Sequence[TokenLogprob | None], offset: int = 0
) -> dict:
    """The `logprobs` of a /v1/completions choice for tokens `ids` (one entry each; None where there
    is no log-probability, the prompt's first token): tokens, token_logprobs, top_logprobs, and
    text_offset counted from `offset` (where these tokens follow others: `joined`)."""
    tokens = texts(ids)
    tops = []
    for token, entry in zip(tokens, entries):
        if entry is None:
            tops.append(None)
            continue
        top = {token: finite(entry.logprob)}
        top.update(
            {
                text: finite(value)
                for text, (_, value) in zip(texts([t for t, _ in entry.top]), entry.top)
                if text not in top
            }
        )
        tops.append(top)
    offsets = list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=offset)) if tokens else []
    return {
        "tokens": tokens,
        "token_logprobs": [None if e is None else finite(e.logprob) for e in entries],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def text_length(block: dict) -> int:
    """Characters of a completion_logprobs block's tokens: where tokens after them start."""
    return sum(map(len, block["tokens"]))


def joined(first: dict, then: dict) -> dict:
    """Two completion_logprobs blocks as one (`then` made with offset text_length(first))."""
    return {key: first[key] + then[key] for key in first}


def chat_logprobs(texts: TokenTexts, entries: Sequence[TokenLogprob]) -> dict:
    """The `logprobs` of a /v1/chat/completions choice: per generated token, its text, bytes,
    log-probability and `top_logprobs` (the k most likely)."""

    def item(text: str, logprob: float) -> dict:
        return {"token": text, "logprob": finite(logprob), "bytes": list(text.encode())}

    tokens = texts([e.token for e in entries])
    content = []
    for text, entry in zip(tokens, entries):
        alternatives = [item(t, v) for t, (_, v) in zip(texts([t for t, _ in entry.top]), entry.top)]
        content.append({**item(text, entry.logprob), "top_logprobs": alternatives})
    return {"content": content}


class NoChatTemplate(ValueError):
    """The model's tokenizer has no chat template: /v1/chat/completions cannot format messages."""


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The chat prompt's token ids: the model's chat template with the assistant's turn opened, then
    tokenized without adding special tokens (the template writes the ones it wants), as vLLM does."""
    if not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplate("this model's tokenizer has no chat template")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


def openai_answer(id_prefix: str, kind: str, model: str, choices: list[dict], usage: dict) -> dict:
    """The envelope of a /v1/completions (`kind` "text_completion") or /v1/chat/completions
    ("chat.completion") answer."""
    return {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }
