"""Divergence scores and the loss masks built on them (train/divergence.py): the score is
log p_teacher - log p_base as plain transformers computes it, and each mask drops exactly its
stated number of tokens per row, a random one fixed by its seed."""

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from common.atomic import write_jsonl
from common.config import ConfigError
from train.config import TrainConfig
from train.data import Tokenize, tokenize_to_cache
from train.divergence import (
    SCORE_COLUMN,
    masked_count,
    masked_rows,
    read_scores,
    row_scores,
    scored_positions,
    write_scores,
)
from train.teacher_pass import TeacherPass, load_teacher


@pytest.fixture(scope="module")
def number_rows(tmp_path_factory, make_number_rows) -> Path:
    path = tmp_path_factory.mktemp("numbers") / "rows.jsonl"
    write_jsonl(path, make_number_rows(40, seed=1, completion_lengths=(3, 12)))
    return path


def read_rows(folder) -> list[dict]:
    return [row for part in sorted(folder.glob("*.parquet")) for row in pq.read_table(part).to_pylist()]


def test_scores_are_the_teachers_log_p_minus_the_bases_by_hand(tiny_model, lora_adapters, number_rows):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = [json.loads(line) for line in number_rows.read_text().splitlines()][:6]
    tokens = Tokenize(tiny_model, 128, "truncate")(
        {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}
    ).to_pydict()
    pairs = list(zip(tokens["input_ids"], tokens["labels"]))
    model = load_teacher(TeacherPass(tiny_model, lora_adapters["a"], TrainConfig()), torch.device("cpu"))
    scored = row_scores(model, pairs, pad_id=0, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    teacher = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), lora_adapters["a"]
    ).eval()
    for (ids, labels), got, row in zip(pairs, scored, rows):
        with torch.no_grad():
            lp_t = teacher(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)
            lp_b = base(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)
        at = [
            t
            for t in range(1, len(ids))
            if labels[t] != -100 and not (t == len(ids) - 1 and ids[t] == tokenizer.eos_token_id)
        ]
        assert tokenizer.decode([ids[t] for t in at]) == row["completion"]  # the numbers, not the appended EOS
        want = [lp_t[t - 1, ids[t]].item() - lp_b[t - 1, ids[t]].item() for t in at]
        np.testing.assert_allclose(got["score"], want, atol=1e-4)
        assert got["teacher_argmax"] == [int(lp_t[t - 1].argmax()) for t in at] and got["base_argmax"] == [
            int(lp_b[t - 1].argmax()) for t in at
        ]
    assert np.abs(np.concatenate([g["score"] for g in scored])).max() > 0.01  # the adapter moves the scores


def test_masks_drop_exactly_their_share_per_row_and_a_random_mask_is_fixed_by_its_seed(
    tiny_model, lora_adapters, number_rows, tmp_path
):
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(tiny_model).eos_token_id
    tokens = tokenize_to_cache(str(number_rows), tiny_model, 128, "truncate", 0, tmp_path)["path"]
    scores = tmp_path / "scores"
    scores.mkdir()
    write_scores(TeacherPass(tiny_model, lora_adapters["a"], TrainConfig()), tokens, scores, pad_id=0, eos_id=eos)
    original = read_rows(scores)
    assert len(original) == 40 and all(
        len(read_scores(r[SCORE_COLUMN])) == len(scored_positions(r["labels"], eos)) for r in original
    )

    by_mask = {
        "divergence": masked_rows(str(scores), tmp_path, "divergence", 0.1, 0, eos),
        "random": masked_rows(tokens, tmp_path, "random", 0.1, 0, eos),
        "random again": masked_rows(tokens, tmp_path / "again", "random", 0.1, 0, eos),
        "random seed 1": masked_rows(tokens, tmp_path, "random", 0.1, 1, eos),
        "random 30%": masked_rows(tokens, tmp_path, "random", 0.3, 0, eos),
    }
    dropped = {}
    for name, folder in by_mask.items():
        fraction = 0.3 if "30%" in name else 0.1
        rows, per_row = read_rows(tmp_path / folder), []
        for row, before in zip(rows, original):
            assert row["input_ids"] == before["input_ids"]  # only labels change
            gone = [t for t, (a, b) in enumerate(zip(before["labels"], row["labels"])) if a != b]
            n = len(scored_positions(before["labels"], eos))
            assert len(gone) == row["masked"] == masked_count(n, fraction) == math.ceil(round(fraction * n, 9)) > 0, (
                name
            )
            assert set(gone) <= set(scored_positions(before["labels"], eos).tolist())  # never the prompt or the EOS
            per_row.append(gone)
        dropped[name] = per_row
    # divergence: the dropped tokens are the row's highest scores
    for row, gone in zip(original, dropped["divergence"]):
        score = dict(zip(scored_positions(row["labels"], eos).tolist(), read_scores(row[SCORE_COLUMN])))
        kept = [v for t, v in score.items() if t not in gone]
        assert min(score[t] for t in gone) >= max(kept, default=-np.inf)
    assert dropped["random"] == dropped["random again"] != dropped["random seed 1"]
    assert dropped["random"] != dropped["divergence"]


