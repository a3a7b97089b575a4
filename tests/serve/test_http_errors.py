"""The HTTP layer's last word on a bug (serve/http_api.py): a route whose service method raises
something unexpected answers 500 as JSON, in its route family's shape, without the error's text,
and the 500 is counted like any other status.

A real service cannot be made to fail on demand (that is the point of the guarantee), so the
routes here sit over a service object whose methods raise; the FastAPI app, its middleware and
its handlers are the real ones, driven through Starlette's test client.
"""

from __future__ import annotations

from types import SimpleNamespace

from fastapi.testclient import TestClient

from serve.http_api import build_http_api
from serve.settings import ServiceSettings


class BrokenService:
    settings = ServiceSettings()
    api_key = None

    def __init__(self):
        self.counted = []
        self.metrics = SimpleNamespace(request=lambda path, status, seconds: self.counted.append((path, status)))

    async def generate(self, body):
        raise RuntimeError("secret internals: /srv/model at 0x7f")

    async def completions(self, body):
        raise KeyError("secret internals")


def test_a_bug_is_a_counted_json_500_without_its_text():
    service = BrokenService()
    client = TestClient(build_http_api(service), raise_server_exceptions=False)
    plain = client.post("/generate", json={"prompts": ["hi"]})
    assert plain.status_code == 500 and plain.json()["detail"].startswith("internal error (incident ")
    openai = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
    assert openai.status_code == 500 and openai.json()["error"]["type"] == "InternalServerError"
    assert "secret" not in plain.text + openai.text
    assert service.counted == [("/generate", 500), ("/v1/completions", 500)]
