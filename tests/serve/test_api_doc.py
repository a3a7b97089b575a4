"""docs/api.md against the code it documents: the multiple-choice prompt, the routes, the limits'
defaults and the metric names. The contract page must change when any of them does."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from serve.http_api import build_http_api
from serve.mc_format import SUBJECTS, format_mc_prompt
from serve.proxy_guard import REFUSED_METRIC
from serve.settings import ServiceSettings

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "api.md").read_text()


def section(title: str) -> str:
    """The text of the section whose heading is `title`, up to the next heading of any level."""
    start = DOC.index(f"{title}\n")
    end = DOC.find("\n#", start + len(title))
    return DOC[start : end if end != -1 else None]


def test_the_documented_prompt_is_the_one_scored():
    text = section("### The prompt")
    (shown,) = re.findall(r"```\n(.*?)\n```", text, re.S)
    assert shown == format_mc_prompt("Which organ pumps blood?", ["heart", "lung", "liver", "skin"], "bio")
    words = " ".join(text.split())
    assert all(f"`{short}` → `{written}`" in words for short, written in SUBJECTS.items())
    no_subject = format_mc_prompt("q", ["a", "b"]).split("\n")[0]
    assert f"the line is `{no_subject}`" in words


def test_every_route_has_a_section_and_a_curl_example():
    api = build_http_api(SimpleNamespace(settings=ServiceSettings()))
    fastapi_own = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
    routes = {(method, route.path) for route in api.routes if route.path not in fastapi_own for method in route.methods}
    assert {path for _, path in routes} == {
        "/generate",
        "/score",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/adapters",
        "/health",
    }
    for method, path in routes:
        body = section(f"## `{method} {path}`")
        assert f"curl -s localhost:8000{path}" in body, path


@pytest.mark.parametrize(
    "name",
    [
        "max_body_bytes",
        "max_prompts_per_request",
        "max_questions_per_request",
        "max_tokens_cap",
        "max_model_len",
        "max_work_per_request",
        "max_logprobs_per_answer",
    ],
)
def test_documented_limit_defaults_are_the_settings(name):
    row = re.search(rf"^\| `{name}` \| (\d+)", DOC, re.M)
    assert row, f"{name} is not in the limits table"
    assert int(row.group(1)) == ServiceSettings.model_fields[name].default


def test_documented_metrics_are_the_ones_reported():
    source = (ROOT / "serve" / "metrics.py").read_text()
    # the proxy guard's
    reported = set(re.findall(r'metrics\.(?:Counter|Histogram)\(\s*"(\w+)"', source)) | {REFUSED_METRIC}
    documented = set(re.findall(r"^\| `(subliminal_serve_\w+)` \|", DOC, re.M))
    assert reported and documented == reported
