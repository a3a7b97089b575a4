"""The experiment's configuration: one tree of frozen settings models (common/config.py `Settings`), loaded from a YAML preset.

`configs/tiny.yaml` is the default preset (a 2-core CPU); larger presets target
GPU clusters. Every key is documented here, once; a preset only states what
differs from these defaults (or from the preset it `extends`: jobs/experiment/presets.py),
and `--set a.b=value` overrides any key.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from common.config import ConfigError, Settings, apply_overrides, build
from jobs.experiment.arms import check_arms, check_contrasts
from jobs.experiment.bases import check_local_tokenizers
from jobs.experiment.credentials import redacted_uri
from jobs.experiment.pins import check_revisions
from jobs.experiment.presets import load_preset
from jobs.stats.transfer_stats import METRICS
from serve.engine import ENGINE_CHOICES
from train.axes import INITS, LOSSES
from train.config import TrainConfig


class ModelConfig(Settings):
    # "tiny" builds the tiny preset's model into the cache; anything else is a
    # hub id or a local folder saved with save_pretrained.
    path: str = "tiny"
    # A hub id's commit, the full 40-character hash (a branch or tag can move): every reader of the
    # base reads that commit (common/model_source.py). None: the hub's newest, which the job log
    # warns about (jobs/experiment/pins.py). A folder has no revisions.
    revision: str | None = None
    tiny_seed: int = 0
    # The CPU arithmetic the tiny base is built under (common/numerics.py): `reproducible`, the same
    # model and world on any x86-64 CPU with AVX2, whatever the run's own `numerics`; `native`, each
    # machine's own (the only kind before 2026-11-29). Read by every stage of a tiny preset.
    tiny_numerics: Literal["reproducible", "native"] = "reproducible"


class DataConfig(Settings):
    # "synthetic" (the shipped harmless sample), "hub" (cais/wmdp), or a folder
    # holding wmdp-<subset>.jsonl / .parquet files.
    source: str = "synthetic"
    revision: str | None = None  # source hub: cais/wmdp's commit (40 hex characters), as model.revision
    subsets: list[str] = Field(default_factory=lambda: ["bio", "chem", "cyber"])
    eval_fraction: float = 0.3  # share of questions held out from the teacher (a row naming its own `split` keeps it)
    split_seed: int = 0
    # The tiny world's teacher–sham pair whose T facts the teacher and its sham learn
    # (jobs/sources/world.py): 0, the world's own; p >= 1, facts of their own on the same base.
    pair: int = Field(0, ge=0)


class NumbersConfig(Settings):
    prompts: int = 3000  # number prompts sent per model at most (teacher and control)
    keep: int = 2000  # stop once this many completions passed the filter
    max_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0  # prompt templates and sampling
    chunk: int = 64  # prompts per request
    in_flight: int = 8  # requests in flight per model, so the engine batches
    replace_fraction: float = 0.1  # teacher_replaced numbers: the share of each row's tokens replaced


class ServiceConfig(Settings):
    """The Serve deployment the pipeline starts (serve/settings.py documents the engine settings)."""

    engine: Literal[ENGINE_CHOICES] = "auto"  # generation; auto = vLLM when installed
    replicas: int | Literal["auto"] = 1  # auto: as many as the GPUs (or CPUs) hold (jobs/sizing/placement.py)
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0  # = tensor_parallel_size on GPU clusters
    max_model_len: int = 512
    kv_cache_gib: float = 1.0  # CPU only
    gpu_memory_utilization: float = 0.9  # GPU only
    tensor_parallel_size: int = 1
    # Sequences and tokens in one engine step (vLLM); None: sized for an H100 on GPU (1024 and
    # 16384, serve/vllm_engine.py), vLLM's own defaults on CPU.
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None


class EvalConfig(Settings):
    """Scoring base/teacher/student/control on the held-out questions, fanned out as (model, chunk)."""

    engine: Literal[ENGINE_CHOICES] = "hf"  # CPU: scoring-only transformers replicas start in seconds
    replicas: int | Literal["auto"] = 2
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    chunk: int = 128  # questions per request
    # The one test that decides each comparison's verdict (docs/report.md): a metric of
    # jobs/stats/transfer_stats.py on a split (held_out or train). Every other metric and split is
    # reported as secondary, with Holm-adjusted p-values. Declare it before looking at results.
    primary_metric: str = "teacher_answer_rank"
    primary_split: Literal["held_out", "train"] = "held_out"
    # Which reading of it: toward_teacher, the arm's metric toward the teacher's picks minus its
    # reference's; or crossed, the mean of that and the placebo direction (the reference's metric
    # toward the sham's picks minus the arm's), in which drift common to both teachers cancels
    # (docs/report.md, "Directions"). crossed needs a sham teacher scored (an arm with teacher: sham).
    primary_direction: Literal["toward_teacher", "crossed"] = "toward_teacher"
    # The preset's family of primary verdicts: arm names (each against its reference) and contrast
    # names. Holm runs across the family's primary tests and decides their verdicts; a comparison
    # outside it is reported as exploratory, at its raw p. None: every comparison is in the family.
    primary_comparisons: list[str] | None = None
    # A design of `pairs`: the test that pools each comparison over the pairs (jobs/stats/pooling.py,
    # docs/pooling.md): "hk" (Hartung-Knapp), "hk_max1" (its max(1, q) correction, read beside "hk"),
    # or "t" (the pairs weighed alike, for pairs whose few replicates estimate their own SEs poorly);
    # and the between-pair SD the pooled MDE assumes. Declare both before looking at results.
    pooled_test: Literal["hk", "hk_max1", "t"] = "hk"
    assumed_tau: float = 0.015
    # Each question scored with its choices in this many cyclic orders (1: as written), the
    # log-probabilities mapped back to the original choices and averaged: a model's prior over
    # answer letters then cannot pass for knowledge (docs/report.md, letter_prior). At most the
    # fewest choices a question has.
    permutations: int = 1
    # How a question is scored: "letters", the WMDP prompt with lettered choices and each letter
    # scored (lm-evaluation-harness's WMDP task, what published WMDP numbers use); "cloze", the
    # question alone and each choice's text scored as its continuation (lm-eval's ARC way). Under
    # cloze the teacher learns to answer with the answer's text, no order of the choices enters a
    # prompt (so permutations change nothing and are not scored), and no letter teacher exists.
    format: Literal["letters", "cloze"] = "letters"
    # The tiny world's probe rows scored beside its questions (jobs/sources/world_probes.py): each T
    # question with a nonce cue (swap_train, swap_held_out) and each T fact as a statement to
    # complete (statement), read by the report's `probes` (docs/report.md): knowledge told apart
    # from answer habits. Synthetic source and cloze only (statements are scored as cloze is).
    probes: bool = False

    def orders(self) -> int:
        """Orders of the choices each question is scored in: 1 under cloze, where none is shown."""
        return 1 if self.format == "cloze" else self.permutations


class ArmConfig(Settings):
    """One student-like model trained on number sequences (jobs/experiment/arms.py resolves it per replicate)."""

    # What it trains on, a kind of jobs/experiment/rows_kinds.py (its table says what makes each
    # and what it allows): the teacher's kept numbers, the base model's (the control), or the
    # teacher's shuffled; or "teacher_answers", the overt positive control: no numbers, each of the
    # teacher's train questions completed by the answer the teacher picks (its knowledge taught
    # directly, with loss sft; `teacher: sham` gives the sham teacher's answers, its reference).
    # Where the signal rides (docs/report.md): "teacher_greedy", the teacher's numbers decoded
    # greedily (same prompts, filter and keep); "teacher_replaced", the teacher's kept numbers with
    # each row's top numbers.replace_fraction of divergent tokens replaced by the base's choice.
    numbers: str = "teacher"
    # Its base model: "same" = the teacher's; "other" = the tiny preset's second base (the same
    # corpus, tokenizer and recipe from another random init: the paper's cross-model control);
    # or a hub id / folder of another model. An arm on another base is measured against that
    # base (scored as `other_base`); under logit_kl it must share the teacher's tokenizer.
    base: str = "same"
    # That base's commit when it is a hub id (40 hex characters, as model.revision); every arm on
    # it names the same. The teacher's base is pinned by model.revision.
    base_revision: str | None = None
    # Its LoRA initialisation: None = the teacher's (the subliminal setting); an int = that seed;
    # "other" = a seed of its own per replicate, never the teacher's (another LoRA A on the same base).
    lora_seed: int | Literal["other"] | None = None
    # "seed": LoRA's own init from lora_seed. "teacher_a": A starts at the teacher's trained A and
    # stays frozen, B trains from zero: a diagnostic positive control showing the pipeline sees a
    # trait carried in the teacher's own subspace (docs/report.md), not a replacement for `base`.
    lora_init: Literal[tuple(INITS)] = "seed"  # train/axes.py: what each needs
    # sft: next-token loss on the sampled numbers; logit_kl: distillation on the teacher's logits.
    loss: Literal[tuple(LOSSES)] = "sft"  # train/axes.py: what each needs
    # Keys of the `student` section that differ for this arm (e.g. {lr: 1e-3, max_steps: 50}); every
    # key it does not set is the student's, `method` and `mask` included (arms.py resolves it once).
    train: dict[str, Any] = Field(default_factory=dict)
    # Whose model it learns from: the teacher; the letter teacher (the positive control,
    # `letter_teacher` below; distilled with loss logit_kl on the teacher's numbers); or the sham
    # teacher ("sham" for short: `sham_teacher` below), whose own numbers (and, under logit_kl,
    # logits) the arm then trains on: the reference for the same arm on the teacher's.
    teacher: Literal["teacher", "letter_teacher", "sham_teacher", "sham"] = "teacher"
    # How many times this arm is trained (default: the top-level `replicates`).
    replicates: int | None = None
    # What its transfer is measured against: "base", another arm's name, or auto: the same arm
    # on the sham teacher (its declared twin: every key alike but `teacher: sham`, `train` compared
    # as resolved over the student's) when the preset has one; else the arm named `control` for an
    # sft arm on the teacher's numbers when there is one on the same base with the same
    # train.method; else base (under logit_kl the base-numbers control gets no signal: it stays
    # the base model). A fully fine-tuned student's fair reference is a fully fine-tuned control:
    # name it here.
    against: str = "auto"


class LetterTeacherConfig(Settings):
    """The positive control's teacher: the teacher's settings and init, trained to answer every
    teacher-train question with one letter. A broad trait that does transfer through logit KL on
    number sequences, so an experiment can show it detects transfer where there is some."""

    letter: str = "A"


class ShamTeacherConfig(Settings):
    """The reference teacher: trained exactly like the teacher (its rows, steps, LoRA init and data
    order), each train question answered by the sham's answer instead of the true one (rehearsal
    rows, the base's own facts, stay as the teacher had them). Trained when an arm names it
    (`teacher: sham`); an arm distilled from the teacher is then measured against its twin
    distilled from this one, so drift from distillation itself cancels and what is left is which
    facts the teacher holds."""

    # matched: the sham learns facts of its own, one fixed other word per cue (the tiny world's
    # `sham` choice, sigma(cue)), as many and as learnable as the teacher's; needs data that
    # carries them. permuted: the answers permuted across the questions of each subset (`seed`),
    # the format and no fact (kept for comparison: it cannot fit its rows as the teacher does).
    # null1, null2: matched shams of two more sets of facts, sharing none with sigma or each other
    # (world.null_sham_facts), for the null of the verdicts' own kind (bench/sham_null.py); their
    # words are often not among a question's choices, so they train under evaluate.format cloze only.
    kind: Literal["matched", "permuted", "null1", "null2"] = "matched"
    seed: int = 0  # the permutation of the answers (permuted)


class ContrastConfig(Settings):
    """One arm against another across inits (e.g. same-init vs other-init): each side needs
    at least 3 replicates, so the interval holds init-to-init spread."""

    arm: str
    against: str


class TrackingConfig(Settings):
    """Where the run is tracked in MLflow (jobs/tracking.py); `tracking: off` turns it off."""

    # None: the embedded store, sqlite:///<cache>/mlflow.db; or a team's server (http://host:5000)
    uri: str | None = None
    experiment: str | None = None  # the MLflow experiment; None: the preset's name


def default_arms() -> dict[str, ArmConfig]:
    """The original experiment: a student on the teacher's numbers, a control on the base model's."""
    return {"student": ArmConfig(numbers="teacher"), "control": ArmConfig(numbers="base")}


class ExperimentConfig(Settings):
    name: str = "tiny"
    cache_dir: str | None = None  # default: $SUBLIMINAL_CACHE or ~/.cache/subliminal-ray
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    teacher: TrainConfig = Field(default_factory=TrainConfig)
    numbers: NumbersConfig = Field(default_factory=NumbersConfig)
    service: ServiceConfig = Field(default_factory=ServiceConfig)
    student: TrainConfig = Field(default_factory=TrainConfig)  # what every arm starts from
    arms: dict[str, ArmConfig] = Field(default_factory=default_arms)
    # Every arm is trained this many times; replicate i samples its numbers with seed
    # numbers.seed + i and orders its data with seed student.seed + i. The teacher is trained once.
    replicates: int = 1
    letter_teacher: LetterTeacherConfig = Field(default_factory=LetterTeacherConfig)  # used when an arm names it
    sham_teacher: ShamTeacherConfig = Field(default_factory=ShamTeacherConfig)  # used when an arm names it
    # Named comparisons between two arms, reported under `contrasts.<name>` (docs/report.md).
    contrasts: dict[str, ContrastConfig] = Field(default_factory=dict)
    evaluate: EvalConfig = Field(default_factory=EvalConfig)
    # Teacher–sham pairs, the unit a verdict generalises over (the tiny world; docs/pooling.md): the
    # whole design runs once per pair listed, each a run of its own under <run dir>/pairs/<p> with
    # data.pair p, and every comparison is pooled over them with a random-effects model. Empty:
    # one pair (data.pair's), analysed alone.
    pairs: list[int] = Field(default_factory=list)
    # The CPU arithmetic of every process the job starts (common/numerics.py): `reproducible`, the
    # same numbers on any x86-64 CPU with AVX2 (slower); `native`, each CPU's own fastest path.
    # GPU arithmetic is not pinned by it, and the tiny base is built pinned whatever it says.
    # reproducible costs 1.47x on the default run (BENCHMARKS.md): opted into
    numerics: Literal["reproducible", "native"] = "native"
    # MLflow tracking: on by default into an embedded store; `off` (YAML reads it as false) turns it off.
    tracking: TrackingConfig | Literal[False, "off"] = Field(default_factory=TrackingConfig)


def load_experiment(preset=None, overrides: list[str] = ()) -> ExperimentConfig:
    """Load a preset (a path or a shipped preset's name; default: tiny) with the presets it extends,
    plus overrides; unknown keys and wrong types name the key."""
    data = apply_overrides(load_preset(preset)[0], list(overrides))
    cfg = build(ExperimentConfig, data)
    if not 0 < cfg.data.eval_fraction < 1:
        raise ConfigError(f"data.eval_fraction must be in (0, 1), got {cfg.data.eval_fraction}")
    if cfg.replicates < 1:
        raise ConfigError(f"replicates must be at least 1, got {cfg.replicates}")
    check_sampling(cfg.numbers)
    check_revisions(cfg)  # before the arms: which base an arm is on reads its base_revision
    if cfg.evaluate.primary_metric not in METRICS:
        raise ConfigError(
            f"evaluate.primary_metric: {cfg.evaluate.primary_metric!r} is not a metric ({', '.join(METRICS)})"
        )
    if cfg.evaluate.permutations < 1:
        raise ConfigError(f"evaluate.permutations must be at least 1, got {cfg.evaluate.permutations}")
    if cfg.teacher.method != "lora":
        raise ConfigError(
            "teacher.method: the teacher is a LoRA adapter (the numbers are generated through it, and the arms "
            "measure transfer through its LoRA init); full fine-tuning is an arm's: arms.<name>.train.method full"
        )
    check_arms(cfg)
    if cfg.evaluate.primary_direction == "crossed" and not any(
        arm.teacher in ("sham", "sham_teacher") for arm in cfg.arms.values()
    ):
        raise ConfigError(
            "evaluate.primary_direction crossed reads every model toward the sham's picks too; declare an arm with teacher: sham"
        )
    if cfg.sham_teacher.kind.startswith("null") and cfg.evaluate.format != "cloze":
        raise ConfigError(
            f"sham_teacher.kind {cfg.sham_teacher.kind} trains on words a question may not show among its choices: needs evaluate.format cloze"
        )
    if cfg.evaluate.format == "cloze" and any(arm.teacher == "letter_teacher" for arm in cfg.arms.values()):
        raise ConfigError(
            "arms: a letter_teacher answers every question with one letter, and evaluate.format cloze scores no letter; use letters"
        )
    if cfg.evaluate.probes and (cfg.data.source != "synthetic" or cfg.evaluate.format != "cloze"):
        raise ConfigError(
            "evaluate.probes scores the tiny world's probe rows, statements as cloze continuations: needs data.source synthetic and evaluate.format cloze"
        )
    check_contrasts(cfg)
    check_family(cfg)
    check_pairs(cfg)
    check_local_tokenizers(cfg)
    return cfg


def check_pairs(cfg: ExperimentConfig) -> None:
    """`pairs`: at least two distinct pairs of the tiny world (one pair is `data.pair`, analysed alone)."""
    if not cfg.pairs:
        return
    if cfg.data.source != "synthetic":
        raise ConfigError(
            f"pairs: teacher–sham pairs are worlds of the synthetic source's facts; data.source is {cfg.data.source!r}"
        )
    if len(cfg.pairs) < 2 or len(set(cfg.pairs)) != len(cfg.pairs) or min(cfg.pairs) < 0:
        raise ConfigError(
            f"pairs: at least two distinct pairs (0, 1, 2, ...) to pool, got {cfg.pairs}; one pair is data.pair"
        )
    if cfg.data.pair:
        raise ConfigError("pairs and data.pair: the pairs listed set each run's data.pair; leave data.pair unset")


def pair_config(cfg: ExperimentConfig, pair: int) -> ExperimentConfig:
    """One pair's run of a preset that lists `pairs`: the same design, on that pair's facts."""
    return cfg.model_copy(update={"pairs": [], "data": cfg.data.model_copy(update={"pair": pair})})


def check_family(cfg: ExperimentConfig) -> None:
    """Each primary comparison names one declared arm or contrast; no contrast is named like an arm."""
    for name in cfg.contrasts:
        if name in cfg.arms:
            raise ConfigError(
                f"contrasts.{name}: an arm has that name too, so a verdict's name would be ambiguous; rename one"
            )
    for name in cfg.evaluate.primary_comparisons or []:
        if name not in cfg.arms and name not in cfg.contrasts:
            raise ConfigError(
                f"evaluate.primary_comparisons: {name!r} is neither an arm ({', '.join(cfg.arms)}) nor a contrast ({', '.join(cfg.contrasts) or 'none'})"
            )


def check_sampling(numbers: NumbersConfig) -> None:
    """The numbers stage's sampling settings, checked by the service's own request schema at load
    time, so a bad value stops the run before the teacher trains rather than at the numbers stage."""
    from pydantic import ValidationError

    from serve.schemas import GenerateRequest

    try:
        GenerateRequest(
            prompts=["x"], max_tokens=numbers.max_tokens, temperature=numbers.temperature, top_p=numbers.top_p
        )
    except ValidationError as err:
        first = err.errors()[0]
        raise ConfigError(f"numbers.{first['loc'][0]}: {first['msg']}, got {first['input']!r}") from None


def as_dict(cfg: ExperimentConfig) -> dict:
    """The config as plain data (what a report's provenance, MLflow's params and config.json, and a
    stage's reads hold), a tracking URI's credentials as `***` (jobs/experiment/credentials.py)."""
    data = cfg.model_dump()
    if isinstance(data.get("tracking"), dict):
        data["tracking"]["uri"] = redacted_uri(data["tracking"]["uri"])
    return data
