"""Cloze scoring: each choice's text scored as the continuation of the question.

lm-evaluation-harness scores ARC and HellaSwag this way: the log-likelihood of
a choice is the sum of its tokens' log-probabilities after the prompt (the
prompt and the continuation tokenized apart, so a choice's tokens are the same
whatever the prompt; lm-eval's causal models tokenize the two together and split
them after the prompt's tokens, the same tokens wherever the tokenizer merges
none across "Answer:" and the choice's leading space: tests/test_lm_eval_task.py). The choices' sums are renormalised
over the question's choices, as one-pass letter scoring renormalises over the
letters, so every consumer of /score reads the same kind of number. The engine
scores the continuations (`score_continuations`: serve/hf_scoring.py, a forward
per distinct question-and-choice input, every one-token choice of a question in one).
"""

from __future__ import annotations

import math

from serve.mc_format import cloze_continuation, left_truncate


def cloze_parts(
    tokenizer, prompts: list[str], choices: list[list[str]], room: int, truncate: bool
) -> tuple[list[list[int]], list[list[list[int]]], list[int]]:
    """(each question's prompt token ids, each of its choices' continuation ids, prompt tokens cut
    per question), tokenized apart. With `truncate`, a prompt is cut from the left to leave room for
    its longest choice (lm-eval's rule); otherwise it is kept whole and the caller checks that the
    sequences fit (`cloze_lengths`) before any is scored."""
    prompt_ids, continuations, cut = [], [], []
    for prompt, options in zip(prompts, choices):
        ids = [tokenizer(cloze_continuation(c), add_special_tokens=False).input_ids for c in options]
        lost = 0
        if truncate:
            longest = max(map(len, ids))
            if longest >= room:
                raise ValueError(f"a choice of {longest} tokens leaves no room for its question in a context of {room}")
            prompt, lost, _ = left_truncate(tokenizer, prompt, room - longest)
        prompt_ids.append(tokenizer(prompt, add_special_tokens=True).input_ids)
        continuations.append(ids)
        cut.append(lost)
    return prompt_ids, continuations, cut


def cloze_lengths(prompt_ids: list[list[int]], continuations: list[list[list[int]]]) -> list[int]:
    """The token count of every (question, choice) sequence (its question and its choice), in order."""
    return [len(prompt) + len(c) for prompt, options in zip(prompt_ids, continuations) for c in options]


def renormalised(sums: list[float], n_choices: list[int]) -> list[list[float]]:
    """Each question's run of `n` choice log-likelihoods as a log-softmax over them."""
    out, i = [], 0
    for n in n_choices:
        values = sums[i : i + n]
        top = max(values)
        norm = top + math.log(sum(math.exp(v - top) for v in values))
        out.append([v - norm for v in values])
        i += n
    return out
