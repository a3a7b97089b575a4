"""The HTTP face of one replica: FastAPI routes over an `InferenceService` instance.

Built per replica (`InferenceService.__serve_build_asgi_app__`), so the
middleware and routes close over that replica's settings, engines and metrics
instead of reaching for process globals. Routes only parse and delegate; the
service's methods hold the logic and are the same ones a deployment handle calls.

Errors keep two shapes, one per family of routes: `/generate`, `/score` and the
rest answer FastAPI's `{"detail": ...}` (422 for a bad body); the OpenAI routes
(`/v1/...`) answer OpenAI's `{"error": {message, type, param, code}}` (400 for a bad
body), which OpenAI clients read. Every error, an unexpected one too, is counted
in the route's metrics and answered as JSON; an unexpected one is logged with its
traceback and answered 500 without internals.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from serve.engine import EngineUnavailable, UnknownAdapter
from serve.proxy_guard import MARK
from serve.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    GenerateResponse,
    ScoreRequest,
    ScoreResponse,
)

OPEN_PATHS = {"/health"}  # answered without the bearer token (load balancers probe it)
# The only routes that read a body. Any other request is routed with its body unread: a slow or
# large body sent to /health cannot hold a replica's request slot.
BODY_ROUTES = {"/generate", "/score", "/v1/completions", "/v1/chat/completions"}
OPENAI_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
    504: "TimeoutError",
}
logger = logging.getLogger("ray.serve")


def error_response(
    path: str, status: int, message: str, param: str | None = None, headers: dict | None = None
) -> JSONResponse:
    """An error in the shape its route's clients read: OpenAI's under /v1/ (a body that fails
    validation is a 400 there, as OpenAI's and vLLM's servers answer), FastAPI's elsewhere."""
    if not path.startswith("/v1/"):
        return JSONResponse({"detail": message}, status, headers=headers)
    status = 400 if status == 422 else status
    error = {"message": message, "type": OPENAI_TYPES.get(status, "Error"), "param": param, "code": status}
    return JSONResponse({"error": error}, status, headers=headers)


def route_path(request: Request) -> str:
    """The route, without the app's route prefix."""
    return request.url.path.removeprefix(request.scope.get("root_path", "")) or "/"


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
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
    except ClientDisconnect:  # Serve's proxy cut the body at its own limit (serve/proxy_guard.py), or the client left
        return None
    request._body = b"".join(chunks)
    return request._body


async def body_refusal(request: Request, path: str, limit: int, timeout_s: float) -> JSONResponse | None:
    """None once the body is read whole (kept for the route); else the answer that refuses it:
    400 for a Content-Length that is not a number, 413 past `limit` bytes (declared, or counted
    while reading), 408 when the body is not whole within `timeout_s` (a client trickling bytes
    would otherwise hold the request slot as long as it likes)."""
    declared = request.headers.get("content-length")
    if declared is not None and not declared.strip().isdigit():
        return error_response(path, 400, "Content-Length is not a number of bytes")
    too_large = error_response(path, 413, f"request body over {limit} bytes (the service's max_body_bytes)")
    if declared is not None and int(declared) > limit:
        return too_large
    try:
        body = await asyncio.wait_for(body_within(request, limit), timeout_s)
    except TimeoutError:
        return error_response(
            path,
            408,
            f"request body not received whole within {timeout_s:g} s (the service's body_timeout_s)",
            headers={"Connection": "close"},
        )
    return too_large if body is None else None


def brief(detail: dict) -> dict:
    """A validation error as answered: its `input` echoed only when small (a refused list of two
    million prompts is not sent back, nor encoded)."""
    given = detail.get("input")
    small = (
        not isinstance(given, (list, dict, str, bytes))
        or len(given) <= 64
        or (isinstance(given, str) and len(given) <= 1024)
    )
    return detail if small else {k: v for k, v in detail.items() if k != "input"}


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
    limit, body_timeout_s = service.settings.max_body_bytes, service.settings.body_timeout_s

    @api.middleware("http")
    async def guard_and_measure(request: Request, call_next):
        """Bearer token, body size and deadline (on the routes that read a body), per-route metrics
        and the last word on unexpected errors, for every request (also the ones FastAPI rejects)."""
        started, path = time.perf_counter(), route_path(request)
        reads_body, refused = path in BODY_ROUTES and request.method == "POST", None
        if (
            service.api_key
            and path not in OPEN_PATHS
            and not token_matches(request.headers.get("authorization"), service.api_key)
        ):
            refused = error_response(path, 401, "missing or wrong bearer token (Authorization: Bearer $SERVE_API_KEY)")
        elif reads_body:
            refused = await body_refusal(request, path, limit, body_timeout_s)
        if refused is not None:
            response = refused
        else:
            try:
                response = await call_next(request)
            except Exception:  # noqa: BLE001 - a bug: logged whole, answered without internals
                incident = uuid.uuid4().hex[:12]
                logger.exception("unexpected error on %s (incident %s)", path, incident)
                response = error_response(path, 500, f"internal error (incident {incident} in the replica's log)")
        if not reads_body and (
            "transfer-encoding" in request.headers or request.headers.get("content-length", "0") != "0"
        ):
            # its body was never read: the connection cannot carry another request
            response.headers["Connection"] = "close"
        service.metrics.request(path, response.status_code, time.perf_counter() - started)
        return response

    @api.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError):
        """FastAPI's 422 body (its default handler answers 500 when the echoed input holds NaN); under /v1/, OpenAI's 400."""
        path = route_path(request)
        details = json_safe(jsonable_encoder([brief(d) for d in error.errors()]))
        if not path.startswith("/v1/"):
            return JSONResponse({"detail": details}, 422)
        where = [".".join(map(str, d.get("loc", ())[1:])) for d in details]  # each field's path, "body" dropped
        message = "; ".join(f"{field}: {d.get('msg')}" for field, d in zip(where, details))
        return error_response(path, 400, message, param=where[0] if where else None)

    @api.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        return error_response(route_path(request), error.status_code, str(error.detail), headers=error.headers)

    @api.exception_handler(UnknownAdapter)
    async def adapter_gone(request: Request, error: UnknownAdapter):
        return error_response(
            route_path(request), 404, f"adapter {str(error.args[0])[:64]!r} was removed while the request waited"
        )

    @api.exception_handler(EngineUnavailable)
    async def engine_unavailable(request: Request, error: EngineUnavailable):
        """The engine died under the request: Serve replaces this replica, so the client may retry."""
        logger.warning("engine unavailable: %s", error)
        return error_response(
            route_path(request),
            503,
            "the engine died under this request; the replica is being replaced, retry shortly",
            headers={"Retry-After": "30"},
        )

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
    async def health(request: Request) -> dict:
        """Open to all; the model and engines only to a caller holding the token (or when there is none)."""
        detailed = not service.api_key or token_matches(request.headers.get("authorization"), service.api_key)
        answer = await service.health(detailed=detailed)
        if detailed:  # whether Serve's proxy cut this request's body at a limit (serve/proxy_guard.py), and at which
            mark = request.headers.get(MARK.decode())
            answer["proxy_guard"] = {
                "installed": mark is not None,
                "limit_bytes": int(mark) if mark and mark.isdigit() else None,
            }
        return answer

    return api
