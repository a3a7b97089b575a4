"""The transformers + PEFT engine: the fallback where vLLM is not installed, and the reference.

Adapters are loaded unmerged into one PeftModel and selected per call
(`set_adapter`, or `disable_adapter()` for the base model), so scores are the
same arithmetic as lm-evaluation-harness's HF backend with `peft=`. All model
work runs on one worker thread: calls are serialised (the active adapter is
model state) and the replica's event loop stays free for health checks.
Batching across requests happens in the deployment (`@serve.batch`); here a
call's prompts go through in chunks of `hf_batch_size`, left-padded, except
seeded ones, which go one by one so that prompt i's sample depends on seed + i
alone (the engines' seed contract, serve/engine.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from serve.engine import Completion, Sampling, cut_at_stop
from serve.hf_scoring import mc_logprobs, scorable_choices
from serve.settings import ServiceSettings

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine:
    name = "hf"
    continuous_batching = False  # one call at a time: the deployment gathers concurrent requests (@serve.batch)

    def __init__(self, model_path: str, settings: ServiceSettings):
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = settings.dtype if settings.dtype != "auto" else ("bfloat16" if self.device == "cuda" else "float32")
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        # Fast tokenizers are not thread-safe (padding state is set per call): the event loop
        # counts prompt tokens with its own instance while the worker thread pads batches.
        self.counting_tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.max_choices = scorable_choices(self.tokenizer)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype]).to(self.device).eval()
        self.peft = None  # the PeftModel wrapping self.model once an adapter is added
        self.batch_size = settings.hf_batch_size
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    # Adapters -------------------------------------------------------------------------------

    async def add_adapter(self, name: str, path: str) -> None:
        await self._run(self._add_adapter, name, path)

    def _add_adapter(self, name: str, path: str) -> None:
        from peft import PeftModel

        if self.peft is None:
            self.peft = PeftModel.from_pretrained(self.model, path, adapter_name=name).eval()
        else:
            self.peft.load_adapter(path, adapter_name=name)

    async def remove_adapter(self, name: str) -> None:
        await self._run(self._remove_adapter, name)

    def _remove_adapter(self, name: str) -> None:
        if list(self.peft.peft_config) == [name]:
            self.model, self.peft = self.peft.unload(), None
        else:
            self.peft.delete_adapter(name)

    def _selected(self, adapter: str | None):
        """The model to call with `adapter` active (a context manager around it)."""
        if adapter is None:
            return self.peft.disable_adapter() if self.peft else contextlib.nullcontext(), (self.peft or self.model)
        self.peft.set_adapter(adapter)
        return contextlib.nullcontext(), self.peft

    # Work -----------------------------------------------------------------------------------

    def count_tokens(self, prompts: list[str]) -> list[int]:
        return [len(ids) for ids in self.counting_tokenizer(prompts, add_special_tokens=True).input_ids]

    async def score(self, prompts: list[str], n_choices: list[int], adapter: str | None) -> list[list[float]]:
        return await self._run(self._score, prompts, n_choices, adapter)

    def _score(self, prompts, n_choices, adapter):
        context, model = self._selected(adapter)
        with context:
            return mc_logprobs(model, self.tokenizer, prompts, n_choices, self.batch_size)

    async def generate(self, prompts: list[str], sampling: Sampling, adapter: str | None) -> list[Completion]:
        return await self._run(self._generate, prompts, sampling, adapter)

    @torch.inference_mode()
    def _generate(self, prompts: list[str], s: Sampling, adapter: str | None) -> list[Completion]:
        sample = {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p, "top_k": 0} if s.temperature > 0 else {"do_sample": False}
        context, model = self._selected(adapter)
        with context:
            if s.seed is None:
                return [
                    c
                    for start in range(0, len(prompts), self.batch_size)
                    for c in self._generate_batch(model, prompts[start : start + self.batch_size], s, sample)
                ]
            # The seed contract: prompt i samples from seed + i whatever else is in the request, as
            # on vLLM. transformers samples a batch from one generator, so seeded prompts go one by one.
            completions = []
            for i, prompt in enumerate(prompts):
                torch.manual_seed(s.seed + i)
                completions += self._generate_batch(model, [prompt], s, sample)
            return completions

    def _generate_batch(self, model, prompts: list[str], s: Sampling, sample: dict) -> list[Completion]:
        eos = self.tokenizer.eos_token_id
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True).to(self.device)
        out = model.generate(**enc, max_new_tokens=s.max_tokens, pad_token_id=self.tokenizer.pad_token_id, eos_token_id=eos, **sample)
        return [self._completion(new, int(mask.sum()), s, eos) for mask, new in zip(enc.attention_mask, out[:, enc.input_ids.shape[1] :].tolist())]

    def _completion(self, new: list[int], prompt_tokens: int, s: Sampling, eos: int) -> Completion:
        ended = eos in new
        ids = new[: new.index(eos)] if ended else new
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = cut_at_stop(text, s.stop)
        if cut is not None:
            text, ended = cut, True
            ids = self.tokenizer(cut, add_special_tokens=False).input_ids
        return Completion(text, "stop" if ended else "length", len(ids), prompt_tokens)

    async def check_health(self) -> None:
        await self._run(lambda: None)  # the worker thread still answers

    def shutdown(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
