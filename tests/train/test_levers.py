"""The trainer's throughput levers on CPU (train/levers.py; measured on a GPU by bench/gpu_check.py
8b_levers): each key is validated, a lever that cannot run here falls back to the plain path and
says so, and each keeps the loss of the plain path (through a real Ray Train run: tests/train/test_trainer.py)."""

import pytest
import torch

from common.config import ConfigError, build
from train.config import TrainConfig
from train.levers import decoder_layers, use_compile, use_kernels
from train.model import attach_lora, load_base
from train.step import forward_loss, make_optimizer

CPU = torch.device("cpu")


def test_pack_length_shorter_than_a_row_is_refused():
    with pytest.raises(ConfigError, match="pack_length=128 is shorter than max_length=256"):
        build(TrainConfig, {"pack_length": 128, "max_length": 256})
    with pytest.raises(ConfigError, match="kernels: expected 'none' or 'liger'"):
        build(TrainConfig, {"kernels": "triton"})


def batch_of(tiny_model, pack_length: int) -> dict:
    """Six real rows of the tiny model's vocabulary packed by the trainer's own pack_batch."""
    import numpy as np

    from train.data import pack_batch

    rng = np.random.default_rng(0)
    rows = [rng.integers(3, 500, int(n)) for n in rng.integers(20, 60, 6)]
    labels = [np.where(np.arange(len(r)) < 5, -100, r) for r in rows]
    return pack_batch(
        {"input_ids": np.array(rows, dtype=object), "labels": np.array(labels, dtype=object)}, pack_length, pad_id=0
    )


def test_liger_on_cpu_falls_back_to_the_plain_modules_and_says_why(tiny_model):
    cfg = TrainConfig(kernels="liger")
    model = load_base(tiny_model, cfg, CPU)  # load_base applies it, printing the line
    assert (
        use_kernels(model, cfg, CPU)
        == "kernels: liger asked for, the plain path runs: they are Triton kernels for CUDA and this worker has no GPU"
    )
    assert type(model.model.norm).__name__ == "LlamaRMSNorm" and type(model.model.layers[0].mlp).__name__ == "LlamaMLP"


def test_compile_keeps_the_loss_gradients_and_weights_names(tiny_model):
    """One optimizer step, eager and compiled (Inductor's CPU kernels), from the same LoRA init."""
    cfg = TrainConfig(compile=True, lora_targets=["q_proj", "v_proj"])
    batch = batch_of(tiny_model, 128)
    results = []
    for compiled in (False, True):
        model = attach_lora(load_base(tiny_model, cfg, CPU), cfg)
        names = [n for n, _ in model.named_parameters()]
        if compiled:
            assert use_compile(model, cfg, CPU) == "compile: torch.compile (Inductor), 2 decoder layers"
        opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg, CPU)
        model.train()
        losses = []
        for _ in range(2):
            loss = forward_loss(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        # compiled in place: saving and resuming read the same names
        assert [n for n, _ in model.named_parameters()] == names
        results.append((losses, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}))
    (eager_losses, eager_weights), (compiled_losses, compiled_weights) = results
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-5)
    for name, weight in eager_weights.items():
        torch.testing.assert_close(compiled_weights[name], weight, atol=1e-5, rtol=1e-4)
    torch._dynamo.reset()


def test_compile_without_a_compiler_runs_eager_and_says_so(tiny_model, monkeypatch):
    import train.levers

    monkeypatch.setattr(train.levers.shutil, "which", lambda _: None)
    model = load_base(tiny_model, TrainConfig(), CPU)
    assert use_compile(model, TrainConfig(compile=True), CPU).startswith(
        "compile asked for, eager runs: Inductor compiles CPU kernels with a C++ compiler"
    )
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(model))


def test_a_longer_pack_length_packs_fewer_rows_with_the_same_loss(tiny_model):
    model = load_base(tiny_model, TrainConfig(), CPU)
    short, long = batch_of(tiny_model, 64), batch_of(tiny_model, 512)
    assert (
        long["input_ids"].shape[0] == 1 < short["input_ids"].shape[0] and long["total_tokens"] < short["total_tokens"]
    )
    with torch.no_grad():
        assert float(forward_loss(model, long)) == pytest.approx(float(forward_loss(model, short)), rel=1e-5)
