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
    ],
    ids=["bf16", "4bit-checkpointing", "fsdp-1gpu"],
)
def test_lora_on_gpu_learns(ray_cluster, tiny_model, toy_rows, tmp_path, cache_dir, overrides):  # noqa: F811
    cfg = TrainConfig(num_workers=1, use_gpu=True, batch_size=32, epochs=4, lr=5e-3, log_every=2, checkpoint_every=16, **overrides)
    metrics = train_lora(tiny_model, toy_rows, tmp_path / "adapter", cfg, cache_dir=cache_dir)
    assert metrics["loss"] < 0.5 * metrics["first_loss"], metrics
    assert metrics["gpu_mem_gib"] > 0


def test_a_4bit_base_counts_as_many_weights_as_bf16(tiny_model):
    """MFU reads count_parameters: packed 4-bit storage must not make the model look 4x smaller."""
    import torch

    from train.model import count_parameters, load_base

    device = torch.device("cuda")
    bf16 = count_parameters(load_base(tiny_model, TrainConfig(use_gpu=True), device))[0]
    four_bit = load_base(tiny_model, TrainConfig(use_gpu=True, quantization="4bit"), device)
    packed = sum(p.numel() for p in four_bit.parameters())
    assert count_parameters(four_bit)[0] == bf16 > packed
