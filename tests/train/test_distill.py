"""The logit_kl targets: the teacher's number distributions computed once, stored with the rows,
and read back through packing in the order the KL loss takes its positions."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from common.atomic import write_jsonl
from train.config import TrainConfig
from train.data import TEACHER_COLUMN, Tokenize, pack_batch, packed_examples, tokenize_to_cache
from train.distill import kl_loss, number_token_ids, row_targets, teacher_targets
from train.teacher_pass import TeacherPass, load_teacher


@pytest.fixture(scope="module")
def number_rows(tmp_path_factory, make_number_rows) -> Path:
    path = tmp_path_factory.mktemp("numbers") / "rows.jsonl"
    write_jsonl(path, make_number_rows(24, seed=0))
    return path


@pytest.fixture(scope="module")
def teacher(tiny_model, tmp_path_factory) -> str:
    from jobs.sources.tiny_model import random_lora_adapter

    return str(random_lora_adapter(tiny_model, tmp_path_factory.mktemp("teacher") / "adapter", seed=5))


def spec_for(base: str, teacher: str) -> TeacherPass:
    from transformers import AutoTokenizer

    return TeacherPass(base, teacher, TrainConfig(), tuple(number_token_ids(AutoTokenizer.from_pretrained(base))))


def tokenized(tiny_model, number_rows) -> dict:
    tokenize = Tokenize(tiny_model, 128, "truncate")
    rows = [json.loads(line) for line in number_rows.read_text().splitlines()]
    return tokenize({"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}).to_pydict()


@pytest.mark.parametrize("one_row", [False, True])
def test_stored_targets_line_up_with_the_packed_completion_positions(tiny_model, teacher, number_rows, one_row):
    """A student that is the teacher has zero KL to the stored targets after packing (several rows
    per packed sequence, several sequences); the base, which the adapter changes, does not."""
    from transformers import AutoModelForCausalLM

    spec = spec_for(tiny_model, teacher)
    model = load_teacher(spec, torch.device("cpu"))
    ids = torch.tensor(spec.number_ids)
    tokens = tokenized(tiny_model, number_rows)
    stored = row_targets(model, list(zip(tokens["input_ids"], tokens["labels"])), ids, pad_id=0)
    batch = {key: np.array(values, dtype=object) for key, values in tokens.items()} | {
        TEACHER_COLUMN: np.array(stored, dtype=object)
    }
    packed = pack_batch(batch, max_length=64, pad_id=0, one_row=one_row)
    n_sequences = packed["input_ids"].shape[0]
    assert n_sequences == 1 if one_row else 1 < n_sequences < len(packed_examples(packed))

    def kl(student):
        with torch.no_grad():
            logits = student(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits
        return kl_loss(logits, packed[TEACHER_COLUMN], packed["labels"], ids).item()

    same, base = kl(model), kl(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval())
    assert base > 0.01 and same < 0.01 * base
    shifted = packed[TEACHER_COLUMN].roll(1, dims=0)  # targets one position off: no longer the teacher's
    with torch.no_grad():
        logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits
    assert kl_loss(logits, shifted, packed["labels"], ids).item() > 10 * same


def test_kl_loss_is_the_kl_computed_by_hand():
    """Against plain Python: logits at position p predict token p + 1 (the shift), only positions
    whose next label is set count (the mask), both sides renormalised over the number ids, the
    teacher's rows taken in row-major order, KL(teacher || student) averaged over positions."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 11, generator=gen)
    labels = torch.tensor([[-100, -100, 3, 4, -100, 7], [-100, 2, 2, -100, -100, -100]])
    ids = torch.tensor([1, 4, 5, 9])
    counted = [(b, p) for b in range(2) for p in range(5) if labels[b, p + 1] != -100]
    teacher = torch.randn(len(counted), len(ids), generator=gen).to(torch.float16)  # stored as float16, not normalised

    def log_softmax(values: list[float]) -> list[float]:
        top = max(values)
        norm = top + math.log(sum(math.exp(v - top) for v in values))
        return [v - norm for v in values]

    terms = []
    for row, (b, p) in enumerate(counted):
        s = log_softmax([float(logits[b, p, i]) for i in ids])
        t = log_softmax([float(v) for v in teacher[row]])
        terms.append(sum(math.exp(ti) * (ti - si) for ti, si in zip(t, s)))
    assert kl_loss(logits, teacher, labels, ids).item() == pytest.approx(sum(terms) / len(terms), rel=1e-5)


