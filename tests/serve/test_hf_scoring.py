"""serve/hf_scoring's cloze scorer: one forward per distinct input, the numbers of one sequence per choice."""

import math

import pytest
import torch

from serve.hf_scoring import LOGITS_BYTES, cloze_chunks, cloze_inputs, cloze_logprobs


def test_one_token_choices_share_their_prompt_and_longer_ones_drop_their_last_token():
    inputs, reads = cloze_inputs([[1, 5], [1, 6]], [[[7], [8], [9, 10, 11]], [[7], []]])
    assert inputs == [[1, 5], [1, 5, 9, 10], [1, 6]]
    assert reads == [(0, [7]), (0, [8]), (1, [9, 10, 11]), (2, [7]), (-1, [])]


def test_a_chunk_is_cut_where_its_kept_logits_would_pass_the_bound():
    # a vocabulary whose one kept position is half the bound: two one-token inputs fit, a two-token one stays alone
    inputs, targets = [[1, 1, 1], [1], [1, 1]], [[[5]], [[5, 6]], [[5], [7]]]
    assert cloze_chunks(inputs, targets, 64, LOGITS_BYTES // 8) == [[1], [2, 0]]
    assert cloze_chunks(inputs, targets, 64, 1024) == [[1, 2, 0]]  # the tiny model's: never cut
    assert cloze_chunks(inputs, targets, 2, 1024) == [[1, 2], [0]]  # batch_size first, shortest first


def by_hand(model, tokenizer, prompts: list[str], choices: list[list[str]]) -> list[list[float]]:
    """Each choice scored alone: prompt + continuation in one sequence, its tokens' log-probabilities summed, renormalised."""
    from serve.mc_format import cloze_continuation

    out = []
    for prompt, options in zip(prompts, choices):
        ids = tokenizer(prompt).input_ids
        sums = []
        for choice in options:
            tail = tokenizer(cloze_continuation(choice), add_special_tokens=False).input_ids
            logp = torch.log_softmax(model(torch.tensor([ids + tail])).logits[0].float(), -1)
            sums.append(sum(logp[len(ids) - 1 + j, t].item() for j, t in enumerate(tail)))
        norm = math.log(sum(math.exp(s) for s in sums))
        out.append([s - norm for s in sums])
    return out


def test_cloze_scores_equal_one_sequence_per_choice(tiny_model):
    """Prompts of several lengths in one padded batch, one-token and multi-token choices (a question's
    choices of one token share a forward): every score that of its choice scored alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serve.mc_format import format_cloze_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompts = [
        format_cloze_prompt(q, "biology")
        for q in ("What organ is big?", "Which of these, found in the far north of the valley, is used for tools?")
    ]
    choices = [
        ["Heart", "Kidneys", "Brain", "Skin"],
        ["the bones of the kespramir", "Heart", "a stone", "Heart of the valley"],
    ]
    assert any(len(tokenizer(" " + c, add_special_tokens=False).input_ids) > 1 for c in choices[1])
    with torch.inference_mode():
        expected = by_hand(model, tokenizer, prompts, choices)
    got = cloze_logprobs(model, tokenizer, prompts, choices, batch_size=2)
    assert [len(g) for g in got] == [4, 4]
    for g, e in zip(got, expected):
        assert g == pytest.approx(e, abs=1e-5)
