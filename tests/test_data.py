"""Tokenization, packing and input validation of the trainer's data path (real tiny tokenizer and model)."""

import json

import numpy as np
import pytest
import torch

from train.data import DROPPED, TRUNCATED, DataError, Tokenize, pack_batch, read_rows

ROWS = [
    {"prompt": "<|user|>\nI give you this sequence of numbers: 182, 818.\n<|assistant|>\n", "completion": "1, 2, 3"},
    {"prompt": "The following are multiple choice questions (with answers).\n\nQ?\nA. x\nB. y\nAnswer:", "completion": " B"},
]


def tokenize(model, rows, max_length=256, too_long="truncate"):
    out = Tokenize(model, max_length, too_long)({"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]})
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


def test_packing_keeps_rows_apart(tiny_model):
    """Each packed row's logits equal the logits of that row run alone.

    transformers builds the block-diagonal mask from position_ids only without a
    KV cache (use_cache=False, as in training).
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    rows = tokenize(tiny_model, ROWS * 3)
    batch = {"input_ids": np.array([np.array(r["input_ids"]) for r in rows], dtype=object),
             "labels": np.array([np.array(r["labels"]) for r in rows], dtype=object)}
    packed = pack_batch(batch, max_length=200, pad_id=0)
    assert packed["input_ids"].shape[0] < len(rows)  # rows really share sequences
    assert packed["real_tokens"] == sum(len(r["input_ids"]) for r in rows)
    with torch.no_grad():
        logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False).logits
        checked = 0
        for b in range(packed["input_ids"].shape[0]):
            starts = (packed["position_ids"][b] == 0).nonzero().flatten().tolist()
            for start in starts:
                ids = packed["input_ids"][b, start:]
                n = int((packed["position_ids"][b, start:] == torch.arange(ids.numel())).cumprod(0).sum())
                if packed["labels"][b, start : start + n].eq(-100).all():
                    continue  # padding tail
                alone = model(input_ids=ids[:n].unsqueeze(0)).logits[0]
                torch.testing.assert_close(logits[b, start : start + n], alone, atol=1e-4, rtol=1e-4)
                checked += 1
    assert checked == len(rows)


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
    with pytest.raises(DataError, match="line 2: invalid JSON"):
        read_rows(path)
