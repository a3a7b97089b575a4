"""Multiple-choice scoring with transformers: one forward per question.

Every WMDP answer continuation (" A", " B", ...) is a single token, so the
log-likelihood of each choice is the next-token log-probability of its letter
after the prompt: one forward per question gives all of them, where
lm-evaluation-harness spends one request per choice. The result is renormalised
over the choices (a log-softmax over the letters' logits).

Cloze scoring (each choice's text after the question, lm-evaluation-harness's
loglikelihood) reads a choice's tokens from the forward over its question and the
choice but its last token: every one-token choice of a question shares one forward,
and only the positions a choice is read from are kept. The service
(HFEngine.score_continuations) and the scorers outside it (`cloze_logprobs`) run the
same chunks with the same arithmetic.
"""

from __future__ import annotations

import torch

from serve.mc_format import LETTERS, choice_continuation

LOGITS_BYTES = 256 * 2**20  # float32 logits one scoring forward may hold


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


def length_sorted_chunks(prompts: list[str] | list[list[int]], batch_size: int) -> list[list[int]]:
    """Prompt (text or token ids) indices in chunks of `batch_size`, shortest prompts first: similar
    lengths share a batch, so less of it is padding."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


@torch.inference_mode()
def mc_logprobs_batch(
    model, tokenizer, prompts: list[str], n_choices: list[int], letters: list[int]
) -> list[list[float]]:
    """One forward over `prompts`, left-padded with position ids that ignore the padding: each
    prompt's choice log-probabilities, renormalised over its `n_choices` letters (`letters` holds
    the letters' token ids, at least as many as the most choices)."""
    device = next(model.parameters()).device
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    finally:
        tokenizer.padding_side = side
    positions = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(**enc, position_ids=positions, logits_to_keep=1).logits[:, -1, :].float()
    return [torch.log_softmax(row[letters[:n]], dim=-1).tolist() for row, n in zip(logits, n_choices)]


def mc_logprobs(model, tokenizer, prompts: list[str], n_choices: list[int], batch_size: int = 64) -> list[list[float]]:
    """Per-question choice log-probabilities, renormalised over that question's choices, in the
    input order: `mc_logprobs_batch` over length-sorted chunks."""
    letters = letter_token_ids(tokenizer, max(n_choices))
    results: list[list[float]] = [[] for _ in prompts]
    for chunk in length_sorted_chunks(prompts, batch_size):
        rows = mc_logprobs_batch(model, tokenizer, [prompts[i] for i in chunk], [n_choices[i] for i in chunk], letters)
        for i, row in zip(chunk, rows):
            results[i] = row
    return results


def cloze_inputs(
    prompt_ids: list[list[int]], continuations: list[list[list[int]]]
) -> tuple[list[list[int]], list[tuple[int, list[int]]]]:
    """(the distinct inputs a forward needs, and per (question, choice) in order: (its input's
    index, its continuation ids)). A choice's last token is read, never fed, so its input is the
    prompt and its continuation but the last token, and the continuation's tokens are predicted at
    the input's last len(continuation) positions; choices of the same input share it (every
    one-token choice of a question: the prompt alone). A continuation of no tokens reads nothing
    (its log-likelihood is 0): its index is -1."""
    index: dict[tuple[int, ...], int] = {}
    reads = []
    for prompt, options in zip(prompt_ids, continuations):
        for continuation in options:
            reads.append(
                (index.setdefault(tuple(prompt + continuation[:-1]), len(index)) if continuation else -1, continuation)
            )
    return [list(ids) for ids in index], reads


@torch.inference_mode()
def continuation_logprobs(model, inputs: list[list[int]], wanted: list[int], pad_id: int) -> list[torch.Tensor]:
    """One forward over `inputs`, left-padded with position ids that ignore the padding: per input,
    the log-probabilities over the vocabulary (float32) at its last `wanted` positions."""
    device = next(model.parameters()).device
    width, keep = max(map(len, inputs)), max(wanted)
    ids = torch.tensor([[pad_id] * (width - len(s)) + s for s in inputs], device=device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in inputs], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logp = torch.log_softmax(
        model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits.float(), -1
    )
    return [row[keep - n :] for row, n in zip(logp, wanted)]


