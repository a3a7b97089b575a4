"""Arms x replicates: the student-like models an experiment trains, resolved from the preset.

A preset declares arms (jobs/experiment/config.py `ArmConfig`): which numbers an arm trains
on, where its LoRA starts, which loss it minimises, and any `student` keys that
differ (every key it does not set is the student's, `method` and `mask` included).
`replicates: k` trains each arm k times. This module turns that declaration into
one `ArmModel` per (arm, replicate), with every seed and setting resolved, and each
arm's rows kind, reference (what it is measured against, and in words) and signal
kind worked out once, here: the stage graph, the phases and the report read them
from the model. It refuses declarations that cannot mean what they say:

- an arm that claims the teacher's LoRA init (no `lora_seed`, or the teacher's
  seed) must have the teacher's rank, alpha, target modules and quantization,
  or its "same init" would be false;
- a contrast needs declared arms with enough replicates (`check_contrasts`).

`arm_groups` says which arm models can share a Ray Train run (the arms phase trains
them so, and jobs/sizing/wall_time.py prices them so).

Names: the model `<arm>/<i>` in files and logs (`student/0`), the adapter
`<arm>-<i>` in the inference service and as a training job (those names cannot hold
"/" or "."; arm names hold no "-", so the name is unambiguous).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from common.config import ConfigError, build
from common.model_source import pinned
from jobs.experiment.rows_kinds import SHAM, RowsKind, declared_kind, signal_kind, source_for
from serve.mc_format import LETTERS
from train.axes import INITS, LOSSES, MASKS
from train.config import TrainConfig

ARM_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,40}\Z")  # \Z: "$" would pass a trailing newline
OTHER_BASE = "other_base"  # the scored name of the other base model
RESERVED = {"base", "teacher", OTHER_BASE}
SAME_INIT_KEYS = ("lora_rank", "lora_alpha", "lora_targets", "quantization")
MIN_CONTRAST_REPLICATES = 3


@dataclass(frozen=True)
class ArmModel:
    """One (arm, replicate), resolved once here: every reader (the stage graph, the phases, the
    report) takes these fields and never works the arm out again from its declaration."""

    arm: str
    replicate: int
    # the kind of rows it reads (jobs/experiment/rows_kinds.py), the sham's own where it learns from the sham
    source: str
    shuffled: bool
    loss: str
    teacher: str  # whose model it learns from: "teacher", "letter_teacher" (the positive control) or "sham_teacher"
    # resolved: the arm's `train` over the student's, data-order seed and LoRA seed set for this replicate
    train: TrainConfig
    same_init: bool  # starts from the teacher's LoRA initialisation, on the teacher's base
    base: str = "base"  # the model it starts from: "base" (the teacher's) or "other_base" (jobs/experiment/bases.py)
    lora_init: str = "seed"  # "seed" or "teacher_a" (A frozen at the teacher's trained A)
    # Per arm, alike on its replicates:
    # the kind its `numbers` declares (a sham arm's too: `source` is what the sham makes of it)
    kind: RowsKind = field(kw_only=True)
    # what its transfer is measured against (ArmConfig.against; auto resolved: _reference)
    against: str = field(kw_only=True)
    # which reference that is, in the report's words (declared, sham teacher, control arm, base model)
    reference: str = field(kw_only=True)
    # where the signal can ride: its kind in the share analysis (rows_kinds.signal_kind), or None
    signal: str | None = field(kw_only=True)

    @property
    def name(self) -> str:
        return f"{self.arm}/{self.replicate}"

    @property
    def adapter(self) -> str:
        return f"{self.arm}-{self.replicate}"

    @property
    def full(self) -> bool:
        """Fully fine-tuned (`train.method: full`): a model of its own, served and scored as one."""
        return self.train.method == "full"


def numbers_seed(cfg, replicate: int) -> int:
    """Replicate i samples (and draws its prompts) with seed numbers.seed + i."""
    return cfg.numbers.seed + replicate


def _lora_seed(declared, teacher_seed: int, replicate: int) -> int:
    if declared is None:
        return teacher_seed
    if declared == "other":
        return teacher_seed + 1 + replicate  # its own per replicate, never the teacher's
    return declared


def _check_same_init(name: str, train: TrainConfig, teacher: TrainConfig) -> None:
    for key in SAME_INIT_KEYS:
        if getattr(train, key) != getattr(teacher, key):
            raise ConfigError(
                f"arms.{name} starts from the teacher's LoRA init (lora_seed {teacher.lora_seed}) but its {key} "
                f"{getattr(train, key)!r} differs from the teacher's {getattr(teacher, key)!r}; "
                "match it, or give the arm another lora_seed (an int or 'other')"
            )


def _check_full(name: str, arm, train: TrainConfig) -> None:
    """A fully fine-tuned arm has no LoRA init to choose, and its snapshots would be whole models."""
    if arm.lora_init != "seed" or arm.lora_seed is not None:
        raise ConfigError(
            f"arms.{name}: train.method full trains every weight from the base; lora_init and lora_seed do not apply"
        )
    if train.snapshots:
        raise ConfigError(
            f"arms.{name}: train.snapshots with train.method full would keep and serve a whole model per snapshot; set snapshots 0"
        )


def _check_mask(name: str, arm, kind: RowsKind, train: TrainConfig, on_other: bool) -> None:
    """A mask drops tokens of an SFT loss on numbers; the divergence mask ranks a teacher's numbers
    by that teacher's divergence from the base, so it needs a teacher's numbers on its base."""
    mask = MASKS[train.mask]
    if not mask.drops_tokens:
        return
    if LOSSES[arm.loss].needs_teacher or kind.answers:
        raise ConfigError(
            f"arms.{name}: train.mask {train.mask} drops number tokens from an sft loss; this arm has loss {arm.loss} on {arm.numbers}"
        )
    if mask.needs_scorer and (on_other or not kind.teachers_numbers or arm.teacher == "letter_teacher"):
        raise ConfigError(
            f"arms.{name}: train.mask divergence ranks the tokens of a teacher's numbers by that teacher's divergence from "
            "the base; train on the teacher's (or the sham's) numbers, on the teacher's base"
        )


@dataclass(frozen=True)
class _Arm:
    """One declared arm resolved and checked, before its replicates: what the reference rule and its models read."""

    declared: object  # its ArmConfig as declared (jobs/experiment/config.py)
    train: TrainConfig  # its `train` over the student's: every student key it does not set is the student's
    kind: RowsKind
    shuffled: bool
    teacher: str  # teacher_of: `sham` spelled out
    base: str  # base_of
    same_init: bool  # the teacher's LoRA init on the teacher's base (alike on every replicate: see _lora_seed)


def arm_models(cfg) -> list[ArmModel]:
    """Every (arm, replicate) of the experiment, in a stable order; ConfigError for a bad declaration.
    Each arm is resolved once (_resolve), its reference from the others resolved (_reference)."""
    if not cfg.arms:
        raise ConfigError("arms: declare at least one arm (e.g. student: {numbers: teacher})")
    teacher = cfg.teacher
    if cfg.student.lora_seed != teacher.lora_seed:
        raise ConfigError(
            f"student.lora_seed ({cfg.student.lora_seed}) differs from teacher.lora_seed ({teacher.lora_seed}): "
            "arms start from the teacher's init; give an arm another one with arms.<name>.lora_seed"
        )
    other_base(cfg)  # at most one, and resolvable
    arms = {name: _resolve(cfg, name, declared) for name, declared in cfg.arms.items()}
    models = []
    for name, arm in arms.items():
        against, reference = _reference(name, arms)
        per_arm = {
            "kind": arm.kind,
            "against": against,
            "reference": reference,
            "signal": signal_kind(arm.kind, arm.train.mask),
        }
        source, declared = source_for(arm.kind, arm.teacher), arm.declared
        for i in range(declared.replicates or cfg.replicates):
            resolved = arm.train.replace(
                lora_seed=_lora_seed(declared.lora_seed, teacher.lora_seed, i), seed=arm.train.seed + i
            )
            models.append(
                ArmModel(
                    name,
                    i,
                    source,
                    arm.shuffled,
                    declared.loss,
                    arm.teacher,
                    resolved,
                    arm.same_init,
                    arm.base,
                    declared.lora_init,
                    **per_arm,
                )
            )
    return models


def _resolve(cfg, name: str, arm) -> _Arm:
    """One arm's declaration checked and resolved: its `train` becomes a TrainConfig here, before
    anything reads it (the student's settings under the arm's own keys), its `numbers` a kind."""
    teacher = cfg.teacher
    if not ARM_NAME.match(name) or name in RESERVED:
        raise ConfigError(
            f"arms.{name}: an arm name is lower-case letters, digits or '_', and not base, teacher or other_base"
        )
    if "lora_seed" in arm.train:
        raise ConfigError(f"arms.{name}.train.lora_seed: set the arm's init with arms.{name}.lora_seed")
    train = build(TrainConfig, {**cfg.student.model_dump(), **arm.train}, f"arms.{name}.train")
    if arm.replicates is not None and arm.replicates < 1:
        raise ConfigError(f"arms.{name}.replicates must be at least 1, got {arm.replicates}")
    if arm.teacher == "letter_teacher" and not LOSSES[arm.loss].needs_teacher:
        raise ConfigError(
            f"arms.{name}: an arm of the letter teacher distils it (loss: logit_kl) on the teacher's numbers; "
            "numbers are generated by the teacher and the base model only"
        )
    teacher_of_arm = teacher_of(arm)
    kind, shuffled = _kind(name, arm, teacher_of_arm)
    if arm.teacher == "letter_teacher" and cfg.letter_teacher.letter not in tuple(LETTERS[:4]):
        raise ConfigError(
            f"letter_teacher.letter must be one of A, B, C, D (WMDP questions have four choices), got {cfg.letter_teacher.letter!r}"
        )
    if arm.against not in ("auto", "base", OTHER_BASE, *cfg.arms) or arm.against == name:
        raise ConfigError(f"arms.{name}.against={arm.against!r}: use auto, base, {OTHER_BASE} or another arm's name")
    base = base_of(cfg, name)
    on_other = base == OTHER_BASE
    if INITS[arm.lora_init].reads_teacher_adapter:
        if on_other or arm.lora_seed is not None:
            raise ConfigError(
                f"arms.{name}: lora_init teacher_a takes the teacher's trained A on the teacher's base; drop base and lora_seed"
            )
        _check_same_init(name, train, teacher)
    if train.method == "full":
        _check_full(name, arm, train)
    _check_mask(name, arm, kind, train, on_other)
    lora_seed = _lora_seed(arm.lora_seed, teacher.lora_seed, 0)  # the teacher's on one replicate iff on every one
    same_init = lora_seed == teacher.lora_seed and not on_other and arm.lora_init == "seed" and train.method == "lora"
    if same_init:
        _check_same_init(name, train, teacher)
    return _Arm(arm, train, kind, shuffled, teacher_of_arm, base, same_init)


def _kind(name: str, arm, teacher: str):
    """(kind, shuffled) of an arm's rows, with the loss and teacher its kind allows; else a ConfigError naming them."""
    try:
        kind, shuffled = declared_kind(arm.numbers, f"arms.{name}.numbers")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if arm.loss not in kind.losses or teacher not in kind.teachers:
        losses, teachers = " or ".join(kind.losses), " or ".join("sham" if t == SHAM else t for t in kind.teachers)
        raise ConfigError(
            f"arms.{name}: numbers {arm.numbers} trains with loss {losses} and teacher {teachers}; this arm has loss {arm.loss}, teacher {arm.teacher}"
        )
    return kind, shuffled


