"""GPU paths of the trainer (skipped without CUDA): bf16 + SDPA/flash-attn, 4-bit base, checkpointing, FSDP."""

import pytest
from test_trainer import toy_rows  # noqa: F401  (fixture)

from train.config import TrainConfig
from train.trainer import train_lora

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"quantization": "4bit", "gradient_checkpointing": True},
        {"strategy": "fsdp", "gradient_checkpointing": True},
        {"kernels": "liger", "compile": True, "pack_length": 1024},
    ],
    ids=["bf16", "4bit-checkpointing", "fsdp-1gpu", "levers"],
)
def test_lora_on_gpu_learns(ray_cluster, tiny_model, toy_rows, tmp_path, cache_dir, overrides):  # noqa: F811
    cfg = TrainConfig(
        num_workers=1, use_gpu=True, batch_size=32, epochs=4, lr=5e-3, log_every=2, checkpoint_every=16, **overrides
    )
    metrics = train_lora(tiny_model, toy_rows, tmp_path / "adapter", cfg, cache_dir=cache_dir)
    assert metrics.loss < 0.5 * metrics.first_loss, metrics
    assert metrics.gpu_mem_gib > 0 and metrics.device == "cuda"


def test_liger_kernels_replace_the_modules_and_keep_the_loss(tiny_model):
    """kernels: liger on CUDA: Liger's modules in place of the Llama ones, and the loss of a packed
    batch within bf16's rounding of the plain model's (the fused cross-entropy never makes the logits)."""
    import numpy as np
    import torch

    from train.data import pack_batch
    from train.model import attach_lora, load_base
    from train.step import forward_loss

    device = torch.device("cuda")
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, 500, int(n)) for n in rng.integers(20, 60, 6)]
    batch = pack_batch(
        {"input_ids": np.array(rows, dtype=object), "labels": np.array(rows, dtype=object)}, 128, pad_id=0
    )
    batch = {k: v.to(device) for k, v in batch.items()}
    losses = {}
    for kernels in ("none", "liger"):  # plain first: Liger patches transformers' Llama classes for the process
        cfg = TrainConfig(use_gpu=True, kernels=kernels)
        model = attach_lora(load_base(tiny_model, cfg, device), cfg).train()
        with torch.no_grad():
            losses[kernels] = float(forward_loss(model, batch))
    assert type(model.get_base_model().model.norm).__name__ == "LigerRMSNorm"
    assert losses["liger"] == pytest.approx(losses["none"], rel=2e-2)


def test_a_4bit_base_counts_as_many_weights_as_bf16(tiny_model):
    """MFU reads count_parameters: packed 4-bit storage must not make the model look 4x smaller."""
    import torch

    from train.model import count_parameters, load_base

    device = torch.device("cuda")
    bf16 = count_parameters(load_base(tiny_model, TrainConfig(use_gpu=True), device))[0]
    four_bit = load_base(tiny_model, TrainConfig(use_gpu=True, quantization="4bit"), device)
    packed = sum(p.numel() for p in four_bit.parameters())
    assert count_parameters(four_bit)[0] == bf16 > packed


@pytest.mark.parametrize("quantization", ["none", "4bit"], ids=["bf16", "4bit"])
def test_divergence_scores_on_gpu_pick_the_float32_mask(tiny_model, lora_adapters, make_number_rows, quantization):
    """The divergence score (train/divergence.py) on CUDA, as the GPU presets compute it, against float32 on CPU.

    bf16 must pick the same 10% divergence mask as float32 in every row: the mask is what the score
    is for. The score itself is rounded: on one H100 (2026-11-27) the largest gap over 529 tokens was
    0.106 nats, the 99th percentile 0.094. (This test first bounded the gap at 0.1 nats, a guess
    from bf16's 8-bit mantissa; it failed at 0.106 on 2 tokens, and the bound was dropped rather
    than loosened to pass.) A 4-bit base changes the model itself (gaps to 1.2 nats, the same mask
    in 18 of 24 rows there), so there only the positions and the adapter's effect are checked: the
    adapter is disabled and enabled on bitsandbytes layers as on plain ones.
    """
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from train.data import Tokenize
    from train.divergence import row_scores, top_divergent
    from train.teacher_pass import TeacherPass, load_teacher

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = make_number_rows(24, seed=3, completion_lengths=(3, 12))
    tokens = Tokenize(tiny_model, 128, "truncate")(
        {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}
    ).to_pydict()
    pairs = list(zip(tokens["input_ids"], tokens["labels"]))
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    want = row_scores(
        load_teacher(TeacherPass(tiny_model, lora_adapters["a"], TrainConfig()), cpu),
        pairs,
        0,
        tokenizer.eos_token_id,
        cpu,
    )
    cfg = TrainConfig(use_gpu=True, quantization=quantization)
    got = row_scores(
        load_teacher(TeacherPass(tiny_model, lora_adapters["a"], cfg), gpu), pairs, 0, tokenizer.eos_token_id, gpu
    )
    assert [len(g["score"]) for g in got] == [len(w["score"]) for w in want]
    got_all, want_all = np.concatenate([g["score"] for g in got]), np.concatenate([w["score"] for w in want])
    assert np.isfinite(got_all).all() and np.abs(got_all).max() > 0.01  # the adapter moves the scores on the GPU too
    same = [
        set(top_divergent(g["score"], 0.1).tolist()) == set(top_divergent(w["score"], 0.1).tolist())
        for g, w in zip(got, want)
    ]
    gap = np.abs(got_all - want_all)
    print(
        f"divergence {quantization}: max gap {gap.max():.4f}, p99 {np.quantile(gap, 0.99):.4f}, rows with the same 10% mask {sum(same)}/{len(same)}"
    )
    if quantization == "none":
        assert all(same), [i for i, ok in enumerate(same) if not ok]
