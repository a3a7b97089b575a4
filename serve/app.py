"""The inference service: a Ray Serve deployment with a FastAPI ingress.

Start it with `serve run serve/config.yaml` (this module's `build_app` is the
config's import path) or from Python with `serve.launch.start_service`. Routes
(contract in docs/api.md): POST /generate, POST /score, GET /health,
GET /adapters, and the OpenAI-compatible POST /v1/completions, POST /v1/chat/completions
and GET /v1/models.

On vLLM, requests go straight into the engine's continuous batching; on the
transformers engine, `@serve.batch` gathers concurrent small /generate and
/score requests into one call (larger ones, and the OpenAI routes, call the
engine per request). Every API method runs under `request_timeout_s`, and a
request cancelled (its client gone, its time up) cancels its engine work.
Tokenizing and answer building run on a preparation thread, off the event loop
that answers Serve's health checks.
The OpenAI routes' serving is a mixin of its own (serve/openai_serving.py).
Adapters come from the deployment's `user_config` (`{"adapters": {name: path}}`),
which Serve hands to every replica (`reconfigure`), so they are registered
by the operator and never by a request; so do `models`, fully fine-tuned copies
of the base that the transformers engine serves beside it (one process and one
start-up for several models), each addressed by name as an adapter is.
"""

from __future__ import annotations

import logging
import os
import time
import uuid

from fastapi import HTTPException
from ray import serve

from serve.cloze import cloze_lengths, cloze_parts, renormalised
from serve.engine import BatchKey, Sampling
from serve.engine_choice import build_engines
from serve.http_api import build_http_api
from serve.limits import check_count, check_new_tokens, check_room, check_work, invalid, timed
from serve.mc_format import format_cloze_prompt, format_mc_prompt, left_truncate
from serve.metrics import ServiceMetrics
from serve.openai_serving import OpenAIServing
from serve.prep_thread import PrepThread
from serve.proxy_guard import CALLBACK, CALLBACK_ENV, PROXY_LIMIT_ENV, configured_limit
from serve.schemas import GenerateRequest, GenerateResponse, ScoreRequest, ScoreResponse
from serve.settings import (
    ServiceError,
    ServiceSettings,
    api_key_from_env,
    check_open_host,
    check_user_config,
    config_args,
    model_id,
    resolve_model,
)

logger = logging.getLogger("ray.serve")


