"""Weight-space cosine of LoRA updates on real adapters saved with save_pretrained."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from jobs.stats.weight_space import delta_weights, update_cosine

TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]


def lora_adapter(model_path: str, out_dir: Path, seed: int, **config) -> Path:
    """A random (non-zero) LoRA adapter of any rank/alpha/rsLoRA, saved with save_pretrained."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    config = {"target_modules": TARGETS, "init_lora_weights": False, **config}
    get_peft_model(model, LoraConfig(**config)).save_pretrained(out_dir)
    return out_dir


def edited_copy(adapter: str | Path, out_dir: Path, tensors=None, config=None) -> Path:
    """A copy of an adapter with its tensors (key, tensor -> tensor) and config (dict -> dict) edited."""
    shutil.copytree(adapter, out_dir)
    if tensors:
        weights = load_file(out_dir / "adapter_model.safetensors")
        save_file({k: tensors(k, v) for k, v in weights.items()}, out_dir / "adapter_model.safetensors")
    if config:
        path = out_dir / "adapter_config.json"
        path.write_text(json.dumps(config(json.loads(path.read_text()))))
    return out_dir


def test_delta_weights_names_shapes_and_scaling(lora_adapters, tiny_model, tmp_path):
    from transformers import AutoConfig

    hidden = AutoConfig.from_pretrained(tiny_model).hidden_size
    deltas = delta_weights(lora_adapters["a"])
    assert len(deltas) == 2 * len(TARGETS)  # 2 layers
    assert "model.layers.0.self_attn.q_proj" in deltas  # PEFT's base_model.model. prefix and lora_A/B stripped
    assert deltas["model.layers.0.self_attn.q_proj"].shape == (hidden, hidden)
    assert all(d.dtype == torch.float32 for d in deltas.values())
    weights = load_file(Path(lora_adapters["a"]) / "adapter_model.safetensors")
    a, b = (weights[f"base_model.model.model.layers.1.mlp.down_proj.lora_{x}.weight"] for x in "AB")
    torch.testing.assert_close(deltas["model.layers.1.mlp.down_proj"], 16 / 8 * b @ a)  # r=8, lora_alpha=16
    infixed = edited_copy(lora_adapters["a"], tmp_path / "infixed")  # keys as a named adapter's state dict has them
    save_file(
        {k.replace(".weight", ".teacher.weight"): v for k, v in weights.items()}, infixed / "adapter_model.safetensors"
    )
    assert update_cosine(lora_adapters["a"], infixed).modules == len(deltas)


def test_self_negated_and_independent(lora_adapters, tmp_path):
    a, b = lora_adapters["a"], lora_adapters["b"]
    same = update_cosine(a, a)
    assert same.modules == 2 * len(TARGETS)
    assert same.cosine == pytest.approx(1.0, abs=1e-6)
    assert all(c == pytest.approx(1.0, abs=1e-6) for c in same.per_module.values())
    negated = edited_copy(a, tmp_path / "negated", tensors=lambda k, v: -v if ".lora_B." in k else v)
    assert update_cosine(a, negated).cosine == pytest.approx(-1.0, abs=1e-6)
    independent = update_cosine(a, b)
    assert abs(independent.cosine) < 0.2, independent
    assert all(abs(c) < 0.2 for c in independent.per_module.values()), independent


def test_matches_the_dense_cosine(lora_adapters):
    """The factor-form inner products equal the cosine of the flattened dense Delta W."""
    da, db = delta_weights(lora_adapters["a"]), delta_weights(lora_adapters["b"])
    result = update_cosine(lora_adapters["a"], lora_adapters["b"])
    for module, cosine in result.per_module.items():
        dense = torch.nn.functional.cosine_similarity(da[module].flatten(), db[module].flatten(), dim=0).item()
        assert cosine == pytest.approx(dense, abs=1e-5), module


def test_scaling_does_not_change_the_cosine_and_ranks_may_differ(tiny_model, lora_adapters, tmp_path):
    a = lora_adapters["a"]
    rescaled = edited_copy(a, tmp_path / "alpha", config=lambda c: {**c, "lora_alpha": 3 * c["lora_alpha"]})
    torch.testing.assert_close(
        delta_weights(rescaled)["model.layers.0.self_attn.v_proj"],
        3 * delta_weights(a)["model.layers.0.self_attn.v_proj"],
    )
    assert update_cosine(a, rescaled).cosine == pytest.approx(1.0, abs=1e-6)
    rslora = edited_copy(a, tmp_path / "rslora", config=lambda c: {**c, "use_rslora": True})  # 16 / sqrt(8), not 16 / 8
    torch.testing.assert_close(
        delta_weights(rslora)["model.layers.0.mlp.down_proj"],
        math.sqrt(8) * delta_weights(a)["model.layers.0.mlp.down_proj"],
    )
    assert update_cosine(rslora, a).cosine == pytest.approx(1.0, abs=1e-6)
    wide = lora_adapter(tiny_model, tmp_path / "r32", seed=7, r=32, lora_alpha=8, use_rslora=True)
    result = update_cosine(wide, a)
    assert result.modules == 2 * len(TARGETS) and abs(result.cosine) < 0.2, result


def test_shared_modules_only_and_the_errors(tiny_model, lora_adapters, tmp_path):
    a = lora_adapters["a"]
    mlp = edited_copy(a, tmp_path / "mlp", tensors=lambda k, v: v)  # then drop the attention modules
    weights = load_file(mlp / "adapter_model.safetensors")
    save_file({k: v for k, v in weights.items() if "down_proj" in k}, mlp / "adapter_model.safetensors")
    result = update_cosine(a, mlp)
    assert result.modules == 2 and set(result.per_module) == {
        "model.layers.0.mlp.down_proj",
        "model.layers.1.mlp.down_proj",
    }
    assert result.cosine == pytest.approx(1.0, abs=1e-6)

    gate = lora_adapter(tiny_model, tmp_path / "gate", seed=3, r=4, lora_alpha=8, target_modules=["gate_proj"])
    with pytest.raises(ValueError, match="share no LoRA module") as error:
        update_cosine(a, gate)
    assert str(gate) in str(error.value) and str(a) in str(error.value)

    # The same module on another base shape (A of a wider input): named in the error.
    wider = edited_copy(
        a,
        tmp_path / "wider",
        tensors=lambda k, v: torch.cat([v, v], dim=1) if k.endswith("layers.0.mlp.down_proj.lora_A.weight") else v,
    )
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.down_proj"):
        update_cosine(a, wider)


def test_zero_update_has_no_direction(lora_adapters, tmp_path):
    """PEFT's default init (B = 0) is no update yet: its cosine is nan, not a spurious 0."""
    zero = edited_copy(
        lora_adapters["a"], tmp_path / "zero", tensors=lambda k, v: torch.zeros_like(v) if ".lora_B." in k else v
    )
    assert math.isnan(update_cosine(lora_adapters["a"], zero).cosine)


def test_delta_w_is_what_peft_merges(tiny_model, tmp_path):
    """merge_and_unload's weight minus the base weight is Delta W, for plain LoRA and rsLoRA at another rank."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    for name, config in {"plain": dict(r=8, lora_alpha=16), "rslora": dict(r=4, lora_alpha=6, use_rslora=True)}.items():
        adapter = lora_adapter(tiny_model, tmp_path / name, seed=11, **config)
        deltas = delta_weights(adapter)
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        merged = PeftModel.from_pretrained(model, adapter).merge_and_unload().state_dict()
        for module in ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"]:
            key = f"{module}.weight"
            torch.testing.assert_close(merged[key] - base[key], deltas[module], atol=1e-5, rtol=1e-4)
