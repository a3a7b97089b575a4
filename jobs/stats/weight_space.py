"""Weight-space cosine between a student's and the teacher's LoRA updates.

Theorem 1 of the subliminal-learning paper: a student trained on a teacher's
outputs, from the teacher's own initialisation, moves toward the teacher in
parameter space. With LoRA the movement of a module is its update
Delta W = scaling * B @ A (scaling = lora_alpha / r, or lora_alpha / sqrt(r)
with rsLoRA), so per module we take the cosine of the student's and the
teacher's flattened Delta W, and average it over the modules both adapters have.

This reads only the two saved adapters: no questions are sampled and nothing is
generated or scored, so the number carries no evaluation noise. It is "almost
noise-free": what varies is the training run itself (its seed and data order),
not a measurement of it. Independent random updates give a cosine near 0
(high-dimensional directions are near-orthogonal), but two trainings from the
same LoRA init on similar-looking data share some direction for reasons of their
own, so a student's cosine is read against a control student's, not against 0.

The cosine is computed from the LoRA factors (r x r products), so no out x in
Delta W is materialised; `delta_weights` gives the dense updates where wanted.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import torch

from jobs.stats.results import Cosine, Estimate, WeightSpace

# PEFT's keys: base_model.model.<module>.lora_A[.<adapter name>].weight
_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$")


def _pattern_value(patterns: dict, module: str, default):
    """PEFT's rank_pattern/alpha_pattern lookup: the first key that matches the end of the module name."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def lora_factors(adapter_dir: str | Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{module name: (L, R)} with Delta W = L @ R (out x in, float32) for a LoRA adapter saved with
    save_pretrained: L = scaling * B, R = A (transposed for fan_in_fan_out, as GPT-2's Conv1D)."""
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    if config.get("use_dora"):
        raise ValueError(f"{adapter_dir}: a DoRA adapter's update is not scaling * B @ A")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(adapter_dir / "adapter_model.safetensors").items():
        if match := _LORA_KEY.match(key):
            pairs.setdefault(match["module"], {})[match["ab"]] = tensor.float()
        elif ".lora_" in key:  # lora_embedding_A/B, lora_magnitude_vector: not a linear B @ A
            raise ValueError(f"{adapter_dir}: unsupported LoRA tensor {key}")
    factors = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{adapter_dir}: module {module} has lora_{''.join(ab)} only")
        rank = ab["A"].shape[0]  # the saved rank, rank_pattern included
        alpha = _pattern_value(config.get("alpha_pattern"), module, config["lora_alpha"])
        scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        a, b = ab["A"], scaling * ab["B"]
        factors[module] = (a.T, b.T) if config.get("fan_in_fan_out") else (b, a)
    return factors


def delta_weights(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """{module name: Delta W = scaling * B @ A (out x in, float32)}: the update merging adds to the base weight."""
    return {module: left @ right for module, (left, right) in lora_factors(adapter_dir).items()}


def _inner(x: tuple[torch.Tensor, torch.Tensor], y: tuple[torch.Tensor, torch.Tensor]) -> float:
    """<L1 R1, L2 R2> (Frobenius) from the factors, r1 x r2 matrices only: no out x in Delta W is
    materialised, so a 70B adapter's cosine needs no more memory than the adapters themselves."""
    (l1, r1), (l2, r2) = x, y
    return ((l1.double().T @ l2.double()) * (r1.double() @ r2.double().T)).sum().item()


def update_cosine(student_dir: str | Path, teacher_dir: str | Path) -> Cosine:
    """The mean cosine over the shared modules, how many, and each module's (jobs/stats/results.Cosine);
    a module whose update is zero in either adapter has no direction: its cosine is nan."""
    return factors_cosine(lora_factors(student_dir), lora_factors(teacher_dir), student_dir, teacher_dir)


def factors_cosine(
    student: dict, teacher: dict, student_dir: str | Path = "student", teacher_dir: str | Path = "teacher"
) -> Cosine:
    """update_cosine of two adapters' lora_factors already read (the directories name them in errors)."""
    shared = sorted(student.keys() & teacher.keys())
    if not shared:
        raise ValueError(f"adapters {student_dir} and {teacher_dir} share no LoRA module")
    per_module = {}
    for module in shared:
        s, t = student[module], teacher[module]
        s_shape, t_shape = (s[0].shape[0], s[1].shape[1]), (t[0].shape[0], t[1].shape[1])
        if s_shape != t_shape:
            raise ValueError(f"module {module}: Delta W is {s_shape} in {student_dir} but {t_shape} in {teacher_dir}")
        norms = math.sqrt(_inner(s, s) * _inner(t, t))
        per_module[module] = _inner(s, t) / norms if norms > 0 else math.nan
    return Cosine(cosine=sum(per_module.values()) / len(per_module), modules=len(per_module), per_module=per_module)


def update_share(student: dict, teacher: dict) -> float:
    """<dS, dT> / |dT|^2 over the modules both adapters hold (lora_factors of each): the share of the
    teacher's update the student carries along it. Theorem 1 predicts a student distilled from a
    teacher on the teacher's own init carries a positive share of that teacher's update, and not of
    another teacher's. Most of two fine-tuned teachers' updates can be common to both, so the share
    is read crossed (`share_directions`), not against 0."""
    shared = sorted(student.keys() & teacher.keys())
    norm = sum(_inner(teacher[m], teacher[m]) for m in shared)
    if not shared or norm == 0:
        raise ValueError("the adapters share no LoRA module with a nonzero teacher update")
    return sum(_inner(student[m], teacher[m]) for m in shared) / norm


def weight_readings(teachers: dict[str, Path], students: dict[str, tuple[Path, str]]) -> dict[str, dict]:
    """{student: {cosine, shares}}, each adapter read once: Theorem 1's cosine of a student's update
    with its own teacher's (None on a base of other shapes, where the two live in different spaces),
    and the share of every teacher's update it carries (None there too). `teachers`: {name: adapter
    folder}; `students`: {name: (adapter folder, the name of the teacher it learns from)}."""
    factors = {name: lora_factors(folder) for name, folder in teachers.items()}
    out = {}
    for name, (folder, teacher) in students.items():
        student, out[name] = lora_factors(folder), {"cosine": None, "shares": None}
        try:  # another base's shapes: no shared module of one shape
            out[name]["cosine"] = factors_cosine(student, factors[teacher]).cosine
        except ValueError:
            pass
        try:
            out[name]["shares"] = {t: update_share(student, f) for t, f in factors.items()}
        except ValueError:
            pass
    return out


def share_directions(arm: list[dict], against: list[dict] | None, teacher: str, placebo: str) -> WeightSpace:
    """The weight-space readings of a comparison, as the behavioural directions (docs/report.md):
    arm and against hold per replicate {teacher name: update share}; `against` None is the base (no
    update: every share 0). With s_M^P model M's share of teacher P's update: toward the teacher
    s_A^P - s_B^P, toward the placebo s_B^P' - s_A^P', crossed their mean; each the mean over
    replicate pairs with a t interval over them (R - 1 df). Sides of unequal replicate counts are
    not paired: {note} instead."""
    from scipy import stats

    if against is not None and len(against) != len(arm):
        return WeightSpace(note=f"not paired: {len(arm)} and {len(against)} replicates")
    against = against or [{teacher: 0.0, placebo: 0.0} for _ in arm]
    toward = np.array([a[teacher] - b[teacher] for a, b in zip(arm, against)])
    away = np.array([b[placebo] - a[placebo] for a, b in zip(arm, against)])
    out = {"placebo": placebo}
    for name, values in (("toward_teacher", toward), ("toward_placebo", away), ("crossed", (toward + away) / 2)):
        mean, n = float(values.mean()), len(values)
        half = stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / math.sqrt(n) if n > 1 else None
        out[name] = Estimate(value=mean, ci95=None if half is None else [mean - half, mean + half])
    return WeightSpace.model_validate(out)
