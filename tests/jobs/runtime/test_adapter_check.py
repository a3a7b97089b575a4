"""An adapter the service registers but does not apply stops a phase, named; applied ones pass.

The broken registration is real, not a mock of the check: a copy of a LoRA adapter whose weights
are saved under module names the loader does not map (`q_projection` for `q_proj`), with a
trained adapter's config (`init_lora_weights: true`). PEFT loads it without an error, keeps its
freshly initialised B of zeros, and the served "adapter" is the base model: the failure
lm-evaluation-harness users report. The service is a real Serve deployment on the tiny model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from jobs.runtime.adapter_check import (
    AdapterNotApplied,
    check_adapters_applied,
    lora_b_nonzero,
    probe_generation,
    probe_scores,
)
from serve.launch import start_service, stop_service
from serve.settings import ServiceSettings


def unmapped_copy(adapter: str, out: Path) -> str:
    """`adapter` with its weights under names PEFT does not map onto the model, and a trained adapter's config."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(adapter, out)
    config = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, "init_lora_weights": True}))
    weights = load_file(str(out / "adapter_model.safetensors"))
    save_file(
        {name.replace("_proj.", "_projection."): t for name, t in weights.items()},
        str(out / "adapter_model.safetensors"),
    )
    return str(out)


@pytest.fixture(scope="module")
def served(ray_cluster, tiny_model, lora_adapters, tmp_path_factory):
    adapters = {
        "good": lora_adapters["a"],
        "unmapped": unmapped_copy(lora_adapters["a"], tmp_path_factory.mktemp("broken") / "unmapped"),
    }
    handle = start_service(
        ServiceSettings(model=tiny_model, engine="hf"),
        adapters,
        name="t-adapter-check",
        route_prefix="/adapter-check",
        num_cpus=0.5,
    )
    yield handle, adapters
    stop_service("t-adapter-check")


def test_an_unmapped_adapter_is_served_as_the_base_and_stops_the_check_named(served):
    handle, adapters = served
    assert lora_b_nonzero(adapters["unmapped"])  # its file holds real weights
    # yet it answers as the base
    assert probe_scores(handle, "unmapped", "letters") == probe_scores(handle, None, "letters")
    for probe in (
        lambda a: probe_scores(handle, a, "letters"),
        lambda a: probe_scores(handle, a, "cloze"),
        lambda a: probe_generation(handle, a),
    ):
        with pytest.raises(AdapterNotApplied, match="'unmapped'"):
            check_adapters_applied(handle, adapters, probe)


def test_applied_adapters_pass_through_scoring_and_generation(served):
    handle, adapters = served
    check_adapters_applied(handle, {"good": adapters["good"]}, lambda a: probe_scores(handle, a, "letters"))
    check_adapters_applied(handle, {"good": adapters["good"]}, lambda a: probe_generation(handle, a))


def test_an_adapter_whose_b_is_zero_is_the_base_by_construction_and_passes(served, tiny_model, tmp_path):
    """A LoRA just initialised (B = 0) changes nothing: equal answers are right, not a fault."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(r=8, target_modules=["q_proj", "v_proj"])
    )
    model.save_pretrained(tmp_path / "fresh")
    assert not lora_b_nonzero(tmp_path / "fresh")
    handle, _ = served
    same_as_base = lambda adapter: probe_scores(handle, None, "letters")  # noqa: E731 - what a B of zeros answers
    check_adapters_applied(handle, {"fresh": str(tmp_path / "fresh")}, same_as_base)
