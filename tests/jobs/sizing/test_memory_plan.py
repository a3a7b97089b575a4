"""The memory arithmetic behind the GPU presets, checked where it can be checked on a CPU:
parameter and LoRA counts against a real saved model and PEFT, and against the published
sizes of the presets' models."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from jobs.experiment.config import load_experiment
from jobs.sizing.memory_plan import KNOWN_SHAPES, Shape, engine_gib, training_gib

ROOT = Path(__file__).resolve().parents[3]


def test_counts_match_a_real_model_and_peft(tiny_model):
    import torch
    from transformers import AutoConfig

    from train.model import load_lora_model

    train = load_experiment().teacher
    shape = Shape.from_config(AutoConfig.from_pretrained(tiny_model).to_dict())
    model = load_lora_model(tiny_model, train, torch.device("cpu"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == shape.lora_params(train.lora_rank, train.lora_targets)
    assert sum(p.numel() for p in model.parameters()) - trainable == shape.params()
    q_only = replace(train, lora_targets=["q_proj"])
    assert shape.lora_params(8, ["q_proj"]) == sum(p.numel() for p in load_lora_model(tiny_model, q_only, torch.device("cpu")).parameters() if p.requires_grad)


def test_published_sizes_of_the_presets_models():
    assert Shape.from_config(KNOWN_SHAPES["meta-llama/Llama-3.1-8B-Instruct"]).params() == 8_030_261_248
    seventy = Shape.from_config(KNOWN_SHAPES["meta-llama/Llama-3.1-70B-Instruct"])
    assert seventy.params() == 70_553_706_496
    assert seventy.kv_bytes_per_token() == 320 * 1024  # 80 layers x 8 KV heads x 128 x (K, V) x bf16


def test_seventy_b_needs_sharding_or_quantisation_and_tensor_parallel_serving():
    cfg = load_experiment(ROOT / "configs" / "llama-70b-qlora.yaml")
    shape = Shape.from_config(KNOWN_SHAPES[cfg.model.path])
    assert training_gib(shape, cfg.teacher, 8)["total"] < 80
    bf16_one_gpu = replace(cfg.teacher, quantization="none", strategy="ddp")
    assert training_gib(shape, bf16_one_gpu, 1)["weights"] > 130  # 70B in bf16 fits no single GPU
    bf16_fsdp = training_gib(shape, replace(cfg.teacher, quantization="none", strategy="fsdp"), 8)
    assert bf16_fsdp["total"] < 80 < bf16_fsdp["load peak"]  # sharded it would fit; loading whole per GPU does not
    assert engine_gib(shape, 1, 80, 0.9)["kv tokens"] == 0  # one GPU cannot even hold the weights
    assert engine_gib(shape, 4, 80, 0.9)["kv tokens"] > 100_000


@pytest.mark.parametrize("preset", ["llama-8b", "llama-70b-qlora"])
def test_cli_prints_a_fitting_plan(preset):
    done = subprocess.run([sys.executable, "-m", "jobs.sizing.memory_plan", "--config", f"configs/{preset}.yaml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(": fits in 80") == 2 and "tokens per replica" in done.stdout
