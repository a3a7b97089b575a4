"""vLLM sized for its device (serve/vllm_engine.py engine_args): an H100's step sizes on GPU, not
vLLM's offline defaults, and a host cache that holds every adapter a phase registers. The engine
configs are built by vLLM itself from those arguments (no engine starts)."""

import pytest
from pydantic import ValidationError

from jobs.experiment.config import load_experiment
from jobs.runtime.service import service_settings
from serve.settings import ServiceSettings


def engine_config(tiny_model, settings, on_gpu):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    from serve.vllm_engine import engine_args

    return AsyncEngineArgs(**engine_args(tiny_model, settings, on_gpu)).create_engine_config(
        UsageContext.ENGINE_CONTEXT
    )


def test_on_gpu_a_step_holds_what_vllms_server_gives_an_h100_unless_the_settings_say(tiny_model):
    from serve.vllm_engine import engine_args

    args = engine_args(tiny_model, ServiceSettings(model=tiny_model, max_model_len=1024), on_gpu=True)
    assert (args["max_num_seqs"], args["max_num_batched_tokens"], args["gpu_memory_utilization"]) == (1024, 16384, 0.9)
    assert args["dtype"] == "bfloat16" and "kv_cache_memory_bytes" not in args
    chosen = engine_args(
        tiny_model, ServiceSettings(model=tiny_model, max_num_seqs=256, max_num_batched_tokens=8192), on_gpu=True
    )
    assert (chosen["max_num_seqs"], chosen["max_num_batched_tokens"]) == (256, 8192)


def test_cpu_keeps_vllms_defaults_and_the_adapter_cache_is_what_the_settings_say(tiny_model):
    config = engine_config(tiny_model, ServiceSettings(model=tiny_model, max_cpu_loras=40), on_gpu=False)
    assert config.lora_config.max_cpu_loras == 40 and config.lora_config.max_loras == 4
    assert config.scheduler_config.max_num_seqs == 128  # vLLM's own default, below any H100 sizing
    sized = engine_config(
        tiny_model, ServiceSettings(model=tiny_model, max_num_seqs=64, max_num_batched_tokens=4096), on_gpu=False
    )
    assert (sized.scheduler_config.max_num_seqs, sized.scheduler_config.max_num_batched_tokens) == (64, 4096)


def test_a_phase_caches_every_adapter_it_registers():
    cfg = load_experiment()
    assert service_settings(cfg, "tiny", True, 8, adapters=3).max_cpu_loras == 32
    # the critics' preset scores 30 arm models
    assert service_settings(cfg, "tiny", True, 8, adapters=45).max_cpu_loras == 45
    assert (
        service_settings(load_experiment(overrides=["service.max_num_seqs=512"]), "tiny", False, 8).max_num_seqs == 512
    )


def test_a_cache_smaller_than_a_batch_is_refused_by_name():
    with pytest.raises(ValidationError, match="max_cpu_loras"):
        ServiceSettings(max_loras=8, max_cpu_loras=4)


def test_every_service_field_of_the_experiment_reaches_the_replica_or_is_declared_not_to():
    """A field of the `service` or `evaluate` section that ServiceSettings lacks (a rename on one
    side) is an error naming it, not a field silently dropped on the way to the replica."""
    from jobs.experiment.config import ServiceConfig
    from jobs.runtime.service import PLACEMENT, replica_fields

    cfg = load_experiment()
    settings = service_settings(cfg, "tiny", True, 8)
    assert settings.max_model_len == cfg.service.max_model_len and settings.engine == cfg.evaluate.engine

    class Renamed(ServiceConfig):
        kv_cache_gb: float = 1.0

    with pytest.raises(TypeError, match=r"Renamed fields \['kv_cache_gb'\] are no ServiceSettings field"):
        replica_fields(Renamed(), PLACEMENT)
