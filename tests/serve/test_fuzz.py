"""Hostile input found by a tool: schemathesis drives every route of the HTTP API.

The schema is the service's own OpenAPI document (built from serve/http_api.py and
serve/schemas.py, as `GET /openapi.json` serves it); schemathesis generates bodies that
follow it and bodies that break it (wrong types, missing and unknown fields, out-of-range
and non-finite numbers) and sends them over real HTTP to a real Serve deployment: vLLM
generating, transformers scoring, one registered adapter. Every answer must be below 500,
and the service must still answer afterwards. Bounded: MAX_EXAMPLES per route, no
shrinking deadline, and the module's pytest timeout.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from serve.http_api import build_http_api
from serve.launch import start_service, stop_service
from serve.settings import ServiceSettings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

URL = "http://127.0.0.1:8000/fuzz"
MAX_EXAMPLES = 40
SCHEMA = schemathesis.openapi.from_dict(build_http_api(SimpleNamespace(settings=ServiceSettings())).openapi())


@pytest.fixture(scope="module")
def service(ray_cluster, tiny_model, lora_adapters):
    settings_ = ServiceSettings(model=tiny_model, engine="vllm", scoring="hf", max_model_len=256, kv_cache_gib=0.5)
    start_service(settings_, {"a": lora_adapters["a"]}, name="fuzz", route_prefix="/fuzz", num_cpus=0.5)
    yield URL
    stop_service("fuzz")


@SCHEMA.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_no_input_gets_a_server_error(case, service):
    response = case.call(base_url=service, timeout=120)
    case.validate_response(response, checks=[not_a_server_error])


def test_the_service_still_answers_after_the_fuzzing(service):
    """Runs after the fuzzing (file order): the replica and its engines survived every request."""
    assert requests.get(service + "/health", timeout=60).status_code == 200
    body = {"prompts": ["1, 2, 3,"], "max_tokens": 4, "seed": 0, "adapter": "a"}
    assert requests.post(service + "/generate", json=body, timeout=120).status_code == 200
