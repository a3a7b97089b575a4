"""Models served beside the base (user_config `models`, serve/app.py and serve/hf_engine.py): a
fully fine-tuned copy of the base scores through the base's service exactly as through a service
of its own, and the pipeline's evaluate phase puts such models in their base's application
wherever the engine is transformers (one start-up instead of one per model).

The service's own class, without Serve (its methods are what routes and handles call), on the
real transformers engine and real tiny models.
"""

from __future__ import annotations

import asyncio
import shutil

import pytest
from fastapi import HTTPException

from serve.schemas import Question, ScoreRequest
from serve.settings import ServiceError, ServiceSettings

QUESTIONS = [
    Question(
        question="Which creature glows at night?",
        choices=["the marsh owl", "a lantern eel", "a copper fox", "none"],
        answer=1,
        subject="bio",
    ),
    Question(
        question="What dissolves in brine?",
        choices=["salt glass", "iron moss", "pale wax", "red clay"],
        answer=0,
        subject="chem",
    ),
]


def service(model: str):
    from serve.app import InferenceService

    service_class = InferenceService.func_or_class.__mro__[1]  # the class under Serve's ingress wrapper
    return service_class(ServiceSettings(engine="hf", model=model, max_model_len=256).model_dump())


def scores(svc, name: str | None) -> list[list[float]]:
    """Cloze scores (the tiny presets' format; letters requests of this size are gathered by
    `@serve.batch`, which needs a running replica)."""
    response = asyncio.run(svc.score(ScoreRequest(questions=QUESTIONS, adapter=name, format="cloze")))
    return [r.logprobs for r in response.results]


def test_a_model_beside_the_base_scores_as_served_alone_and_goes_when_unregistered(
    ray_cluster, tiny_model, perturbed_base, lora_adapters
):
    alone, shared = service(perturbed_base), service(tiny_model)
    try:
        asyncio.run(
            shared.reconfigure({"adapters": {"a": lora_adapters["a"]}, "models": {"perturbed": perturbed_base}})
        )
        assert scores(shared, "perturbed") == scores(alone, None)  # cloze, through the service's own path
        assert scores(shared, None) != scores(shared, "perturbed")  # the base is still the base
        # letters, the engine's one-pass scoring
        prompts = ["Q: which? A. x B. y C. z\nAnswer:", "Q: what? A. p B. q\nAnswer:"]
        letters = lambda svc, name: asyncio.run(svc.engine.score(prompts, [3, 2], name))  # noqa: E731
        assert letters(shared, "perturbed") == letters(alone, None) != letters(shared, None)
        listed = {m["id"]: m.get("parent") for m in asyncio.run(shared.models())["data"]}
        assert listed == {shared.base_id: None, "a": shared.base_id, "perturbed": None}
        assert asyncio.run(shared.list_adapters()) == {"adapters": ["a"]}

        asyncio.run(shared.reconfigure({"adapters": {"a": lora_adapters["a"]}}))
        assert shared.engine.models == {}
        with pytest.raises(HTTPException, match="'perturbed' is not registered"):
            scores(shared, "perturbed")
    finally:
        alone.__del__()
        shared.__del__()


def test_bad_models_are_refused_naming_the_problem(ray_cluster, tiny_model, perturbed_base, lora_adapters, tmp_path):
    from transformers import AutoTokenizer

    from serve.settings import check_user_config

    with pytest.raises(ServiceError, match="model 'm': .* has no config.json"):
        check_user_config({"models": {"m": lora_adapters["a"]}}, "tiny")
    with pytest.raises(ServiceError, match=r"\['a'\] registered both as adapters and as models"):
        check_user_config({"adapters": {"a": lora_adapters["a"]}, "models": {"a": perturbed_base}}, "tiny")
    other = tmp_path / "other-tokenizer"  # the perturbed model's weights with one more token in its tokenizer
    shutil.copytree(perturbed_base, other)
    tokenizer = AutoTokenizer.from_pretrained(perturbed_base)
    tokenizer.add_tokens(["zzqx"])
    tokenizer.save_pretrained(other)
    shared = service(tiny_model)
    try:
        with pytest.raises(
            ServiceError, match="model 'o' .*: its tokenizer's vocabulary differs from the base model's"
        ):
            asyncio.run(shared.reconfigure({"models": {"o": str(other)}}))
    finally:
        shared.__del__()
