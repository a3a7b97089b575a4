"""Request and response bodies of the HTTP API (the contract in docs/api.md).

`/generate` and `/score` reject unknown fields; so do the OpenAI-compatible
bodies, which also refuse the OpenAI fields that would change the answer but
are not implemented (unless they hold their neutral value). Every list has a
ceiling here (`LIST_MAX`, shown in the OpenAPI document), so a body of two
million prompts is refused while it is validated, before any tokenizing; limits
that depend on the service's configuration (prompts per request, max_tokens
cap, context length, work) are checked by the deployment, which knows them,
also before it tokenizes.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from serve.mc_format import LETTERS

Prompt = Annotated[StrictStr, Field(min_length=1)]
# Not empty (it would stop everywhere; vLLM refuses it) and bounded: each is copied into every
# engine request of a call (up to 1,024), so an 8 MB one would cost gigabytes.
STOP_MAX_CHARS = 1024
StopString = Annotated[StrictStr, Field(min_length=1, max_length=STOP_MAX_CHARS)]


LIST_MAX = 65536  # any list in a request body; the settings' per-request limits are at most this
SEED_MAX = 2**62  # seed + i must stay a 64-bit integer for the engines' generators


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # Infinity/NaN: 422, never a 500


class GenerateRequest(Strict):
    prompts: list[Prompt] = Field(min_length=1, max_length=LIST_MAX)
    max_tokens: int = Field(16, gt=0)
    temperature: float = Field(1.0, ge=0, le=2)  # as OpenAI; vLLM refuses more
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=SEED_MAX, description="sampling seed; prompt i uses seed + i")
    stop: list[StopString] = Field(default_factory=list, max_length=8)
    adapter: str | None = Field(None, description="registered adapter name; none = the base model")


class CompletionOut(BaseModel):
    text: str
    finish_reason: str
    completion_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class GenerateResponse(BaseModel):
    completions: list[CompletionOut]
    usage: Usage


class Question(Strict):
    question: StrictStr = Field(min_length=1)
    choices: list[StrictStr] = Field(min_length=2, max_length=len(LETTERS))
    answer: int | None = Field(None, description="0-based index of the correct choice")
    subject: str | None = Field(None, description="bio, chem, cyber, or a subject named as is")

    @model_validator(mode="after")
    def _answer_is_a_choice(self):
        if self.answer is not None and not 0 <= self.answer < len(self.choices):
            raise ValueError(f"answer {self.answer} is not a choice index (0..{len(self.choices) - 1})")
        return self


class ScoreRequest(Strict):
    questions: list[Question] = Field(min_length=1, max_length=LIST_MAX)
    adapter: str | None = None
    truncate: bool = Field(
        False,
        description="a prompt longer than the context is cut from the left (the question's start goes; its end, "
        "the choices and 'Answer:' stay), as lm-evaluation-harness does, instead of answering 422",
    )
    format: Literal["letters", "cloze", "continuation"] = Field(
        "letters",
        description="letters: the WMDP prompt with lettered choices, each letter scored (lm-eval's WMDP task); cloze: the "
        "question alone, each choice's text scored as its continuation (lm-eval's ARC way; no choice order enters the prompt); "
        "continuation: as cloze, after the question's text exactly as given (no header, no 'Answer:'), for statements to complete",
    )


class ScoreResult(BaseModel):
    prediction: int
    logprobs: list[float]
    truncated_tokens: int = 0  # prompt tokens cut from the left (`truncate`)


class ScoreResponse(BaseModel):
    results: list[ScoreResult]
    accuracy: float | None = None


# OpenAI-compatible subset ---------------------------------------------------------------------


LOGPROBS_MAX = 20  # alternatives per token at most: vLLM's default max_logprobs (OpenAI's completions take 5)
TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1, max_length=LIST_MAX)]


ECHO_MAX = 64  # characters of a refused value an error repeats


def shown(value) -> str:
    """A refused value as an error repeats it: whole when short, else its type and size (never a
    whole megabyte back; an integer has no length, so its digits are counted)."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4,300-digit limit on conversion to text
        return f"{type(value).__name__} of more than 4300 digits"
    if len(text) <= ECHO_MAX:
        return text
    return (
        f"{type(value).__name__} of {len(value)}"
        if hasattr(value, "__len__")
        else f"{type(value).__name__} of {len(text)} digits"
    )


