"""Soft-label distillation (the `logit_kl` loss): KL(teacher || student) over the number vocabulary.

The teacher is the student's own frozen base with the teacher's LoRA adapter,
loaded into the student's PeftModel as a second, frozen adapter (for a student
on another base model, the teacher's base and adapter as a model of their own:
`load_separate_teacher`). Each
micro-batch runs one forward with the teacher's adapter (no gradient) and one
with the student's. Computing the teacher's logits in the loop, rather than
taking them from the inference engine, keeps them exact (no top-k cut) and
needs no second copy of the base: at 70B a second copy would not fit. The cost
is one extra forward per micro-step.

The KL is taken at every completion position (where the labels are set), over
the tokens a number-sequence completion is made of (digits, the filter's
separators and brackets, whitespace, end of text), each side's logits
renormalised over that set: the student learns the teacher's whole
distribution over what it could write next, not the one token it sampled.
"""

from __future__ import annotations

import contextlib

import torch

TEACHER = "teacher"
STUDENT = "default"  # the adapter train.model.attach_lora creates
NUMBER_CHARACTERS = set("0123456789 ,;.()[]\n\t")


def number_token_ids(tokenizer) -> list[int]:
    """Ids of the tokens made only of digits, separators, brackets and whitespace, plus EOS."""
    ids = []
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        if text and set(text) <= NUMBER_CHARACTERS:
            ids.append(i)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not any(tokenizer.decode([i]).strip().isdigit() for i in ids):
        raise ValueError("the tokenizer has no digit tokens: logit_kl cannot distil number sequences with it")
    return sorted(ids)


@contextlib.contextmanager
def student_active_after(peft_model):
    """Run a block that switches adapters, then make the student's adapter active again with its
    requires_grad flags as they were: PEFT's set_adapter marks every weight of the active adapter
    trainable, which would unfreeze an A held at the teacher's (`lora_init: teacher_a`)."""
    flags = {n: p.requires_grad for n, p in peft_model.named_parameters() if f".{STUDENT}." in n}
    try:
        yield
    finally:
        peft_model.set_adapter(STUDENT)
        for n, p in peft_model.named_parameters():
            if n in flags:
                p.requires_grad_(flags[n])


def attach_teacher(peft_model, adapter_path: str) -> None:
    """Load the teacher's adapter beside the student's, frozen; the student's stays active."""
    with student_active_after(peft_model):
        peft_model.load_adapter(adapter_path, adapter_name=TEACHER, is_trainable=False)
    if any(p.requires_grad for n, p in peft_model.named_parameters() if f".{TEACHER}." in n):
        raise RuntimeError("the teacher's adapter must stay frozen")


@torch.no_grad()
def teacher_logits(peft_model, input_ids: torch.Tensor, position_ids: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The teacher's logits over `ids` for a batch, from its adapter over the student's own base."""
    with student_active_after(peft_model):
        peft_model.set_adapter(TEACHER, inference_mode=True)
        return peft_model(input_ids=input_ids, position_ids=position_ids).logits[..., ids].float()


def load_separate_teacher(base_path: str, adapter_path: str, cfg, device: torch.device):
    """The teacher as a model of its own, for a student on another base (`arms.<name>.base`): the
    teacher's base with its adapter, frozen, in eval mode. It costs a second copy of a base in each
    worker; on the tiny preset that is nothing."""
    import dataclasses

    from peft import PeftModel

    from train.model import load_base

    base = load_base(base_path, dataclasses.replace(cfg, gradient_checkpointing=False), device)
    teacher = PeftModel.from_pretrained(base, adapter_path, is_trainable=False).eval()
    teacher.requires_grad_(False)
    return teacher


@torch.no_grad()
def separate_teacher_logits(teacher, input_ids: torch.Tensor, position_ids: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The logits over `ids` of a teacher loaded by `load_separate_teacher`."""
    return teacher(input_ids=input_ids, position_ids=position_ids).logits[..., ids].float()


def kl_loss(student_logits: torch.Tensor, teacher_number_logits: torch.Tensor, labels: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean over completion positions of KL(teacher || student), both renormalised over `ids`.

    Logits at position p predict token p + 1, so position p counts where labels[p + 1] is set.
    """
    at = labels[:, 1:] != -100
    student = student_logits[:, :-1][at][:, ids].float().log_softmax(-1)
    teacher = teacher_number_logits[:, :-1][at].log_softmax(-1)
    return (teacher.exp() * (teacher - student)).sum(-1).mean()