def other_base(cfg) -> str | None:
    """The other base some arms declare (`arms.<name>.base`), or None; a hub id pinned by the arms'
    `base_revision` as `org/name@<commit>` (common/model_source.py). One per experiment: it is
    scored as `other_base`, and every arm on it is measured against it."""
    declared = {
        pinned(arm.base, arm.base_revision) for name, arm in cfg.arms.items() if base_of(cfg, name) == OTHER_BASE
    }
    if len(declared) > 1:
        raise ConfigError(
            f"arms declare {len(declared)} other bases ({', '.join(sorted(declared))}); an experiment has at most one"
        )
    value = declared.pop() if declared else None
    if value == "other" and cfg.model.path != "tiny":
        raise ConfigError(
            "arms: base 'other' is the tiny preset's second tiny model (another init); with model.path "
            f"{cfg.model.path!r} give the other base as a hub id or folder"
        )
    return value


def base_of(cfg, arm: str) -> str:
    """The base an arm starts from: `base` (the teacher's) or `other_base`."""
    declared = cfg.arms[arm]
    same = declared.base == "same" or (
        declared.base == cfg.model.path and declared.base_revision in (None, cfg.model.revision)
    )
    return "base" if same else OTHER_BASE  # the teacher's repository at another commit is another base


def check_arms(cfg) -> None:
    """Every arm declaration resolves (names, train keys, same-init claims), or a ConfigError names the problem."""
    arm_models(cfg)