@serve.deployment(
    max_ongoing_requests=64,  # Serve's default of 5 would cap batches
    max_queued_requests=256,  # beyond this, 503 instead of an ever longer wait
    health_check_period_s=10,
    graceful_shutdown_timeout_s=30,
    graceful_shutdown_wait_loop_s=0.2,  # a replica with nothing in flight stops at once, not after Serve's 2 s loop
)
@serve.ingress()  # the FastAPI app is built per replica, around this instance: __serve_build_asgi_app__
class InferenceService(OpenAIServing):
    """One replica: the engines, the registered adapters, and the API's methods.

    The methods below are what HTTP routes call (serve/http_api.py) and what a
    deployment handle calls directly (the pipeline): `generate`, `score`,
    `completions`, `chat_completions`, `models`, `list_adapters`, `health`.
    """

    def __init__(self, settings: dict, api_key: str | None = None):
        self.settings = ServiceSettings(**settings)
        self.base_id = model_id(self.settings)
        self.engine, self.scorer = build_engines(self.settings)
        self.adapters: dict[str, str] = {}
        # models served beside the base: fully fine-tuned copies of it (the transformers engine)
        self.beside_base: dict[str, str] = {}
        self.api_key = api_key
        if os.environ.get(CALLBACK_ENV) != CALLBACK:
            logger.warning(
                "Serve's proxy body guard is not installed (%s=%s is not in the environment Ray started in): a chunked body reaches "
                "this replica whole before max_body_bytes can refuse it (docs/operations.md, section 6)",
                CALLBACK_ENV,
                CALLBACK,
            )
        elif (guard_limit := configured_limit()) < self.settings.max_body_bytes:
            logger.warning(
                "Serve's proxy body guard cuts bodies at %s=%d bytes, below this service's max_body_bytes %d: bodies between the two "
                "are refused at the proxy (set it where Ray starts; python -m serve.run sets it from the config)",
                PROXY_LIMIT_ENV,
                guard_limit,
                self.settings.max_body_bytes,
            )
        self.metrics = ServiceMetrics()
        self.started = int(time.time())
        self._prep = PrepThread(self.settings.request_timeout_s)

    def __serve_build_asgi_app__(self):
        return build_http_api(self)

    async def reconfigure(self, user_config: dict) -> None:
        """Register the adapters and models named in user_config (and drop those no longer named)."""
        wanted = check_user_config(user_config, self.base_id)
        if wanted.models and not all(engine.kind.serves_full_models_beside_base for engine in self._engines()):
            raise ServiceError(
                f"models {sorted(wanted.models)}: serving models beside the base needs the transformers engine (engine: hf, "
                "scoring: engine); vLLM serves one base model per application"
            )
        await self._register("adapter", self.adapters, wanted.adapters)
        await self._register("model", self.beside_base, wanted.models)
        self.adapters, self.beside_base = wanted.adapters, wanted.models

    async def _register(self, kind: str, held: dict[str, str], wanted: dict[str, str]) -> None:
        """Each engine's `remove_<kind>` for what `held` has and `wanted` lacks, then `add_<kind>` for what is new."""
        for name, path in held.items():
            if wanted.get(name) != path:
                for engine in self._engines():
                    await getattr(engine, f"remove_{kind}")(name)
        for name, path in wanted.items():
            if held.get(name) != path:
                for engine in self._engines():
                    await getattr(engine, f"add_{kind}")(name, path)

    def _engines(self) -> list:
        """The generation engine, and the scoring engine when it is another one."""
        engines = [getattr(self, "engine", None), getattr(self, "scorer", None)]  # None if __init__ failed early
        return [e for i, e in enumerate(engines) if e is not None and e not in engines[:i]]

    async def check_health(self) -> None:
        """Serve calls this periodically: a dead engine, or a preparation job past the request
        deadline (serve/prep_thread.py), fails it and Serve replaces the replica."""
        if hasattr(self, "_prep"):  # absent if __init__ failed early
            self._prep.check()
        for engine in self._engines():
            await engine.check_health()

    def __del__(self):
        """Graceful shutdown: stop the engines (vLLM's engine core is a separate process)."""
        for engine in self._engines():
            engine.shutdown()
        if hasattr(self, "_prep"):
            self._prep.shutdown()

    # Shared by the routes -----------------------------------------------------------------------

    async def _off_loop(self, fn, *args):
        """`fn(*args)` on the replica's preparation thread: tokenizing, formatting and building
        answers (up to max_body_bytes of text) never stall the event loop that answers health
        checks. One thread, so the counting tokenizer (not thread-safe) has one user; a job
        that outlives the request deadline fails the health check."""
        return await self._prep.run(fn, *args)

    def _adapter(self, name: str | None, field: str = "adapter") -> str | None:
        if name is None or name == self.base_id:
            return None
        if name not in self.adapters and name not in self.beside_base:
            shown = name if len(name) <= 64 else name[:64] + "..."
            raise HTTPException(404, f"{field} {shown!r} is not registered (GET /adapters lists those that are)")
        return name

    def _fitted(self, prompts: list[str], new_tokens: int, field: str) -> list[int]:
        """Each prompt's token count, once each fits the context with `new_tokens` more (on the
        preparation thread: it tokenizes)."""
        lengths = self.engine.count_tokens(prompts)
        check_room(self.settings, lengths, new_tokens, lambda i: (field, i))
        return lengths

    async def _generate(self, prompts: list[str], sampling: Sampling, adapter: str | None):
        check_new_tokens(self.settings, sampling.max_tokens)
        check_count(len(prompts), self.settings.max_prompts_per_request, "prompts")
        check_work(
            self.settings,
            await self._off_loop(self._fitted, prompts, sampling.max_tokens, "prompts"),
            sampling.max_tokens,
        )
        if self._gathered(self.engine, prompts):
            # A seeded request is a group of its own: flattened after another, its prompts would take other seeds (seed + i).
            key = BatchKey("generate", sampling, adapter, uuid.uuid4().hex if sampling.seed is not None else None)
            completions = await self._batched(key, prompts)
        else:
            completions = await self.engine.generate(prompts, sampling, adapter)
        self.metrics.tokens(sum(c.prompt_tokens for c in completions), sum(c.completion_tokens for c in completions))
        return completions

    def _gathered(self, engine, items: list) -> bool:
        """Whether a request goes through `_batched`, gathered with others into one engine call: on
        an engine without continuous batching, a request smaller than one of its chunks. A larger
        one fills chunks by itself and calls the engine directly, so that when its client goes away
        or its time runs out, its work stops with it (Serve does not cancel a gathered call; what a
        cancelled small request leaves running is its share of one, under a chunk)."""
        return not engine.continuous_batching and len(items) < self.settings.hf_batch_size

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
    async def _batched(self, keys: list[BatchKey], items: list[list]) -> list[list]:
        """Engines without continuous batching: one engine call per group of requests with one BatchKey."""
        groups: dict[BatchKey, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        results: list[list] = [[] for _ in keys]
        for key, members in groups.items():
            flat = [x for i in members for x in items[i]]
            if key.kind == "score":
                out = await self.scorer.score([p for p, _ in flat], [n for _, n in flat], key.adapter)
            else:
                out = await self.engine.generate(flat, key.sampling, key.adapter)
            for i in members:
                results[i], out = out[: len(items[i])], out[len(items[i]) :]
        return results

    # API methods: each under request_timeout_s (`timed`) ----------------------------------------

    @timed
    async def generate(self, body: GenerateRequest) -> GenerateResponse:
        sampling = Sampling(body.max_tokens, body.temperature, body.top_p, body.seed, tuple(body.stop))
        completions = await self._generate(body.prompts, sampling, self._adapter(body.adapter))
        return GenerateResponse(
            completions=[
                {"text": c.text, "finish_reason": c.finish_reason, "completion_tokens": c.completion_tokens}
                for c in completions
            ],
            usage={
                "prompt_tokens": sum(c.prompt_tokens for c in completions),
                "completion_tokens": sum(c.completion_tokens for c in completions),
            },
        )

    def _score_prompts(self, body: ScoreRequest) -> tuple[list[str], list[int], list[int]]:
        """(prompts, tokens cut from each, each prompt's tokens): formatted, then cut to leave room
        for the one answer token (`truncate`) or checked to fit."""
        prompts = [format_mc_prompt(q.question, q.choices, q.subject) for q in body.questions]
        if not body.truncate:
            return prompts, [0] * len(prompts), self._fitted(prompts, 1, "questions")
        try:
            fitted = [
                left_truncate(self.engine.counting_tokenizer, p, self.settings.max_model_len - 1) for p in prompts
            ]
        except ValueError as error:  # a context too small to hold any of a prompt
            raise invalid(("truncate",), str(error)) from error
        prompts, cut, lengths = (list(column) for column in zip(*fitted))
        return prompts, cut, lengths

    async def _score_cloze(
        self, body: ScoreRequest, adapter: str | None
    ) -> tuple[list[list[float]], list[int], list[int]]:
        """(choice log-probabilities, tokens cut, tokens scored) of every question, each choice's
        text scored as the continuation of the question (serve/cloze.py): of its cloze prompt, or under
        `continuation` of the question's text as given (a statement to complete, no frame)."""
        scorer = self._prompt_scorer(field="format")
        room = self.settings.max_model_len
        if body.format == "continuation":
            prompts = [q.question for q in body.questions]
        else:
            prompts = [format_cloze_prompt(q.question, q.subject) for q in body.questions]
        choices = [q.choices for q in body.questions]
        try:
            prompt_ids, continuations, cut = await self._off_loop(
                cloze_parts, self.engine.counting_tokenizer, prompts, choices, room, body.truncate
            )
        except ValueError as error:  # a choice that leaves no room for any of its question
            raise invalid(("truncate",), str(error)) from error
        lengths = cloze_lengths(prompt_ids, continuations)
        owner = [i for i, q in enumerate(body.questions) for _ in q.choices]  # the question of each sequence
        check_room(self.settings, lengths, 0, lambda i: ("questions", owner[i]))
        check_work(self.settings, lengths, 0)
        sums = await scorer.score_continuations(prompt_ids, continuations, adapter)
        return renormalised(sums, [len(q.choices) for q in body.questions]), cut, lengths

    @timed
    async def score(self, body: ScoreRequest) -> ScoreResponse:
        adapter = self._adapter(body.adapter)
        check_count(len(body.questions), self.settings.max_questions_per_request, "questions")
        if body.format in ("cloze", "continuation"):
            logprobs, cut, lengths = await self._score_cloze(body, adapter)
            return self._score_answer(body, logprobs, cut, lengths)
        for i, q in enumerate(body.questions):
            if len(q.choices) > self.scorer.max_choices:
                raise invalid(
                    ("questions", i, "choices"),
                    f"{len(q.choices)} choices; this model's tokenizer scores at most {self.scorer.max_choices} in one pass",
                )
        prompts, cut, lengths = await self._off_loop(self._score_prompts, body)
        check_work(self.settings, lengths, 1)
        n_choices = [len(q.choices) for q in body.questions]
        if self._gathered(self.scorer, prompts):
            logprobs = await self._batched(BatchKey("score", None, adapter), list(zip(prompts, n_choices)))
        else:
            logprobs = await self.scorer.score(prompts, n_choices, adapter)
        return self._score_answer(body, logprobs, cut, lengths)

    def _score_answer(
        self, body: ScoreRequest, logprobs: list[list[float]], cut: list[int], lengths: list[int]
    ) -> ScoreResponse:
        self.metrics.tokens(sum(lengths), 0)
        predictions = [max(range(len(lp)), key=lp.__getitem__) for lp in logprobs]
        answers = [q.answer for q in body.questions]
        accuracy = None if None in answers else sum(p == a for p, a in zip(predictions, answers)) / len(answers)
        results = [
            {"prediction": p, "logprobs": lp, "truncated_tokens": c} for p, lp, c in zip(predictions, logprobs, cut)
        ]
        return ScoreResponse(results=results, accuracy=accuracy)

    def _prompt_scorer(self, field: str = "echo"):
        """The engine that scores prompts (`scores_prompts`): on CPU by default the transformers one beside vLLM."""
        for engine in (self.scorer, self.engine):
            if engine.scores_prompts:
                return engine
        raise invalid(
            (field,),
            "prompt log-probabilities (echo with logprobs, cloze scoring) need the transformers engine, and this replica has only vLLM, "
            "whose 0.32 release fails on them with LoRA enabled; start the service with scoring: hf",
        )

    async def health(self, detailed: bool = True) -> dict:
        """Healthy (200) or not (503, the reason in the replica's log, not the answer). `detailed`
        (a caller holding the token, or a service without one) adds the model and engines."""
        try:
            await self.check_health()
        except Exception as error:  # noqa: BLE001 - any engine failure means unhealthy
            logger.warning("health check failed: %s", error)
            raise HTTPException(503, "unhealthy") from error
        if not detailed:
            return {"status": "ok"}
        return {
            "status": "ok",
            "model": self.base_id,
            "engine": self.engine.name,
            "scoring": self.scorer.name,
            "device": self.engine.device,
        }

    async def list_adapters(self) -> dict:
        return {"adapters": sorted(self.adapters)}

    async def models(self) -> dict:
        entry = {"object": "model", "created": self.started, "owned_by": "subliminal-ray"}
        data = [{"id": self.base_id, **entry}] + [
            {"id": name, "parent": self.base_id, **entry} for name in sorted(self.adapters)
        ]
        data += [{"id": name, **entry} for name in sorted(self.beside_base)]
        return {"object": "list", "data": data}


def service_app(
    settings: ServiceSettings,
    adapters: dict[str, str] | None = None,
    models: dict[str, str] | None = None,
    **deployment_options,
):
    """The Serve application; the model path is checked here, in the caller, before anything deploys."""
    resolve_model(settings.model)
    user_config = {"adapters": adapters or {}} | ({"models": models} if models else {})
    deployment = InferenceService.options(user_config=user_config, **deployment_options)
    return deployment.bind(settings.model_dump(), api_key_from_env())


def build_app(args: dict):
    """Import path of `serve/config.yaml`: `args` are ServiceSettings fields (and `allow_open_host`);
    adapters are the deployment's user_config. Built in the cluster, where the key is read and the
    proxies' host is known: an open host without a token fails the build (DEPLOY_FAILED, naming
    the setting; `python -m serve.preflight` makes the same check before `serve run`)."""
    fields, allow_open_host = config_args(args)
    settings = ServiceSettings(**fields)
    resolve_model(settings.model)
    api_key = api_key_from_env()
    host = proxy_host()
    if host is not None:
        check_open_host(host, api_key, allow_open_host)
    return InferenceService.bind(settings.model_dump(), api_key)


def proxy_host() -> str | None:
    """The host Serve's proxies bind (the running controller's http_options); None where this process
    has no Ray or its cluster runs no Serve (a unit test building the app). Any other failure to read
    it is raised: the open-host check is never skipped on an error."""
    import ray
    from ray.serve.context import _get_global_client

    if not ray.is_initialized():
        return None
    client = _get_global_client(raise_if_no_controller_running=False)
    return None if client is None else client.http_config.host