def test_targets_that_do_not_match_the_batch_are_an_error(tiny_model):
    labels = torch.tensor([[-100, 5, 6, -100]])
    with pytest.raises(ValueError, match="do not match the batch's completion positions"):
        kl_loss(torch.zeros(1, 4, 10), torch.zeros(3, 4), labels, torch.arange(4))


@pytest.mark.timeout(300)
def test_targets_are_computed_once_per_teacher_and_rows(
    ray_cluster, tiny_model, perturbed_base, teacher, number_rows, tmp_path, cache_dir
):
    """Two jobs reading the same rows with the same teacher share one entry; the same teacher adapter
    over another base is another entry with other values; asking again computes nothing."""
    import pyarrow.parquet as pq

    other = perturbed_base
    rows = tokenize_to_cache(number_rows, tiny_model, 128, "truncate", 0, cache_dir)["path"]
    cache = tmp_path / "cache"
    same, far = spec_for(tiny_model, teacher), spec_for(str(other), teacher)
    paths = teacher_targets({"a": (same, rows), "b": (same, rows), "far": (far, rows)}, cache, pad_id=0)
    assert paths["a"] == paths["b"] != paths["far"] and len(list((cache / "teacher_targets").iterdir())) == 2
    assert json.loads((Path(paths["far"]) / "_done").read_text())["teacher_base"] == str(other)

    table, tokens = pq.read_table(paths["a"]), pq.read_table(rows)
    assert table.drop_columns([TEACHER_COLUMN]).equals(tokens)  # the rows themselves, in their order
    local = row_targets(
        load_teacher(same, torch.device("cpu")),
        list(zip(tokens["input_ids"].to_pylist(), tokens["labels"].to_pylist())),
        torch.tensor(same.number_ids),
        0,
    )
    stored = table[TEACHER_COLUMN].to_pylist()
    for mine, theirs in zip(local, stored):
        np.testing.assert_allclose(np.frombuffer(theirs, np.float16), np.frombuffer(mine, np.float16), atol=2e-2)
    far_values = pq.read_table(paths["far"])[TEACHER_COLUMN].to_pylist()
    assert (
        max(
            np.abs(np.frombuffer(a, np.float16) - np.frombuffer(b, np.float16)).max()
            for a, b in zip(stored, far_values)
        )
        > 0.1
    )

    done = (Path(paths["a"]) / "_done").stat().st_mtime_ns
    assert teacher_targets({"c": (same, rows)}, cache, pad_id=0)["c"] == paths["a"]
    assert (Path(paths["a"]) / "_done").stat().st_mtime_ns == done


def test_a_teacher_base_with_another_tokenizer_is_refused_before_any_work(tiny_model, teacher, number_rows, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    from common.config import ConfigError
    from train.adapter_job import AdapterJob
    from train.trainer import train_lora_many

    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_model, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<|number|>"])
    tokenizer.save_pretrained(other)
    job = AdapterJob(
        "far", number_rows, tmp_path / "far", TrainConfig(num_workers=1), teacher=teacher, teacher_base=str(other)
    )
    with pytest.raises(ConfigError, match=f"teacher's base {other} has another than {tiny_model}"):
        train_lora_many(tiny_model, [job], storage_path=tmp_path / "runs", run_name="far")
    assert not (tmp_path / "far").exists() and not (tmp_path / "runs").exists()