def neutral(value, default, field: str, why: str):
    """An OpenAI field this service does not implement: taken at its neutral value, refused otherwise."""
    if value is not None and value != default:
        raise ValueError(f"{field}={shown(value)} is not supported ({why}); leave it out or send {json.dumps(default)}")
    return value


class OpenAIRequest(BaseModel):
    """What /v1/completions and /v1/chat/completions share. Unknown fields are refused, and OpenAI
    fields that would change the answer but are not implemented are refused unless they hold their
    neutral value: a field that changes the answer is never silently dropped."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: StrictStr
    temperature: float = Field(1.0, ge=0, le=2)  # as OpenAI; vLLM refuses more
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=16)
    stop: StopString | Annotated[list[StopString], Field(max_length=8)] | None = None
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    user: str | None = Field(None, description="accepted and unused")
    stream: bool | None = Field(False, description="false only: the answer comes whole")
    stream_options: dict | None = Field(None, description="null only")
    frequency_penalty: float | None = Field(None, description="0 or null only")
    presence_penalty: float | None = Field(None, description="0 or null only")
    logit_bias: dict[str, float] | None = Field(None, description="{} or null only")

    @field_validator("stream")
    @classmethod
    def _whole(cls, value):
        return neutral(value, False, "stream", "the answer comes whole")

    @field_validator("stream_options")
    @classmethod
    def _no_stream_options(cls, value):
        return neutral(value, None, "stream_options", "there is no stream")

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, value, info: ValidationInfo):
        return neutral(value, 0, info.field_name, "no penalties are implemented")

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value):
        return neutral(value, {}, "logit_bias", "no logit bias is implemented")

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(OpenAIRequest):
    """POST /v1/completions, as vLLM's OpenAI server takes it: text or token-id prompts, `echo`, `logprobs`."""

    prompt: (
        Prompt
        | Annotated[list[Prompt], Field(min_length=1, max_length=LIST_MAX)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=LIST_MAX)]
    ) = Field(description="a string, a list of strings, a list of token ids, or a list of token-id lists")
    echo: bool | None = Field(
        False, description="the prompt's text (and, with logprobs, its tokens) before the completion's"
    )
    max_tokens: int = Field(16, ge=0, description="0 only with echo: the prompt alone")
    logprobs: int | None = Field(
        None, ge=0, le=LOGPROBS_MAX, description="per token: its log-probability and the k most likely"
    )
    suffix: str | None = Field(None, description='"" or null only')
    best_of: int | None = Field(None, description="null or n only")

    @field_validator("max_tokens")
    @classmethod
    def _nothing_only_with_echo(cls, value, info: ValidationInfo):
        if value == 0 and not info.data.get("echo"):
            raise ValueError("max_tokens=0 asks for no completion: only with echo (the prompt alone), as vLLM")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value):
        return neutral(value, "", "suffix", "no fill-in-the-middle")

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value, info: ValidationInfo):
        return neutral(
            value, info.data.get("n"), "best_of", "completions are not ranked; n are sampled and all returned"
        )

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a string or a list of token ids."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: StrictStr = Field(
        min_length=1, description="system, user, assistant, ...: what the model's chat template knows"
    )
    content: StrictStr | Annotated[list[TextPart], Field(max_length=LIST_MAX)]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(OpenAIRequest):
    """POST /v1/chat/completions: messages through the model's chat template, then as /v1/completions."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=LIST_MAX)
    max_tokens: int | None = Field(None, gt=0, description="null: up to the context or max_tokens_cap")
    max_completion_tokens: int | None = Field(None, gt=0, description="OpenAI's newer name for max_tokens")
    logprobs: bool | None = Field(False, description="each generated token's log-probability")
    top_logprobs: int | None = Field(
        None, ge=0, le=LOGPROBS_MAX, description="with logprobs: the k most likely tokens at each position"
    )

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_limit(cls, value, info: ValidationInfo):
        other = info.data.get("max_tokens")
        if value is not None and other is not None and value != other:
            raise ValueError(f"max_completion_tokens={value} and max_tokens={other} disagree; send one")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=true")
        return value

    @property
    def new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
