"""The request schemas' own refusals (serve/schemas.py), read without a service: what an error repeats."""

from typing import get_args

import pytest
from pydantic import ValidationError

from serve.schemas import ECHO_MAX, ChatCompletionRequest, CompletionRequest


@pytest.mark.parametrize(
    "field, value, shown",
    [
        ("suffix", "x" * 100_000, "suffix=str of 100000"),
        ("logit_bias", {str(i): 1.0 for i in range(5000)}, "logit_bias=dict of 5000"),
        ("stream_options", {"include_usage": True}, "stream_options={'include_usage': True}"),
    ],
)
def test_a_refused_openai_field_is_named_not_echoed_whole(field, value, shown):
    with pytest.raises(ValidationError) as err:
        CompletionRequest(model="m", prompt="p", **{field: value})
    message = err.value.errors()[0]["msg"]
    assert shown in message and "is not supported" in message and len(message) < ECHO_MAX + 200


BODIES = {
    CompletionRequest: {"model": "m", "prompt": "p"},
    ChatCompletionRequest: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
}


def integer_fields(schema) -> list[str]:
    return [
        name
        for name, field in schema.model_fields.items()
        if field.annotation is int or int in get_args(field.annotation)
    ]


@pytest.mark.parametrize("schema", list(BODIES), ids=lambda s: s.__name__)
@pytest.mark.parametrize("value", [10**70, -(10**70), 10**5000], ids=["1e70", "-1e70", "1e5000"])
def test_an_integer_however_large_is_refused_by_name_or_left_to_the_service_cap(schema, value):
    """Every integer field of the OpenAI schemas: a value far past any bound is a validation error
    naming the field (a 422), never a crash (`best_of=10**70` once raised a TypeError: a 500).
    Token counts have no bound in the schema; the service's max_tokens_cap refuses them (422,
    serve/limits.py), so there the schema only has to take the value without failing."""
    fields = integer_fields(schema)
    assert {"n", "seed"} <= set(fields)
    for name in fields:
        body = {**BODIES[schema], name: value}
        if name in ("max_tokens", "max_completion_tokens") and value > 0:
            assert getattr(schema.model_validate(body), name) == value
            continue
        with pytest.raises(ValidationError) as err:
            schema.model_validate(body)
        assert any(error["loc"][:1] == (name,) for error in err.value.errors()), (name, err.value.errors())
        assert len(str(err.value)) < 2_000
