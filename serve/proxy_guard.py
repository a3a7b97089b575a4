"""A body limit in Serve's HTTP proxy, where a chunked body is otherwise read whole.

The service refuses a body over `max_body_bytes` while reading it (serve/http_api.py), but in
Ray Serve 2.60 the bytes do not wait to be read: the proxy reads a request's body from the client
into an unbounded queue, and the replica fetches that queue in a loop until the client is done
(ray/serve/_private/http_util.py, `ASGIReceiveProxy.fetch_until_disconnect`). A chunked body
(no Content-Length to refuse first) therefore reaches the replica's memory as fast as the client
sends it, 413 or not (measured: docs/operations.md, section 6).

`middlewares()` is the hook Serve calls for the proxy's own middlewares
(`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve.proxy_guard.middlewares`, in the environment that
starts Ray): `BodyLimit` answers 413 as soon as a body passes `SERVE_PROXY_MAX_BODY_BYTES` (default
8 MiB, the service's own default `max_body_bytes`) and ends the request, so neither the proxy nor
the replica holds more than that of it. Each refusal is counted in `subliminal_serve_proxy_refused`.
`python -m serve.run` installs the guard in the Ray it starts, at the config's `max_body_bytes`.
"""

from __future__ import annotations

import json
import os

PROXY_LIMIT_ENV = "SERVE_PROXY_MAX_BODY_BYTES"
CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
CALLBACK = "serve.proxy_guard.middlewares"
DEFAULT_LIMIT = 8 << 20
REFUSED_METRIC = "subliminal_serve_proxy_refused"  # a counter, in the proxy's metrics
# set on every request the guard passes on (a client's own is dropped): the replica can tell
MARK = b"x-subliminal-proxy-guard"


class BodyLimit:
    """Pure ASGI middleware: a request whose body passes `limit` bytes gets a 413, and the app
    behind it (Serve's routing to the replica) sees the client disconnect instead of more bytes."""

    def __init__(self, app, limit: int = DEFAULT_LIMIT):
        from ray.util import metrics

        self.app, self.limit = app, limit
        self.refused = metrics.Counter(
            REFUSED_METRIC, f"request bodies cut at the proxy's {PROXY_LIMIT_ENV} (answered 413)"
        )

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(scope, send)
        marked = [(k, v) for k, v in scope.get("headers") or [] if k.lower() != MARK] + [
            (MARK, str(self.limit).encode())
        ]
        scope = {**scope, "headers": marked}
        seen, refused, started = 0, False, False

        async def limited_receive():
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refused = True
                    if not started:
                        await self._refuse(scope, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            nonlocal started
            if refused and not started:
                return  # this request was answered here; the app's own answer has no client
            started = True
            await send(message)

        await self.app(scope, limited_receive, guarded_send)

    async def _refuse(self, scope, send) -> None:
        """413 in the shape the route's clients read: OpenAI's under /v1/, FastAPI's elsewhere."""
        self.refused.inc()  # the replica never sees this request: its own counters do not
        message = f"request body over {self.limit} bytes (the proxy's {PROXY_LIMIT_ENV})"
        openai = "/v1/" in scope.get("path", "")
        answer = (
            {"error": {"message": message, "type": "RequestTooLargeError", "param": None, "code": 413}}
            if openai
            else {"detail": message}
        )
        body = json.dumps(answer).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def middlewares() -> list:
    """Serve's proxy callback: the proxy's middlewares, the body limit from $SERVE_PROXY_MAX_BODY_BYTES."""
    from starlette.middleware import Middleware

    return [Middleware(BodyLimit, limit=configured_limit())]


def configured_limit() -> int:
    """The proxy's body limit in bytes: $SERVE_PROXY_MAX_BODY_BYTES, else DEFAULT_LIMIT."""
    raw = os.environ.get(PROXY_LIMIT_ENV, "").strip()
    if raw and not raw.isdigit():
        raise ValueError(f"{PROXY_LIMIT_ENV}={raw!r} is not a number of bytes")
    return int(raw) if raw else DEFAULT_LIMIT
