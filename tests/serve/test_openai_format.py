"""The OpenAI answers' `logprobs` blocks (serve/openai_format.py) with the tiny model's own tokenizer:
each distinct token decoded once per answer, and an echoed prompt's block joined to a completion's
exactly as the block of all their tokens at once."""

import pytest

from serve.engine import TokenLogprob
from serve.openai_format import TokenTexts, completion_logprobs, joined, text_length, token_texts


class CountingTokenizer:
    """The tokenizer, with a count of the ids it was asked to decode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, 0

    def batch_decode(self, batches):
        self.decoded += len(batches)
        return self.tokenizer.batch_decode(batches)

    def convert_ids_to_tokens(self, ids):
        return self.tokenizer.convert_ids_to_tokens(ids)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def entries(ids: list[int], first: bool = False) -> list:
    """A log-probability and three alternatives per token (none for a prompt's first)."""
    return [
        None if first and k == 0 else TokenLogprob(i, -0.5 - k, ((i, -0.5 - k), (7, -2.0), (8, -3.0)))
        for k, i in enumerate(ids)
    ]


def test_each_distinct_token_is_decoded_once_per_answer(tokenizer):
    counting = CountingTokenizer(tokenizer)
    texts = TokenTexts(counting)
    prompt = [5, 6, 7, 5, 6, 7, 9]
    for _ in range(16):  # an echo's n choices
        block = completion_logprobs(texts, prompt, entries(prompt, first=True))
    assert counting.decoded == len({5, 6, 7, 8, 9})  # the prompt's ids and the alternatives', once each
    assert block["tokens"] == token_texts(tokenizer, prompt)


def test_an_echo_joined_to_its_completion_is_the_block_of_all_their_tokens(tokenizer):
    texts = TokenTexts(tokenizer)
    prompt, completion = [5, 6, 7, 300], [41, 42, 43]
    echo = completion_logprobs(texts, prompt, entries(prompt, first=True))
    both = joined(echo, completion_logprobs(texts, completion, entries(completion), offset=text_length(echo)))
    assert both == completion_logprobs(texts, prompt + completion, entries(prompt, first=True) + entries(completion))
    assert both["text_offset"][len(prompt)] == len("".join(both["tokens"][: len(prompt)]))