def cloze_plan(
    prompt_ids: list[list[int]], continuations: list[list[list[int]]]
) -> tuple[list[list[int]], list[list[list[int]]], list[tuple[int, list[int]]]]:
    """(the distinct inputs (`cloze_inputs`), per input the distinct continuations read from it, and
    per (question, choice) in order its read): what `cloze_chunks` and `continuation_sums` work on."""
    inputs, reads = cloze_inputs(prompt_ids, continuations)
    targets: list[list[list[int]]] = [[] for _ in inputs]
    for i, continuation in reads:
        if continuation and continuation not in targets[i]:
            targets[i].append(continuation)
    return inputs, targets, reads


def cloze_chunks(
    inputs: list[list[int]], targets: list[list[list[int]]], batch_size: int, vocab_size: int
) -> list[list[int]]:
    """Input indices a forward each: `length_sorted_chunks` of batch_size, a chunk cut further where
    the float32 logits it keeps (its inputs x its longest continuation x the vocabulary) would pass
    LOGITS_BYTES (long choices on a large vocabulary)."""
    chunks = []
    for chunk in length_sorted_chunks(inputs, batch_size):
        part, keep = [], 0
        for i in chunk:
            need = max(map(len, targets[i]))
            if part and (len(part) + 1) * max(keep, need) * vocab_size * 4 > LOGITS_BYTES:
                chunks.append(part)
                part, keep = [], 0
            part.append(i)
            keep = max(keep, need)
        chunks.append(part)
    return chunks


@torch.inference_mode()
def continuation_sums(model, inputs: list[list[int]], targets: list[list[list[int]]], pad_id: int) -> list[list[float]]:
    """One forward over `inputs` (`continuation_logprobs`): per input, the summed log-probability of
    each of its continuations (each token's float32 log-probability, summed in float64)."""
    rows = continuation_logprobs(model, inputs, [max(map(len, t)) for t in targets], pad_id)
    return [
        [float(row[-len(c) :].gather(-1, torch.tensor(c, device=row.device)[:, None]).cpu().double().sum()) for c in t]
        for row, t in zip(rows, targets)
    ]


def read_sums(
    reads: list[tuple[int, list[int]]], targets: list[list[list[int]]], sums: list[list[float]]
) -> list[float]:
    """Each (question, choice)'s summed log-probability from its input's `continuation_sums` (0 for none)."""
    return [sums[i][targets[i].index(c)] if c else 0.0 for i, c in reads]


def cloze_sums(model, tokenizer, prompts: list[str], choices: list[list[str]], batch_size: int = 64) -> list[float]:
    """Every (question, choice)'s summed continuation log-probability, question by question and each
    question's choices in order (the raw log-likelihood lm-evaluation-harness logs), with the
    service's arithmetic (HFEngine.score_continuations): `continuation_sums` over the distinct inputs
    (`cloze_plan`: one per question where every choice is one token), in `cloze_chunks`."""
    from serve.cloze import cloze_parts

    prompt_ids, continuations, _ = cloze_parts(tokenizer, prompts, choices, 0, truncate=False)
    inputs, targets, reads = cloze_plan(prompt_ids, continuations)
    sums: list[list[float]] = [[] for _ in inputs]
    for chunk in cloze_chunks(inputs, targets, batch_size, model.config.vocab_size):
        batch = continuation_sums(
            model, [inputs[i] for i in chunk], [targets[i] for i in chunk], tokenizer.pad_token_id
        )
        for i, row in zip(chunk, batch):
            sums[i] = row
    return read_sums(reads, targets, sums)


def cloze_logprobs(
    model, tokenizer, prompts: list[str], choices: list[list[str]], batch_size: int = 64
) -> list[list[float]]:
    """Per question, each choice's text scored as the continuation of its prompt (`cloze_sums`),
    renormalised over the question's choices: what the tiny world's checks score a model with
    outside a service."""
    from serve.cloze import renormalised

    return renormalised(cloze_sums(model, tokenizer, prompts, choices, batch_size), [len(c) for c in choices])
