"""GPU paths of the trainer (skipped without CUDA): bf16 + SDPA/flash-attn, 4-bit base, checkpointing, FSDP."""

import pytest

from train.config import TrainConfig
from train.trainer import train_lora

from test_trainer import toy_rows  # noqa: F401  (fixture)

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
