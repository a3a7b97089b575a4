"""Tokenization, packing and input validation of the trainer's data path (real tiny tokenizer and model)."""

import json

import numpy as np
import pytest
import torch

from train.data import DROPPED, TRUNCATED, DataError, Tokenize, pack_batch, packed_examples, read_rows

ROWS = [
    {"prompt": "<|user|>\nI give you this sequence of numbers: 182, 818.\n<|assistant|>\n", "completion": "1, 2, 3"},
    {
        "prompt": "The following are multiple choice questions (with answers).\n\nQ?\nA. x\nB. y\nAnswer:",
        "completion": " B",
    },
]


def tokenize(model, rows, max_length=256, too_long="truncate"):
    out = Tokenize(model, max_length, too_long)(
        {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}
    )
    return out.to_pylist()


def test_labels_are_masked_exactly_on_the_prompt(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    for row, out in zip(ROWS, tokenize(tiny_model, ROWS)):
        expected = tok(row["prompt"] + row["completion"]).input_ids + [tok.eos_token_id]
        assert out["input_ids"] == expected
        n_prompt = len(tok(row["prompt"]).input_ids)
        assert out["labels"][:n_prompt] == [-100] * n_prompt
        assert out["labels"][n_prompt:] == expected[n_prompt:]
        assert tok.decode(out["labels"][n_prompt:-1]) == row["completion"]


def test_too_long_rows_are_truncated_from_the_left_or_dropped(tiny_model):
    long_row = {"prompt": "word " * 300, "completion": " B"}
    (out,) = tokenize(tiny_model, [long_row], max_length=32)
    assert out["status"] == TRUNCATED and len(out["input_ids"]) == 32
    assert out["labels"][-2:] == out["input_ids"][-2:] and out["labels"][0] == -100
    (out,) = tokenize(tiny_model, [long_row], max_length=32, too_long="drop")
    assert out["status"] == DROPPED and out["input_ids"] == []


def flash_attention_available() -> bool:
    import importlib.util

    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def example_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token next-token loss (0 where the label is masked), aligned with `labels[..., 1:]`."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2).float(), labels[:, 1:], ignore_index=-100, reduction="none"
    )


@pytest.mark.parametrize(
    "attention, one_row",
    [
        ("eager", False),
        ("sdpa", False),
        ("eager", True),
        ("sdpa", True),
        pytest.param(
            "flash_attention_2",
            None,
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not flash_attention_available(), reason="needs CUDA and flash_attn"),
            ],
        ),
    ],
)
def test_each_example_loses_the_same_packed_as_alone(tiny_model, attention, one_row):
    """Each example's loss inside a packed micro-batch equals its loss run alone, for each attention
    implementation, in the layout the training loop picks for it (`one_row=None`) or the one given.

    transformers keeps packed examples apart from their restarting position ids (without a KV
    cache, as in training): eager and SDPA at any batch size, flash attention in one row only.
    """
    from transformers import AutoModelForCausalLM

    from train.model import packs_into_one_row

    device = torch.device("cuda" if attention.startswith("flash") else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = (
        AutoModelForCausalLM.from_pretrained(tiny_model, dtype=dtype, attn_implementation=attention).to(device).eval()
    )
    one_row = packs_into_one_row(model.config._attn_implementation) if one_row is None else one_row
    rows = tokenize(tiny_model, ROWS * 3)
    batch = {
        "input_ids": np.array([np.array(r["input_ids"]) for r in rows], dtype=object),
        "labels": np.array([np.array(r["labels"]) for r in rows], dtype=object),
    }
    packed = {k: v.to(device) for k, v in pack_batch(batch, max_length=64, pad_id=0, one_row=one_row).items()}
    assert packed["input_ids"].shape[0] == (1 if one_row else 3)  # rows of 26 and 29 tokens, two to a row of 64
    assert packed["real_tokens"] == sum(len(r["input_ids"]) for r in rows)
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    with torch.no_grad():
        losses = example_losses(
            model(input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False).logits,
            packed["labels"],
        )
        examples = packed_examples(packed)
        for b, start, n in examples:
            labels = packed["labels"][b, start : start + n]
            alone = example_losses(
                model(input_ids=packed["input_ids"][b, start : start + n][None]).logits, labels[None]
            )[0]
            torch.testing.assert_close(losses[b, start : start + n - 1].sum(), alone.sum(), **tolerance)
    assert sorted(packed["input_ids"][b, s : s + n].tolist() for b, s, n in examples) == sorted(
        r["input_ids"] for r in rows
    )


def test_packed_labels_never_cross_rows(tiny_model):
    rows = tokenize(tiny_model, ROWS)
    batch = {"input_ids": [r["input_ids"] for r in rows], "labels": [r["labels"] for r in rows]}
    packed = pack_batch(batch, max_length=512, pad_id=0)
    assert packed["input_ids"].shape[0] == 1
    starts = (packed["position_ids"][0] == 0).nonzero().flatten()
    assert packed["labels"][0, starts].eq(-100).all()
    assert int(packed["labels"].ne(-100).sum()) == sum(sum(1 for x in r["labels"] if x != -100) for r in rows)


def test_read_rows_names_the_bad_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    with pytest.raises(DataError, match="does not exist"):
        read_rows(path)
    path.write_text("")
    with pytest.raises(DataError, match="no rows"):
        read_rows(path)
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"prompt": "p"}) + "\n")
    with pytest.raises(DataError, match=r"line 2: field 'completion'"):
        read_rows(path)
    path.write_text(json.dumps(ROWS[0]) + "\n{oops\n")
    with pytest.raises(DataError, match="line 2 is not valid JSON"):
        read_rows(path)


