"""The transformers + PEFT engine: the fallback where vLLM is not installed, and the reference.

Adapters are loaded unmerged into one PeftModel and selected per job
(`set_adapter`, or `disable_adapter()` for the base model), so scores are the
same arithmetic as lm-evaluation-harness's HF backend with `peft=`. Models
registered beside the base (fully fine-tuned copies of it, with its tokenizer)
are held whole and selected by name as an adapter is: several models served by
one process, loaded once each. All model
work runs on one worker thread (the active adapter is model state), as bounded
jobs: a call's prompts go through in chunks of `hf_batch_size`, each chunk a job
of its own, so requests take turns chunk by chunk, and a request that goes away
(its client disconnected, its timeout passed) stops at the job's next step.
Batching across requests happens in the deployment (`@serve.batch`). Seeded
prompts keep their samples whatever the chunking: serve/hf_decode.py samples
each row from its own generator, so prompt i's sample depends on seed + i alone
(the engines' seed contract, serve/engine.py).

Health is a liveness signal, never a job queued behind the work: every step of a
job (each forward) stamps the time it began, and the health check fails only when
one step has run past `hf_stall_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.model_source import load_pretrained
from serve.engine import (
    ENGINES,
    Completion,
    EngineUnavailable,
    Sampling,
    TokenCompletion,
    TokenLogprob,
    UnknownAdapter,
    cut_at_stop,
)
from serve.hf_decode import decode
from serve.hf_scoring import (
    LOGITS_BYTES,
    cloze_chunks,
    cloze_plan,
    continuation_sums,
    length_sorted_chunks,
    letter_token_ids,
    mc_logprobs_batch,
    read_sums,
    scorable_choices,
)
from serve.settings import ServiceError, ServiceSettings

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Stopped(Exception):
    """The request behind a job went away: the job ends at its next step, its result unread."""


class HFEngine:
    name = "hf"
    kind = ENGINES["hf"]
    continuous_batching = False  # one call at a time: the deployment gathers concurrent requests (@serve.batch)
    scores_prompts = True  # complete_tokens takes prompt_logprobs; score_continuations scores cloze

    def __init__(self, model_path: str, settings: ServiceSettings):
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = settings.dtype if settings.dtype != "auto" else ("bfloat16" if self.device == "cuda" else "float32")
        self.tokenizer = load_pretrained(AutoTokenizer, model_path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        # Fast tokenizers are not thread-safe (padding state is set per call): the service counts
        # prompt tokens with its own instance while the worker thread pads batches.
        self.counting_tokenizer = load_pretrained(AutoTokenizer, model_path)
        self.max_choices = scorable_choices(self.tokenizer)
        self.letters = letter_token_ids(self.tokenizer, self.max_choices)
        self.model = load_pretrained(AutoModelForCausalLM, model_path, dtype=DTYPES[dtype]).to(self.device).eval()
        self.peft = None  # the PeftModel wrapping self.model once an adapter is added
        self.models: dict[str, torch.nn.Module] = {}  # registered beside the base, by name
        self.batch_size = settings.hf_batch_size
        self.stall_s = settings.hf_stall_s
        self._step_began: float | None = None  # when the running job's current step began; None while idle
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")

    async def _run(self, fn, *args):
        """`fn(*args, pulse)` as one job on the worker thread. `pulse()` marks the start of a step
        (the liveness signal) and raises `Stopped` once the awaiting request was cancelled; a job
        cancelled before it starts never runs."""
        stop = threading.Event()

        def pulse() -> None:
            if stop.is_set():
                raise Stopped("the request went away")
            self._step_began = time.monotonic()

        def job():
            pulse()
            try:
                return fn(*args, pulse)
            finally:
                self._step_began = None

        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, job)
        except asyncio.CancelledError:
            stop.set()
            raise

    async def _chunked(self, items: list, job) -> list:
        """`job(batch, start, pulse)` over `items` in chunks of hf_batch_size (`start`: the chunk's
        first index in the call), each chunk its own job: other requests' chunks run in between."""
        results = []
        for start in range(0, len(items), self.batch_size):
            results += await self._run(job, items[start : start + self.batch_size], start)
        return results

    @staticmethod
    def _seeds(s: Sampling, start: int, n: int) -> list[int] | None:
        """Seeds of a chunk's prompts: prompt i of the call samples with seed + i (None unseeded)."""
        return None if s.seed is None else [s.seed + start + j for j in range(n)]

    # Adapters -------------------------------------------------------------------------------

    async def add_adapter(self, name: str, path: str) -> None:
        await self._run(lambda pulse: self._add_adapter(name, path))

    def _add_adapter(self, name: str, path: str) -> None:
        from peft import PeftModel

        if self.peft is None:
            self.peft = PeftModel.from_pretrained(self.model, path, adapter_name=name).eval()
        else:
            self.peft.load_adapter(path, adapter_name=name)

    async def remove_adapter(self, name: str) -> None:
        await self._run(lambda pulse: self._remove_adapter(name))

    def _remove_adapter(self, name: str) -> None:
        if list(self.peft.peft_config) == [name]:
            self.model, self.peft = self.peft.unload(), None
        else:
            self.peft.delete_adapter(name)

    async def add_model(self, name: str, path: str) -> None:
        await self._run(lambda pulse: self._add_model(name, path))

    def _add_model(self, name: str, path: str) -> None:
        """Load a model beside the base; one whose tokenizer differs from the base's is refused (the
        service tokenizes, counts and truncates every prompt with the base's)."""
        if AutoTokenizer.from_pretrained(path).get_vocab() != self.tokenizer.get_vocab():
            raise ServiceError(
                f"model {name!r} ({path}): its tokenizer's vocabulary differs from the base model's; serve it as a base of its own"
            )
        self.models[name] = AutoModelForCausalLM.from_pretrained(path, dtype=self.model.dtype).to(self.device).eval()

    async def remove_model(self, name: str) -> None:
        await self._run(lambda pulse: self.models.pop(name))

    @contextlib.contextmanager
    def _selected(self, adapter: str | None):
        """The model to call with `adapter` active (None: the base model; a registered model's name:
        that model). An adapter removed since the request was checked is an UnknownAdapter, not a
        KeyError deep in PEFT."""
        if adapter in self.models:
            yield self.models[adapter]
            return
        if adapter is None:
            with self.peft.disable_adapter() if self.peft else contextlib.nullcontext():
                yield self.peft or self.model
            return
        if self.peft is None or adapter not in self.peft.peft_config:
            raise UnknownAdapter(adapter)
        self.peft.set_adapter(adapter)
        yield self.peft

    # Work -----------------------------------------------------------------------------------

    def count_tokens(self, prompts: list[str]) -> list[int]:
        return [len(ids) for ids in self.counting_tokenizer(prompts, add_special_tokens=True).input_ids]

    async def score(self, prompts: list[str], n_choices: list[int], adapter: str | None) -> list[list[float]]:
        """One forward per chunk of similar-length prompts (serve/hf_scoring.py), each chunk a job."""
        results: list[list[float]] = [[] for _ in prompts]
        for chunk in length_sorted_chunks(prompts, self.batch_size):
            rows = await self._run(
                self._score_batch, [prompts[i] for i in chunk], [n_choices[i] for i in chunk], adapter
            )
            for i, row in zip(chunk, rows):
                results[i] = row
        return results

    def _score_batch(self, prompts: list[str], n_choices: list[int], adapter: str | None, pulse) -> list[list[float]]:
        with self._selected(adapter) as model:
            return mc_logprobs_batch(model, self.tokenizer, prompts, n_choices, self.letters)

    async def score_continuations(
        self, prompt_ids: list[list[int]], continuations: list[list[list[int]]], adapter: str | None
    ) -> list[float]:
        """The contract's `score_continuations`: serve/hf_scoring.py's cloze arithmetic, one forward per
        chunk of distinct inputs (`cloze_chunks`), each chunk a job (the plan too: never on the event loop)."""
        inputs, targets, reads = await self._run(lambda pulse: cloze_plan(prompt_ids, continuations))
        sums: list[list[float]] = [[] for _ in inputs]
        for chunk in cloze_chunks(inputs, targets, self.batch_size, self.model.config.vocab_size):
            rows = await self._run(
                self._continuations_batch, [inputs[i] for i in chunk], [targets[i] for i in chunk], adapter
            )
            for i, row in zip(chunk, rows):
                sums[i] = row
        return read_sums(reads, targets, sums)

    def _continuations_batch(
        self, inputs: list[list[int]], targets: list[list[list[int]]], adapter: str | None, pulse
    ) -> list[list[float]]:
        with self._selected(adapter) as model:
            return continuation_sums(model, inputs, targets, self.tokenizer.pad_token_id)

    async def generate(self, prompts: list[str], sampling: Sampling, adapter: str | None) -> list[Completion]:
        return await self._chunked(
            prompts, lambda batch, start, pulse: self._generate_batch(batch, sampling, adapter, start, pulse)
        )

    @torch.inference_mode()
    def _generate_batch(
        self, prompts: list[str], s: Sampling, adapter: str | None, start: int, pulse
    ) -> list[Completion]:
        eos = self.tokenizer.eos_token_id
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True).to(self.device)
        with self._selected(adapter) as model:
            rows = decode(
                model,
                enc.input_ids,
                enc.attention_mask,
                s,
                self._seeds(s, start, len(prompts)),
                eos,
                self.tokenizer.pad_token_id,
                pulse=pulse,
            )
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
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        adapter: str | None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
    ) -> list[TokenCompletion]:
        """The contract's `complete_tokens` (serve/engine.py). One call's prompts are generated as in
        `generate` (chunks of `hf_batch_size`, prompt i from seed + i); calls are not gathered across
        requests. Prompt log-probabilities take one forward per group of prompts whose logits at
        every position fit LOGITS_BYTES (one prompt at a time on a large vocabulary and context)."""
        scored = [None] * len(prompts)
        if prompt_logprobs is not None:
            scored = await self._chunked(
                prompts, lambda batch, start, pulse: self._prompts_scored(batch, adapter, prompt_logprobs, pulse)
            )
        if sampling.max_tokens == 0:
            done = [((), "", "length", () if logprobs is not None else None)] * len(prompts)
        else:
            done = await self._chunked(
                prompts,
                lambda batch, start, pulse: self._generate_ids(batch, sampling, adapter, start, logprobs, pulse),
            )
        return [
            TokenCompletion(ids, text, reason, len(p), lps, sc)
            for p, (ids, text, reason, lps), sc in zip(prompts, done, scored)
        ]

    @torch.inference_mode()
    def _prompts_scored(self, prompts: list[list[int]], adapter: str | None, k: int, pulse) -> list[tuple]:
        """`_prompt_logprobs` of each prompt, a forward (a step) per group whose float32 logits at
        every position fit LOGITS_BYTES: many short prompts at once (cloze scoring), one long one alone."""
        groups: list[list[int]] = [[]]
        # shortest first: a group is as wide as its last
        for i in sorted(range(len(prompts)), key=lambda i: len(prompts[i])):
            if groups[-1] and (len(groups[-1]) + 1) * len(prompts[i]) * self.model.config.vocab_size * 4 > LOGITS_BYTES:
                groups.append([])
            groups[-1].append(i)
        scored: list = [None] * len(prompts)
        with self._selected(adapter) as model:
            for group in filter(None, groups):
                pulse()
                for i, entries in zip(group, self._prompt_logprobs(model, [prompts[i] for i in group], k)):
                    scored[i] = entries
        return scored

    def _prompt_logprobs(self, model, prompts: list[list[int]], k: int) -> list[tuple[TokenLogprob | None, ...]]:
        """Per prompt (right-padded into one forward), each token's log-probability after the ones
        before it, and the k most likely there."""
        width = max(map(len, prompts))
        ids = torch.tensor([p + [self.tokenizer.pad_token_id] * (width - len(p)) for p in prompts], device=self.device)
        mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts], device=self.device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        # log-softmax = logits - norm, without a second vocabulary-wide copy
        norm = torch.logsumexp(logits, dim=-1, keepdim=True)
        own = (logits.gather(2, ids[:, 1:, None]) - norm)[..., 0].tolist()
        values, indices = logits.topk(k, dim=-1)
        values, indices = (values - norm).tolist(), indices.tolist()
        return [
            (None, *(TokenLogprob(t, o, tuple(zip(i, v))) for t, o, i, v in zip(p[1:], own[r], indices[r], values[r])))
            for r, p in enumerate(prompts)
        ]

    @torch.inference_mode()
    def _generate_ids(
        self, prompts: list[list[int]], s: Sampling, adapter: str | None, start: int, logprobs: int | None, pulse
    ) -> list[tuple]:
        """(token ids, text, finish_reason, TokenLogprobs or None) per prompt, token ids as vLLM counts
        them: an end-of-sequence token is kept (its text is not), and a stop string ends the ids at
        the token that completed it."""
        eos, pad, width = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, max(map(len, prompts))
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        with self._selected(adapter) as model:
            rows = decode(model, input_ids, mask, s, self._seeds(s, start, len(prompts)), eos, pad, logprobs, pulse)
        results = []
        for row in rows:
            new = row.tokens
            ends = new.index(eos) if eos in new else None
            ids, text = new, self.tokenizer.decode(new[:ends], skip_special_tokens=True)
            reason = "length" if ends is None else "stop"
            if cut_at_stop(text, s.stop) is not None:  # end at the first token whose text completes a stop string
                pulse()
                ids = new[: self._first_stop(new, s.stop)]
                text, reason = cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), s.stop), "stop"
            entries = None
            if logprobs is not None:
                entries = tuple(TokenLogprob(t, own, tuple(top)) for t, (own, top) in zip(ids, row.logprobs))
            results.append((tuple(ids), text, reason, entries))
        return results

    def _first_stop(self, new: list[int], stop: tuple[str, ...]) -> int:
        """The fewest leading tokens of `new` whose text holds a stop string, by bisection (a prefix
        that holds one, every longer one holds too): log2(len) decodes, not one per prefix."""
        low, high = 1, len(new)
        while low < high:
            mid = (low + high) // 2
            if cut_at_stop(self.tokenizer.decode(new[:mid], skip_special_tokens=True), stop) is None:
                low = mid + 1
            else:
                high = mid
        return low

    async def check_health(self) -> None:
        """Fails when one step of a job (one forward) has run past hf_stall_s: a hung worker, not a busy one."""
        began = self._step_began
        if began is not None and time.monotonic() - began > self.stall_s:
            raise EngineUnavailable(
                f"the transformers engine has been on one step for {time.monotonic() - began:.0f} s (hf_stall_s={self.stall_s})"
            )

    def shutdown(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
