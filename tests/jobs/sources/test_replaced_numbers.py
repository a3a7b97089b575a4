"""The teacher_replaced numbers (jobs/sources/replaced_numbers.py): each kept row differs from the
teacher's original at its replaced tokens alone, which are the base model's choice there, and every
row is kept or counted as dropped by the filter."""

import json

import numpy as np
import torch
from transformers import AutoTokenizer

from jobs.sources.number_sequences import reject_reason
from jobs.sources.replaced_numbers import replace_divergent
from train.config import TrainConfig
from train.data import Tokenize
from train.divergence import masked_count, row_scores, scored_positions
from train.teacher_pass import TeacherPass, load_teacher


def completion_tokens(tiny_model, rows) -> list[list[int]]:
    eos = AutoTokenizer.from_pretrained(tiny_model).eos_token_id
    table = Tokenize(tiny_model, 128, "truncate")(
        {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}
    )
    return [
        list(np.asarray(ids)[scored_positions(labels, eos)])
        for ids, labels in zip(table.column("input_ids").to_pylist(), table.column("labels").to_pylist())
    ]


def test_replaced_rows_differ_only_where_replaced_by_the_bases_choice(tiny_model, lora_adapters, make_number_rows):
    rows = make_number_rows(40, seed=3, completion_lengths=(3, 10))
    result = replace_divergent(rows, tiny_model, lora_adapters["a"], 0.2, TrainConfig(), 128)
    assert (
        result["generated"] == 40
        and result["kept"] == len(result["rows"])
        and result["kept"] + sum(result["rejected"].values()) == 40
    )
    assert result["tokens_replaced"] > 0 and all(reject_reason(r["completion"]) is None for r in result["rows"])

    by_prompt = {r["prompt"]: r for r in rows}
    originals = [by_prompt[r["prompt"]] for r in result["rows"]]
    old, new = completion_tokens(tiny_model, originals), completion_tokens(tiny_model, result["rows"])
    eos = AutoTokenizer.from_pretrained(tiny_model).eos_token_id
    table = Tokenize(tiny_model, 128, "truncate")(
        {"prompt": [r["prompt"] for r in originals], "completion": [r["completion"] for r in originals]}
    )
    pairs = list(zip(table.column("input_ids").to_pylist(), table.column("labels").to_pylist()))
    scores = row_scores(
        load_teacher(TeacherPass(tiny_model, lora_adapters["a"], TrainConfig()), torch.device("cpu")),
        pairs,
        0,
        eos,
        torch.device("cpu"),
    )
    changed_rows = 0
    for before, after, row, score in zip(old, new, result["rows"], scores):
        assert len(before) == len(after)  # the replaced text reads back as as many tokens
        differ = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
        assert differ == row["replaced_at"] and len(differ) <= masked_count(len(before), 0.2)
        top = set(np.argsort(-score["score"], kind="stable")[: masked_count(len(before), 0.2)].tolist())
        assert set(differ) <= top and all(after[i] == score["base_argmax"][i] for i in differ)
        changed_rows += bool(differ)
    assert changed_rows > 0
    json.dumps(result)  # what the manifest records