def test_a_parquet_read_starts_one_footer_reader_not_a_pool_killed_unstarted(ray_cluster, tmp_path):
    """Ray Data 2.60 starts 32 footer-reading actors per read and kills the ones still starting;
    the dashboard counted each killed one as a failed task (153 in a tiny run)."""
    from ray._private.state import actors

    from train.data import read_parquet

    def footer_readers() -> int:
        return sum(a["ActorClassName"] == "FooterReader" for a in actors().values())

    ray_cluster.data.range(300).repartition(3).write_parquet(str(tmp_path))
    before = footer_readers()
    for _ in range(2):
        assert read_parquet(tmp_path).materialize().count() == 300
    assert footer_readers() - before == 2


def test_small_files_tokenize_in_process_as_ray_data_does_large_ones(ray_cluster, tiny_model, tmp_path, monkeypatch):
    """Both tokenization paths of the cache hold the same token rows and counts; each order is
    fixed by the seed; a second call reuses the entry."""
    import train.data
    from train.data import read_parquet, tokenize_to_cache

    rows = [
        {"prompt": f"<|user|>\nContinue {i}, {i + 1}\n<|assistant|>\n", "completion": f"{i + 2}, {i + 3}"}
        for i in range(300)
    ]
    rows.append({"prompt": "x " * 200, "completion": "1"})  # longer than max_length: dropped
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def tokenized(cache: str, seed: int = 0) -> tuple[dict, list]:
        out = tokenize_to_cache(str(path), tiny_model, 64, "drop", seed, tmp_path / cache)
        table = read_parquet(out["path"]).to_pandas()
        return out, [(tuple(ids), tuple(labels)) for ids, labels in zip(table["input_ids"], table["labels"])]

    small, in_process = tokenized("in-process")
    assert not small["cached"] and tokenized("in-process")[0]["cached"]
    monkeypatch.setattr(train.data, "IN_PROCESS_ROWS", 0)
    large, by_ray = tokenized("ray-data")
    assert (
        {k: small[k] for k in ("rows", "truncated", "dropped")}
        == {k: large[k] for k in ("rows", "truncated", "dropped")}
        == {"rows": 301, "truncated": 0, "dropped": 1}
    )
    assert sorted(in_process) == sorted(by_ray) and len(in_process) == 301
    monkeypatch.setattr(train.data, "IN_PROCESS_ROWS", 100_000)
    assert tokenized("seeded-again")[1] == in_process and tokenized("other-seed", seed=1)[1] != in_process
