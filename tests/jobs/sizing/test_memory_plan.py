"""The memory arithmetic behind the GPU presets, checked where it can be checked on a CPU:
parameter and LoRA counts against a real saved model and PEFT, and against the published
sizes of the presets' models."""

import subprocess
import sys
from pathlib import Path

import pytest

from jobs.experiment.config import load_experiment
from jobs.sizing.memory_plan import GIB, engine_gib, training_gib
from jobs.sizing.shape import KNOWN_SHAPES, Precision, Shape

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
    q_only = train.replace(lora_targets=["q_proj"])
    assert shape.lora_params(8, ["q_proj"]) == sum(
        p.numel() for p in load_lora_model(tiny_model, q_only, torch.device("cpu")).parameters() if p.requires_grad
    )


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_full_fine_tuning_figures_match_the_tensors_of_a_real_step(tiny_model, optimizer):
    """Weights, gradients and optimizer state of the tiny model fully fine-tuned one step (train.model,
    train.loop's optimizer), byte for byte against the plan at one worker, and sharded by FSDP."""
    import torch
    from transformers import AutoConfig

    from train.model import load_base
    from train.step import make_optimizer

    train = load_experiment().student.replace(method="full", optimizer=optimizer)
    model = load_base(tiny_model, train, torch.device("cpu"))
    ids = torch.tensor([[1, 2, 3, 4]])
    model(input_ids=ids, labels=ids).loss.backward()
    params = [p for p in model.parameters()]
    opt = make_optimizer(params, train, torch.device("cpu"))
    opt.step()
    measured = {
        "weights": sum(p.nbytes for p in params),
        "gradients": sum(p.grad.nbytes for p in params),
        "optimizer": sum(
            t.nbytes for state in opt.state.values() for t in state.values() if torch.is_tensor(t) and t.dim() > 0
        ),
    }
    shape = Shape.from_config(AutoConfig.from_pretrained(tiny_model).to_dict())
    plan = training_gib(shape, train, 1)
    assert {k: round(plan[k] * GIB) for k in measured} == measured
    assert all(p.dtype == torch.float32 and p.requires_grad for p in params)
    sharded = training_gib(shape, train.replace(strategy="fsdp"), 4)
    assert {k: round(sharded[k] * GIB * 4) for k in measured} == measured and sharded["ddp buckets"] == 0
    assert plan["ddp buckets"] * GIB == measured["gradients"]  # DDP's buckets: another float32 copy


def test_a_preset_that_does_not_fit_is_refused_with_what_would():
    full = "arms={full: {numbers: teacher, train: {method: full}}}"
    args = [sys.executable, "-m", "jobs.sizing.memory_plan", "--config", "configs/llama-8b.yaml", "--set", full]

    def plan(*extra):
        return subprocess.run([*args, *extra], cwd=ROOT, capture_output=True, text=True, timeout=120)

    one = plan("--gpus", "1")
    assert one.returncode == 1 and "arms.full would not fit 1 GPU(s)" in one.stderr
    assert (
        "arms.full: 1 x ddp, none, full fine-tuning 8.0B params" in one.stdout
        and "would fit: 4 GPUs under strategy: fsdp" in one.stdout
    )
    eight = plan("--gpus", "8")
    assert eight.returncode == 1 and "would fit: strategy: fsdp over the 8 GPU(s)" in eight.stdout
    sharded = plan("--set", "arms.full.train.strategy=fsdp", "--gpus", "8")
    assert sharded.returncode == 0 and sharded.stdout.count(": fits in 80") == 2


def test_published_sizes_of_the_presets_models():
    assert Shape.from_config(KNOWN_SHAPES["meta-llama/Llama-3.1-8B-Instruct"]).params() == 8_030_261_248
    seventy = Shape.from_config(KNOWN_SHAPES["meta-llama/Llama-3.1-70B-Instruct"])
    assert seventy.params() == 70_553_706_496
    assert seventy.kv_bytes_per_token() == 320 * 1024  # 80 layers x 8 KV heads x 128 x (K, V) x bf16


def test_seventy_b_needs_sharding_or_quantisation_and_tensor_parallel_serving():
    cfg = load_experiment(ROOT / "configs" / "llama-70b-qlora.yaml")
    shape = Shape.from_config(KNOWN_SHAPES[cfg.model.path])
    assert training_gib(shape, cfg.teacher, 8)["total"] < 80
    bf16_one_gpu = cfg.teacher.replace(quantization="none", strategy="ddp")
    assert training_gib(shape, bf16_one_gpu, 1)["weights"] > 130  # 70B in bf16 fits no single GPU
    bf16_fsdp = training_gib(shape, cfg.teacher.replace(quantization="none", strategy="fsdp"), 8)
    assert bf16_fsdp["total"] < 80 < bf16_fsdp["load peak"]  # sharded it would fit; loading whole per GPU does not
    assert engine_gib(shape, 1, 80, 0.9)["kv tokens"] == 0  # one GPU cannot even hold the weights
    assert engine_gib(shape, 4, 80, 0.9)["kv tokens"] > 100_000


def test_stages_are_sized_in_the_dtypes_they_train_in():
    """Activations are counted in each stage's dtypes on its device (test_activation_memory.py measures each
    term per dtype): bf16 over a bf16 base; over a 4-bit base a float32 residual stream (PEFT's upcast
    embeddings and norms) and float32 projection outputs (Linear4bit returns its input's dtype)."""

    def dtypes(train, gpu=True):
        p = Precision.of(train, gpu)
        return p.compute, p.stream, p.linear_out, p.quantized, p.attention

    eight = load_experiment(ROOT / "configs" / "llama-8b.yaml").teacher
    seventy = load_experiment(ROOT / "configs" / "llama-70b-qlora.yaml").teacher
    assert dtypes(eight) == (2, 2, 2, False, "sdpa")  # attention: auto is sized as SDPA, the larger
    assert dtypes(eight.replace(attention="flash_attention_2")) == (2, 2, 2, False, "flash")
    assert dtypes(seventy) == (2, 4, 4, True, "sdpa")
    assert dtypes(eight.replace(method="full")) == (2, 4, 2, False, "sdpa")  # float32 weights under bf16 autocast
    assert dtypes(eight, gpu=False) == (4, 4, 4, False, "sdpa")
    # 70B under checkpointing: each layer's float32 input, RoPE's float32 cos and sin, then the loss's peak
    # (the final norm's float32 input and rsqrt, log-softmax and its two gradients, the labels), over one recomputed layer
    shape = Shape.from_config(KNOWN_SHAPES[load_experiment(ROOT / "configs" / "llama-70b-qlora.yaml").model.path])
    per_token = 80 * 4 * 8192 + 2 * 128 * 4 + (4 * 8192 + 4) + 12 * 128256 + 8
    assert shape.activation_bytes_per_token(Precision.of(seventy), 512, checkpointing=True) == per_token
    assert training_gib(shape, seventy, 8)["activations"] * GIB == seventy.batch_size * seventy.max_length * per_token


@pytest.mark.parametrize("preset", ["llama-8b", "llama-70b-qlora"])
def test_cli_prints_a_fitting_plan(preset):
    done = subprocess.run(
        [sys.executable, "-m", "jobs.sizing.memory_plan", "--config", f"configs/{preset}.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(": fits in 80") == 3 and "tokens per replica" in done.stdout  # teacher, student, control
