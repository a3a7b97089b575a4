"""The HTTP face of one replica: FastAPI routes over an `InferenceService` instance.

Built per replica (`InferenceService.__serve_build_asgi_app__`), so the
middleware and routes close over that replica's settings, engines and metrics
instead of reaching for process globals. Routes only parse and delegate; the
service's methods hold the logic and are the same ones a deployment handle calls.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from serve.engine import EngineUnavailable
from serve.schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest, GenerateResponse, ScoreRequest, ScoreResponse

OPEN_PATHS = {"/health"}  # answered without the bearer token (load balancers probe it)


def invalid(loc: tuple, msg: str) -> RequestValidationError:
    """A 422 in FastAPI's own shape, for limits only the deployment knows."""
    return RequestValidationError([{"type": "value_error", "loc": ("body", *loc), "msg": msg}])


def token_matches(header: str | None, api_key: str) -> bool:
    """`Authorization: Bearer <api_key>`, compared in constant time: both sides hashed (equal
    lengths whatever was sent), then `hmac.compare_digest`, so timing tells nothing of the key."""
    given = hashlib.sha256((header or "").encode()).digest()
    return hmac.compare_digest(given, hashlib.sha256(f"Bearer {api_key}".encode()).digest())


async def body_within(request: Request, limit: int) -> bytes | None:
    """The request's body, read chunk by chunk; None as soon as it passes `limit` bytes, so a
    chunked body (no Content-Length to check first) is never held whole. A body within the limit
    is kept where Starlette's own `Request.body()` keeps it, and the route reads it from there."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    request._body = b"".join(chunks)
    return request._body


def json_safe(value):
    """`value` with non-finite floats written as text: JSON has no NaN or Infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def build_http_api(service) -> FastAPI:
    api = FastAPI(title="subliminal-ray inference", version="1")
    limit = service.settings.max_body_bytes

    @api.middleware("http")
    async def guard_and_measure(request: Request, call_next):
        """Bearer token, body-size limit and per-route metrics, for every request (also the ones FastAPI rejects)."""
        started, root = time.perf_counter(), request.scope.get("root_path", "")
        path = request.url.path.removeprefix(root) or "/"  # the route, without the app's route prefix
        if service.api_key and path not in OPEN_PATHS and not token_matches(request.headers.get("authorization"), service.api_key):
            response = JSONResponse({"detail": "missing or wrong bearer token (Authorization: Bearer $SERVE_API_KEY)"}, 401)
        elif int(request.headers.get("content-length") or 0) > limit or await body_within(request, limit) is None:
            response = JSONResponse({"detail": f"request body over {limit} bytes (the service's max_body_bytes)"}, 413)
        else:
            response = await call_next(request)
        service.metrics.request(path, response.status_code, time.perf_counter() - started)
        return response

    @api.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError):
        """FastAPI's 422 body; its default handler answers 500 when the echoed input holds NaN."""
        return JSONResponse({"detail": json_safe(jsonable_encoder(error.errors()))}, 422)

    @api.exception_handler(EngineUnavailable)
    async def engine_unavailable(request: Request, error: EngineUnavailable):
        """The engine died under the request: Serve replaces this replica, so the client may retry."""
        return JSONResponse({"detail": f"{error}; the replica is being replaced, retry shortly"}, 503, headers={"Retry-After": "30"})

    @api.post("/generate")
    async def generate(body: GenerateRequest) -> GenerateResponse:
        return await service.generate(body)

    @api.post("/score")
    async def score(body: ScoreRequest) -> ScoreResponse:
        return await service.score(body)

    @api.post("/v1/completions")
    async def completions(body: CompletionRequest) -> dict:
        return await service.completions(body)

    @api.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> dict:
        return await service.chat_completions(body)

    @api.get("/v1/models")
    async def models() -> dict:
        return await service.models()

    @api.get("/adapters")
    async def adapters() -> dict:
        return await service.list_adapters()

    @api.get("/health")
    async def health() -> dict:
        return await service.health()

    return api
