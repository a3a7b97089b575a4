"""The transformers + PEFT engine: the fallback where vLLM is not installed, and the reference.

Adapters are loaded unmerged into one PeftModel and selected per call
(`set_adapter`, or `disable_adapter()` for the base model), so scores are the
same arithmetic as lm-evaluation-harness's HF backend with `peft=`. All model
work runs on one worker thread: calls are serialised (the active adapter is
model state) and the replica's event loop stays free for health checks.
Batching across requests happens in the deployment (`@serve.batch`); here a
call's prompts go through in chunks of `hf_batch_size`, left-padded, seeded ones
too: serve/hf_decode.py samples each row from its own generator, so prompt i's
sample depends on seed + i alone (the engines' seed contract, serve/engine.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from serve.engine import Completion, Sampling, TokenCompletion, TokenLogprob, cut_at_stop
from serve.hf_decode import decode
from serve.hf_scoring import mc_logprobs, scorable_choices
from serve.settings import ServiceSettings

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine:
    name = "hf"
    continuous_batching = False  # one call at a time: the deployment gathers concurrent requests (@serve.batch)
    scores_prompts = True  # complete_tokens takes prompt_logprobs

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

    def _in_batches(self, prompts: list, s: Sampling, run) -> list:
        """`run(batch, seeds)` over the prompts in chunks of hf_batch_size; seeds[j] = seed + i for the
        chunk's j-th prompt, prompt i of the call (None unseeded)."""
        results = []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start : start + self.batch_size]
            results += run(batch, None if s.seed is None else [s.seed + start + j for j in range(len(batch))])
        return results

    @torch.inference_mode()
    def _generate(self, prompts: list[str], s: Sampling, adapter: str | None) -> list[Completion]:
        context, model = self._selected(adapter)
        with context:
            return self._in_batches(prompts, s, lambda batch, seeds: self._generate_batch(model, batch, s, seeds))

    def _generate_batch(self, model, prompts: list[str], s: Sampling, seeds: list[int] | None) -> list[Completion]:
        eos = self.tokenizer.eos_token_id
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True).to(self.device)
        rows = decode(model, enc.input_ids, enc.attention_mask, s, seeds, eos, self.tokenizer.pad_token_id)
        return [self._completion(row.tokens, int(mask.sum()), s, eos) for mask, row in zip(enc.attention_mask, rows)]

    def _completion(self, new: list[int], prompt_tokens: int, s: Sampling, eos: int) -> Completion:
        ended = eos in new
        ids = new[: new.index(eos)] if ended else new
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = cut_at_stop(text, s.stop)
        if cut is not None:
            text, ended = cut, True
            ids = self.tokenizer(cut, add_special_tokens=False).input_ids
        return Completion(text, "stop" if ended else "length", len(ids), prompt_tokens)

    async def complete_tokens(
        self, prompts: list[list[int]], sampling: Sampling, adapter: str | None, logprobs: int | None = None, prompt_logprobs: int | None = None
    ) -> list[TokenCompletion]:
        """The contract's `complete_tokens` (serve/engine.py). One call's prompts are generated as in
        `generate` (chunks of `hf_batch_size`, prompt i from seed + i); calls are not gathered across
        requests. Prompt log-probabilities take one forward per prompt: the full vocabulary's
        log-softmax at every position is held for one prompt at a time."""
        return await self._run(self._complete_tokens, prompts, sampling, adapter, logprobs, prompt_logprobs)

    @torch.inference_mode()
    def _complete_tokens(self, prompts, s: Sampling, adapter, logprobs, prompt_logprobs) -> list[TokenCompletion]:
        context, model = self._selected(adapter)
        with context:
            scored = [self._prompt_logprobs(model, p, prompt_logprobs) if prompt_logprobs is not None else None for p in prompts]
            if s.max_tokens == 0:
                done = [((), "", "length", () if logprobs is not None else None)] * len(prompts)
            else:
                done = self._in_batches(prompts, s, lambda batch, seeds: self._generate_ids(model, batch, s, seeds, logprobs))
        return [TokenCompletion(ids, text, reason, len(p), lps, sc) for p, (ids, text, reason, lps), sc in zip(prompts, done, scored)]

    def _prompt_logprobs(self, model, ids: list[int], k: int) -> tuple[TokenLogprob | None, ...]:
        """Each prompt token's log-probability after the ones before it, and the k most likely there."""
        logits = model(input_ids=torch.tensor([ids], device=self.device)).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        return (None, *self._entries(logprobs, ids[1:], k))

    @staticmethod
    def _entries(logprobs: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprob]:
        """TokenLogprobs of `tokens` from rows of log-probabilities (one row per token)."""
        own = logprobs.gather(1, torch.tensor(tokens, dtype=torch.long, device=logprobs.device)[:, None])[:, 0].tolist()
        values, indices = logprobs.topk(k, dim=-1)
        return [TokenLogprob(t, o, tuple(zip(i, v))) for t, o, i, v in zip(tokens, own, indices.tolist(), values.tolist())]

    def _generate_ids(self, model, prompts: list[list[int]], s: Sampling, seeds: list[int] | None, logprobs: int | None) -> list[tuple]:
        """(token ids, text, finish_reason, TokenLogprobs or None) per prompt, token ids as vLLM counts
        them: an end-of-sequence token is kept (its text is not), and a stop string ends the ids at
        the token that completed it."""
        eos, pad, width = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, max(map(len, prompts))
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        results = []
        for row in decode(model, input_ids, mask, s, seeds, eos, pad, logprobs):
            new = row.tokens
            ends = new.index(eos) if eos in new else None
            ids, text = new, self.tokenizer.decode(new[:ends], skip_special_tokens=True)
            reason = "length" if ends is None else "stop"
            if cut_at_stop(text, s.stop) is not None:  # end at the first token whose text completes a stop string
                prefixes = (new[:n] for n in range(1, len(new) + 1))
                ids, text = next((p, cut) for p in prefixes if (cut := cut_at_stop(self.tokenizer.decode(p, skip_special_tokens=True), s.stop)) is not None)
                reason = "stop"
            entries = None
            if logprobs is not None:
                entries = tuple(TokenLogprob(t, own, tuple(top)) for t, (own, top) in zip(ids, row.logprobs))
            results.append((tuple(ids), text, reason, entries))
        return results

    async def check_health(self) -> None:
        await self._run(lambda: None)  # the worker thread still answers

    def shutdown(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
