"""The report's sections read from the evidence once every arm is measured (jobs/phases/report.py
measures the arms and calls these): the verdicts (`arms`, `contrasts`, `family`, `overt_control`,
`positive_control`) and the readings beside them (`calibration`, `sham_fit`, `probes`,
`where_signal_rides` and the headline `transfer`). Each is assembled once from the records the
statistics (jobs/stats/) return: the family's Holm and the overt control give new values, read into
each arm's verdict."""

from __future__ import annotations

from jobs.experiment.cast import Cast
from jobs.experiment.config import ExperimentConfig
from jobs.reporting.schema import Arm, Calibration, Contrast, HeadlineTransfer, MeasuredArm
from jobs.stats.evidence import Evidence, apply_family
from jobs.stats.probes import probe_report
from jobs.stats.sham_fit import sham_fit
from jobs.stats.share import where_signal_rides
from jobs.stats.verdicts import changed, fraction_phrase, overt_control, positive_control, verdict


def verdict_sections(
    cfg: ExperimentConfig, measured: dict[str, MeasuredArm], evidence: Evidence, overt_name: str | None
) -> dict:
    """report.json's `arms`, `contrasts`, `family`, `overt_control` and `positive_control`: the
    declared contrasts computed, Holm across the preset's primary verdicts before any verdict is read
    (arm and contrast names never clash: config.check_family), every arm's effect as a fraction of
    the overt control's (`overt_name`: jobs/experiment/cast.overt_arm), then each comparison's verdict."""
    contrasts = {}
    for name, c in cfg.contrasts.items():
        contrast = {"arm": c.arm, "against": c.against, **evidence.compare(c.arm, c.against).given()}
        if (series := evidence.by_step(c.arm, c.against)) is not None:
            contrast["by_step"] = series
        contrasts[name] = Contrast.model_validate(contrast)
    family, decided = apply_family(
        {name: arm.transfer for name, arm in measured.items()} | contrasts, cfg.evaluate.primary_comparisons
    )
    against = {name: arm.against for name, arm in measured.items()}
    overt, fractions = overt_control({name: decided[name] for name in measured}, against, overt_name, evidence)
    arms = {}
    for name, arm in measured.items():
        overt_share = {"fraction_of_overt": fractions[name]} if overt is not None else {}
        sentence = verdict(name, arm.against, decided[name]) + fraction_phrase(fractions.get(name))
        beyond = changed(name, arm.against, decided[name], arm.against_base, arm.base)
        arms[name] = Arm.model_validate(
            {**arm.given(), "transfer": decided[name], **overt_share, "verdict": sentence, "changed": beyond}
        )
    contrasts = {name: decided[name] for name in contrasts}
    contrasts = {name: c.with_(verdict=verdict(c.arm, c.against, c)) for name, c in contrasts.items()}
    out = {"arms": arms, "contrasts": contrasts, "family": family}
    if overt is not None:
        out["overt_control"] = overt
    control = positive_control(
        {name: arm.teacher for name, arm in arms.items()}, {name: arm.transfer for name, arm in arms.items()}
    )
    return out | ({"positive_control": control} if control is not None else {})


def evidence_sections(
    cfg: ExperimentConfig,
    cast: Cast,
    measured: dict[str, MeasuredArm],
    evidence: Evidence,
    both: dict,
) -> dict:
    """report.json's `calibration`, `sham_fit`, `probes`, `where_signal_rides` and `transfer`: what
    the evidence says beside the verdicts, each section present only where the run has what it reads.
    `cast`: the run's models (jobs/experiment/cast.py); `both`: every model's rows of every split."""
    sections = {  # how flat each model's choices are, and the temperature that fits its known split
        "calibration": {
            name: Calibration(temperature=evidence.temperatures.get(name), entropy=evidence.entropy[name])
            for name in cast.final  # every model as trained (no earlier snapshots)
        }
    }
    fitted = {name: [both[name]] for name in cast.fixed} | {
        arm: [both[m.name] for m in cast.arms[arm]] for arm in cfg.arms
    }
    if (fit := sham_fit(fitted)) is not None:  # the matched sham holds its facts as the teacher holds its own?
        sections["sham_fit"] = fit
    same_base = {arm: m.against for arm, m in measured.items() if evidence.base_of[arm] == evidence.base_of[m.against]}
    probe_arms = {
        arm: (against, evidence.teacher_of[arm], evidence.placebo_of(arm)) for arm, against in same_base.items()
    }
    if (probes := probe_report(both, evidence.members, probe_arms)) is not None:  # evaluate.probes: knowledge or habit?
        sections["probes"] = probes
    # masked, replaced, greedy: as the expansion resolved each arm, shares of the student's effect
    rides = {m.arm: m.signal for m in cast.models if m.signal}
    if rides and "student" in measured and "student" not in rides:
        sections["where_signal_rides"] = where_signal_rides(evidence, "student", measured["student"].against, rides)
    if (transfer := headline_transfer(measured, evidence)) is not None:
        sections["transfer"] = transfer
    return sections


def headline_transfer(measured: dict[str, MeasuredArm], evidence: Evidence) -> HeadlineTransfer | None:
    """The original experiment's measure: held-out agreement with the teacher, student - control
    (None without both arms)."""
    if "student" not in measured or "control" not in measured:
        return None
    result = evidence.compare("student", "control").cell("held_out", "agreement")
    return HeadlineTransfer(
        value=result.value,
        ci95=result.ci95,
        p_value=result.p_value,
        mde=result.mde,
        student_teacher_agreement=measured["student"].mean.teacher_agreement,
        control_teacher_agreement=measured["control"].mean.teacher_agreement,
        replicate_pairs=min(len(measured[arm].replicates) for arm in ("student", "control")),
    )
