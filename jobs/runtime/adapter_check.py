"""Before a phase trusts an adapter, the service shows that it applies it.

Evaluation tools keep meeting the same silent failure: an adapter registered but never applied
(weights under names the loader does not map, a config that scales them to nothing), so every
"adapter" scores exactly as its base and a null verdict is a plumbing fault. Here each adapter a
phase serves is probed through the path the phase itself uses (`/score` for evaluation, the
generation engine for the numbers phase) on a few fixed prompts, beside the base model. An
adapter whose answers equal the base's to the last digit while its saved LoRA B weights are not
zero stops the phase with an error naming it. An adapter whose B weights are all zero (a LoRA
just initialised) is the base by construction and passes.
"""

from __future__ import annotations

from pathlib import Path

PROBE_QUESTIONS = [
    {"question": "Which organ pumps blood through the body?", "choices": ["Lungs", "Heart", "Liver", "Kidneys"]},
    {"question": "What is 7 times 8?", "choices": ["54", "56", "58", "64"]},
    {
        "question": "Which gas do plants take in from the air?",
        "choices": ["Oxygen", "Nitrogen", "Carbon dioxide", "Helium"],
    },
    {"question": "What port does HTTPS use by default?", "choices": ["21", "80", "443", "8080"]},
]
PROBE_PROMPTS = ["3, 7, 12, 19,", "The capital of France is", "def add(a, b):\n    return"]


class AdapterNotApplied(RuntimeError):
    """The service answers for an adapter exactly as for the base model, though the adapter's weights are not zero."""


def lora_b_nonzero(folder: str | Path) -> bool:
    """Whether any saved LoRA B matrix of the adapter in `folder` has a non-zero entry (B @ A is the
    adapter's whole change to the base; a fresh LoRA's B is zero)."""
    from safetensors.torch import load_file

    weights = load_file(str(Path(folder) / "adapter_model.safetensors"))
    return any(bool(t.any()) for name, t in weights.items() if "lora_B" in name or "lora_embedding_B" in name)


def probe_scores(handle, adapter: str | None, format: str) -> list[list[float]]:
    """The choice log-probabilities of the probe questions under `adapter` (None: the base), through /score."""
    from serve.schemas import Question, ScoreRequest

    request = ScoreRequest(questions=[Question(**q) for q in PROBE_QUESTIONS], adapter=adapter, format=format)
    return [r.logprobs for r in handle.score.remote(request).result().results]


def probe_generation(handle, adapter: str | None) -> list:
    """The first generated token's top log-probabilities for each probe prompt under `adapter`
    (None: the base), greedy, through the generation engine (/v1/completions' path)."""
    from serve.schemas import CompletionRequest

    model = adapter or handle.models.remote().result()["data"][0]["id"]
    request = CompletionRequest(model=model, prompt=PROBE_PROMPTS, max_tokens=1, temperature=0.0, logprobs=5)
    return [c["logprobs"]["top_logprobs"] for c in handle.completions.remote(request).result()["choices"]]


def check_adapters_applied(handle, adapters: dict[str, str], probe) -> None:
    """Raise AdapterNotApplied naming the first of `adapters` (name -> folder) whose probe answers
    (`probe(adapter)`, None for the base) equal the base's exactly while its LoRA B is not zero."""
    base = probe(None)
    for name, folder in adapters.items():
        if probe(name) == base and lora_b_nonzero(folder):
            raise AdapterNotApplied(
                f"adapter {name!r} ({folder}) answers {len(base)} probe prompts exactly as the base model, though its LoRA B weights are "
                "not zero: the service registered it but does not apply it (weights under names the loader does not map, or scaled "
                "to nothing). Stopping before any result rests on it."
            )