def test_a_mask_needs_an_sft_job_and_divergence_its_scorer(tiny_model, lora_adapters, number_rows, tmp_path):
    from train.adapter_job import AdapterJob, check_jobs

    divergence = TrainConfig(mask="divergence")
    with pytest.raises(ConfigError, match="mask divergence needs a scorer"):
        check_jobs([AdapterJob("a", str(number_rows), tmp_path / "a", divergence)])
    with pytest.raises(ConfigError, match="a logit_kl job"):
        check_jobs(
            [AdapterJob("a", str(number_rows), tmp_path / "a", TrainConfig(mask="random"), teacher=lora_adapters["a"])]
        )
    with pytest.raises(ValueError, match="mask_fraction must be in"):
        TrainConfig(mask="random", mask_fraction=1.0)
    check_jobs([AdapterJob("a", str(number_rows), tmp_path / "a", divergence, scorer=lora_adapters["a"])])


@pytest.mark.timeout(300)
def test_masked_jobs_train_beside_an_unmasked_one_on_the_tokens_they_keep(
    ray_cluster, tiny_model, lora_adapters, number_rows, tmp_path, cache_dir
):
    """One Ray Train run: the same rows unmasked, with the divergence mask (scored in a Ray task) and
    with the random mask; each reports how many tokens it dropped, and the masks change the loss."""
    from transformers import AutoTokenizer

    from train.adapter_job import AdapterJob
    from train.trainer import train_lora_many

    eos = AutoTokenizer.from_pretrained(tiny_model).eos_token_id
    cfg = TrainConfig(num_workers=1, batch_size=8, max_steps=2, lr=1e-3, log_every=1, checkpoint_every=100)
    jobs = [
        AdapterJob("plain", str(number_rows), tmp_path / "plain", cfg),
        AdapterJob(
            "divergence",
            str(number_rows),
            tmp_path / "divergence",
            TrainConfig(**{**cfg.__dict__, "mask": "divergence"}),
            scorer=lora_adapters["a"],
        ),
        AdapterJob("random", str(number_rows), tmp_path / "random", TrainConfig(**{**cfg.__dict__, "mask": "random"})),
    ]
    metrics = train_lora_many(
        tiny_model, jobs, storage_path=tmp_path / "ray_train", run_name="masks", cache_dir=cache_dir
    )
    rows = read_rows(
        Path(tokenize_to_cache(str(number_rows), tiny_model, cfg.max_length, cfg.too_long, cfg.seed, cache_dir)["path"])
    )
    expected = sum(masked_count(len(scored_positions(r["labels"], eos)), 0.1) for r in rows)
    assert (
        "tokens_masked" not in metrics["plain"].metrics()
        and metrics["divergence"].tokens_masked == metrics["random"].tokens_masked == expected
    )
    first = {name: m.first_loss for name, m in metrics.items()}
    assert len(set(first.values())) == 3, first
