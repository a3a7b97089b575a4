"""Service metrics through Ray's metrics API: they show on the Ray dashboard (Metrics tab,
via Prometheus/Grafana) beside Serve's own request metrics."""

from __future__ import annotations

ROUTES = {"/generate", "/score", "/health", "/adapters", "/v1/completions", "/v1/chat/completions", "/v1/models"}
LATENCY_BOUNDS_S = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]


class ServiceMetrics:
    def __init__(self):
        from ray.util import metrics

        self._requests = metrics.Counter(
            "subliminal_serve_requests", "HTTP requests by route and status code", tag_keys=("route", "status")
        )
        self._errors = metrics.Counter(
            "subliminal_serve_errors", "HTTP responses with status >= 400", tag_keys=("route", "status")
        )
        self._latency = metrics.Histogram(
            "subliminal_serve_latency_s", "request latency in seconds", boundaries=LATENCY_BOUNDS_S, tag_keys=("route",)
        )
        self._prompt_tokens = metrics.Counter("subliminal_serve_prompt_tokens", "prompt tokens processed")
        self._completion_tokens = metrics.Counter("subliminal_serve_completion_tokens", "completion tokens generated")

    def request(self, path: str, status: int, seconds: float) -> None:
        route = path if path in ROUTES else "other"  # bounded label values
        tags = {"route": route, "status": str(status)}
        self._requests.inc(tags=tags)
        if status >= 400:
            self._errors.inc(tags=tags)
        self._latency.observe(seconds, tags={"route": route})

    def tokens(self, prompt: int, completion: int) -> None:
        if prompt:
            self._prompt_tokens.inc(prompt)
        if completion:
            self._completion_tokens.inc(completion)
