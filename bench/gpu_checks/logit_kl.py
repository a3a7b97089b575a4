"""`logit_kl_ddp`: the logit-KL distillation path, with the student in DistributedDataParallel.

Why: a logit_kl student learns from teacher targets computed before training (train/distill.py:
load_teacher, row_targets, stored as float16 and packed with the rows by pack_batch) rather
than from a teacher run in the loop; the order those targets take through packing, and the
frozen teacher, are what could go wrong. On an 8B-width model of 2 layers (the path, not the
size, is checked), with the student wrapped in DDP at world size 1:
- a teacher whose adapter is the student's init (saved by the trainer's save_trained): KL ~ 0;
- a teacher whose adapter differs (random LoRA B, standing in for a trained one): the student's
  LoRA gradients from the precomputed targets equal those from the same teacher run in the loop
  on the packed batch, the KL falls over a few optimizer steps;
- the teacher is frozen, holds no parameter of the student's optimizer, and its adapter is
  unchanged (adapter_hash) after the student's steps.
"""

from __future__ import annotations

import numpy as np
import torch

from train.data import TEACHER_COLUMN
from train.distill import row_targets
from train.model import (
    adapter_hash,
    attach_lora,
    autocast_for,
    load_base,
    save_trained,
    trainable_state,
    wrap_distributed,
)
from train.step import forward_loss, make_optimizer
from train.teacher_pass import TeacherPass, load_teacher

from .shared import Context, flat_grads, optimizer_step, packed, rel, shape_rows

NUMBER_TOKENS = 1500  # about Llama 3's count of number tokens (digits, separators, whitespace)
STEPS = 3


def check_logit_kl(ctx: Context, model_path: str) -> dict:
    shape = ctx.shapes["student"]
    cfg = ctx.cfg(max_length=shape["max_length"])
    student = attach_lora(load_base(model_path, cfg, ctx.device), cfg)
    vocab = student.config.vocab_size
    ids = torch.tensor(
        np.sort(np.random.default_rng(3).choice(np.arange(3, vocab), min(NUMBER_TOKENS, vocab // 4), replace=False)),
        device=ctx.device,
    )
    init = trainable_state(student)
    save_trained(student, init, ctx.workdir / "teacher-untrained")
    generator = torch.Generator().manual_seed(4)
    moved = {n: torch.randn(w.shape, generator=generator) * 0.05 if "lora_B" in n else w for n, w in init.items()}
    save_trained(student, moved, ctx.workdir / "teacher-trained")

    ddp = wrap_distributed(student, cfg, ctx.device, ddp_alone=True)
    ddp.train()
    opt = make_optimizer([p for p in ddp.parameters() if p.requires_grad], cfg, ctx.device)
    rows = shape_rows(shape, vocab, seed=5)
    out = {
        "ddp": isinstance(ddp, torch.nn.parallel.DistributedDataParallel),
        "number_tokens": int(ids.numel()),
        **shape,
    }
    for name in ("untrained", "trained"):
        teacher = load_teacher(
            TeacherPass(model_path, str(ctx.workdir / f"teacher-{name}"), cfg, tuple(ids.tolist())), ctx.device
        )
        stored = row_targets(teacher, list(zip(rows["input_ids"], rows["labels"])), ids, pad_id=0)
        batch = packed({**rows, TEACHER_COLUMN: np.array(stored, dtype=object)}, shape["max_length"], ddp, ctx.device)
        kl = forward_loss(ddp, batch, ids)
        kl.backward()
        result = {"kl": float(kl.detach()), "gradient_norm": float(flat_grads(ddp).norm())}
        if name == "trained":
            result["gradient_gap_stored_vs_in_loop"] = in_loop_gap(ddp, teacher, batch, ids)
            frozen = {id(p) for p in teacher.parameters()}
            hash_before = adapter_hash(teacher)
            kls = [optimizer_step(ddp, opt, None, [batch], cfg, ids) for _ in range(STEPS)]
            result.update(
                kl_after_steps=float(forward_loss(ddp, batch, ids).detach()),
                steps=STEPS,
                kl_per_step=kls,
                teacher_frozen=not any(p.requires_grad for p in teacher.parameters()),
                teacher_outside_optimizer=not any(id(p) in frozen for g in opt.param_groups for p in g["params"]),
                teacher_unchanged=adapter_hash(teacher) == hash_before,
            )
        out[name] = result
        del teacher
    kl_tol, grad_tol = ctx.tolerance(5e-3, 1e-5), ctx.tolerance(5e-2, 1e-2)
    trained = out["trained"]
    out.update(kl_tolerance=kl_tol, gradient_tolerance=grad_tol)
    out["ok"] = bool(
        out["ddp"]
        and out["untrained"]["kl"] <= kl_tol
        and trained["kl"] > 10 * kl_tol
        and trained["gradient_gap_stored_vs_in_loop"] <= grad_tol
        and trained["kl_after_steps"] < trained["kl"]
        and trained["teacher_frozen"]
        and trained["teacher_outside_optimizer"]
        and trained["teacher_unchanged"]
    )
    return out


def in_loop_gap(ddp, teacher, batch: dict, ids: torch.Tensor) -> float:
    """The student's gradients from the stored targets vs from the teacher run on the packed batch
    in the loop (its log-probabilities over `ids` at the completion positions, as kl_loss reads them)."""
    forward_loss(ddp, batch, ids).backward()
    from_stored = flat_grads(ddp)
    with torch.no_grad(), autocast_for(batch["input_ids"].device):
        logits = teacher(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    at = batch["labels"][:, 1:] != -100
    forward_loss(ddp, {**batch, TEACHER_COLUMN: logits[:, :-1][at][:, ids].float().log_softmax(-1)}, ids).backward()
    return rel(flat_grads(ddp), from_stored)
