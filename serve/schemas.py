"""Request and response bodies of the HTTP API (the contract in docs/api.md).

`/generate` and `/score` reject unknown fields; the OpenAI-compatible bodies
ignore OpenAI fields they do not support, as OpenAI clients expect. Limits
that depend on the service's configuration (prompts per request, max_tokens
cap, context length) are checked by the deployment, which knows them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from serve.mc_format import LETTERS

Prompt = Annotated[StrictStr, Field(min_length=1)]


SEED_MAX = 2**62  # seed + i must stay a 64-bit integer for the engines' generators


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # Infinity/NaN: 422, never a 500


class GenerateRequest(Strict):
    prompts: list[Prompt] = Field(min_length=1)
    max_tokens: int = Field(16, gt=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=SEED_MAX, description="sampling seed; prompt i uses seed + i")
    stop: list[StrictStr] = Field(default_factory=list, max_length=8)
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
    questions: list[Question] = Field(min_length=1)
    adapter: str | None = None
    truncate: bool = Field(
        False,
        description="a prompt longer than the context is cut from the left (the question's start goes; its end, "
        "the choices and 'Answer:' stay), as lm-evaluation-harness does, instead of answering 422",
    )


class ScoreResult(BaseModel):
    prediction: int
    logprobs: list[float]
    truncated_tokens: int = 0  # prompt tokens cut from the left (`truncate`)


class ScoreResponse(BaseModel):
    results: list[ScoreResult]
    accuracy: float | None = None


# OpenAI-compatible subset ---------------------------------------------------------------------


class CompletionRequest(BaseModel):
    """POST /v1/completions: the fields this service supports; other OpenAI fields are ignored."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: StrictStr
    prompt: Prompt | list[Prompt]
    max_tokens: int = Field(16, gt=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=16)
    stop: StrictStr | list[StrictStr] | None = None
    seed: int | None = Field(None, ge=0, le=SEED_MAX)

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
