"""Multiple-choice scoring with transformers: one forward per question.

Every WMDP answer continuation (" A", " B", ...) is a single token, so the
log-likelihood of each choice is the next-token log-probability of its letter
after the prompt: one forward per question gives all of them, where
lm-evaluation-harness spends one request per choice. The result is renormalised
over the choices (a log-softmax over the letters' logits).
"""

from __future__ import annotations

import torch

from serve.mc_format import LETTERS, choice_continuation


def letter_token_ids(tokenizer, n_choices: int) -> list[int]:
    """Token ids of " A".." <n>"; each must be exactly one token for one-pass scoring."""
    ids = []
    for i in range(n_choices):
        toks = tokenizer(choice_continuation(i), add_special_tokens=False).input_ids
        if len(toks) != 1:
            raise ValueError(f"choice continuation {choice_continuation(i)!r} is {len(toks)} tokens for this tokenizer")
        ids.append(toks[0])
    return ids


def scorable_choices(tokenizer) -> int:
    """How many choices (" A", " B", ...) this tokenizer can score in one pass: each letter one token."""
    n = 0
    while n < len(LETTERS) and len(tokenizer(choice_continuation(n), add_special_tokens=False).input_ids) == 1:
        n += 1
    return n


@torch.inference_mode()
def mc_logprobs(model, tokenizer, prompts: list[str], n_choices: list[int], batch_size: int = 64) -> list[list[float]]:
    """Per-question choice log-probabilities, renormalised over that question's choices.

    Prompts go through in batches of similar length (less padding), left-padded with
    position ids that ignore the padding; results come back in the input order.
    """
    letters = letter_token_ids(tokenizer, max(n_choices))
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[list[float]] = [[] for _ in prompts]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            enc = tokenizer([prompts[i] for i in chunk], return_tensors="pt", padding=True).to(device)
            positions = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(**enc, position_ids=positions, logits_to_keep=1).logits[:, -1, :].float()
            for i, row in zip(chunk, logits):
                results[i] = torch.log_softmax(row[letters[: n_choices[i]]], dim=-1).tolist()
    finally:
        tokenizer.padding_side = side
    return results
