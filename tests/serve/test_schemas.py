"""The request schemas' own refusals (serve/schemas.py), read without a service: what an error repeats."""

import pytest
from pydantic import ValidationError

from serve.schemas import ECHO_MAX, CompletionRequest


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