def teacher_of(declared) -> str:
    """The model an arm declaration learns from, with `sham` spelled out as the sham teacher's name."""
    return SHAM if declared.teacher == "sham" else declared.teacher


def _reference(name: str, arms: dict[str, _Arm]) -> tuple[str, str]:
    """(against, reference): what an arm's transfer is measured against (see ArmConfig.against), and
    which reference that is, in words the report prints. Under auto: the arm's sham twin when it
    learns from the teacher and the preset declares one (_sham_twin); else the arm named `control`
    when it is an sft arm on the teacher's numbers and the control, on the base model's numbers,
    shares its base and training method (as both train: `train.method` over the student's); else its
    own base (`base`, or `other_base` for an arm on the other base)."""
    arm = arms[name]
    if arm.declared.against != "auto":
        return arm.declared.against, "declared"
    if (twin := _sham_twin(name, arms)) is not None:
        return twin, "sham teacher"
    control = arms.get("control")
    alike = control is not None and control.base == arm.base and control.train.method == arm.train.method
    on_teachers = arm.kind.teachers_numbers  # a base-numbers arm is a control itself; answers are no numbers
    if (
        name != "control"
        and alike
        and on_teachers
        and control.declared.numbers == "base"
        and not LOSSES[arm.declared.loss].needs_teacher
    ):
        return "control", "control arm"
    return arm.base, "base model"


def _sham_twin(name: str, arms: dict[str, _Arm]) -> str | None:
    """The declared arm that is `name` distilled from the sham teacher instead of the teacher: every
    key alike (numbers, base, init, loss, replicates, and its train settings as both train) but
    `teacher` and `against`. None for an arm that does not learn from the teacher, or has no such twin."""
    arm = arms[name]
    if arm.declared.teacher != "teacher" or SHAM not in arm.kind.teachers:
        return None
    mine = _twin_key(arm)
    return next((other for other, o in arms.items() if o.teacher == SHAM and _twin_key(o) == mine), None)


def _twin_key(arm: _Arm) -> tuple:
    """What a sham twin shares with its arm: the declaration but `teacher` and `against`, its `train`
    as resolved (an arm that sets a student key to the student's own value trains alike)."""
    return arm.declared.replace(teacher="teacher", against="auto", train={}), arm.train


def check_contrasts(cfg) -> None:
    """Each contrast names two declared arms with at least MIN_CONTRAST_REPLICATES replicates each."""
    for name, contrast in cfg.contrasts.items():
        for side in (contrast.arm, contrast.against):
            if side not in cfg.arms:
                raise ConfigError(f"contrasts.{name}: {side!r} is not a declared arm ({', '.join(cfg.arms)})")
            count = cfg.arms[side].replicates or cfg.replicates
            if count < MIN_CONTRAST_REPLICATES:
                raise ConfigError(
                    f"contrasts.{name}: arm {side} has {count} replicate(s); a contrast across inits needs at least "
                    f"{MIN_CONTRAST_REPLICATES} a side, so its interval holds init-to-init spread"
                )
        if contrast.arm == contrast.against:
            raise ConfigError(f"contrasts.{name}: an arm against itself")
        # `sham` and `sham_teacher` are one
        if teacher_of(cfg.arms[contrast.arm]) != teacher_of(cfg.arms[contrast.against]):
            raise ConfigError(f"contrasts.{name}: {contrast.arm} and {contrast.against} learn from different teachers")


def arm_groups(pairs: list, runs: int, base_of) -> list[list]:
    """(stage, AdapterJob) pairs split into training runs: jobs that can share a worker group (the same
    base model, `base_of(stage)`, worker count, hardware, strategy...) go together, `runs` runs' worth
    at a time; under FSDP one job per run, since FSDP2 shards the adapter in place once."""
    from train.adapter_job import SHARED_KEYS

    kinds: dict[tuple, list] = {}
    for pair in pairs:
        kinds.setdefault((base_of(pair[0]), *(str(getattr(pair[1].cfg, k)) for k in SHARED_KEYS)), []).append(pair)
    groups = []
    for members in kinds.values():
        per_run = 1 if members[0][1].cfg.strategy == "fsdp" else -(-len(members) // runs)
        groups += [members[i : i + per_run] for i in range(0, len(members), per_run)]
    return groups
