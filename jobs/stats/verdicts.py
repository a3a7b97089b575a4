"""The verdicts in words: one sentence per comparison, the family's table, and report.md's tables.

jobs/stats/evidence.py computes every comparison; this module says what they show: the primary
test's phrase and the verdict it decides (detected toward the teacher, or the difference the design
could have detected), the overt and letter positive controls' sentences and each arm's fraction of
overt transfer, and the Markdown of the evidence section (the family of primary verdicts, each
comparison's tests, its metrics side by side in every direction, its weight-space reading).
"""

from __future__ import annotations

from jobs.stats.evidence import SERIES, SPLITS, Evidence, toward_teacher
from jobs.stats.transfer_stats import METRICS


def interval(ci) -> str:
    return "-" if ci is None else f"{ci[0]:+.4f} to {ci[1]:+.4f}"


def positive_control(arms: dict) -> dict | None:
    """Did the arms of the letter teacher (the positive control) show transfer on their primary test? None without them."""
    names = [name for name, arm in arms.items() if arm["teacher"] == "letter_teacher"]
    if not names:
        return None
    detected = any(primary_finding(arms[name]["transfer"]) for name in names)
    sentence = (
        "The positive control (a teacher that always answers one letter) was detected: this experiment can see transfer where there is some."
        if detected else
        "The positive control (a teacher that always answers one letter) was NOT detected: this experiment cannot see even a strong trait transfer, so its null on the teacher says nothing."
    )  # fmt: skip
    return {"arms": names, "detected": detected, "verdict": sentence}


def overt_control(arms: dict, name: str | None, ev: Evidence) -> dict | None:
    """The overt positive control, `name` (an arm taught its teacher's answers directly:
    jobs/experiment/arms.overt_arm), and every arm's effect as a fraction of its effect
    (`fraction_of_overt`: Evidence.fraction_of, held out, with Fieller's interval), so a null reads
    as "less than x% of overt transfer" at what the data allow. No fractions when the overt control
    itself was not detected: then nothing here can see knowledge move."""
    if name is None:
        return None
    scale, detected = arms[name]["transfer"]["primary"]["value"], primary_finding(arms[name]["transfer"]) is not None
    for arm_name, arm in arms.items():
        arm["fraction_of_overt"] = ev.fraction_of(arm_name, arm["against"], name, arms[name]["against"]) if detected else None
    sentence = (
        f"The overt positive control ({name}: taught the teacher's own answers to its train questions) was detected: this design sees "
        "the teacher's knowledge move when it is taught, and each arm's held-out effect is also given as a fraction of its held-out effect."
        if detected else
        f"The overt positive control ({name}: taught the teacher's own answers to its train questions) was NOT detected: this design "
        "cannot see the teacher's knowledge move even when it is taught directly, so no null here says anything about knowledge."
    )  # fmt: skip
    return {"arm": name, "detected": detected, "effect": scale, "verdict": sentence}


def fraction_phrase(arm: dict) -> str:
    """The verdict's tail: the arm's held-out effect as a share of overt transfer (empty without one)."""
    f = arm.get("fraction_of_overt")
    if not f or f["value"] is None:
        return ""
    where = f" on held-out {f['metric']}"
    if f["ci95"] is None:
        return f" That is {f['value']:.0%} of overt transfer{where} (no interval)."
    low, high = ("unbounded" if c is None else f"{c:.0%}" for c in f["ci95"])
    return f" That is {f['value']:.0%} of overt transfer{where} (95% CI {low} to {high}, Fieller, the overt effect's uncertainty included)."


def describe_test(split: str, metric: str, direction: str = "toward_teacher") -> str:
    return f"{metric} on {split}" + (" (crossed: toward the teacher's picks and away from the sham's)" if direction == "crossed" else "")


def _phrase(split: str, metric: str, r: dict, p_key: str = "p_value") -> str:
    family = f", Holm p over the family={r['p_family']:.2g}" if p_key == "p_value" and r.get("p_family") is not None else ""
    name = describe_test(split, metric, r.get("direction", "toward_teacher"))
    return f"{name} {r['value']:+.4f} (95% CI {interval(r['ci95'])}, {'p' if p_key == 'p_value' else 'Holm p'}={r[p_key]:.2g}{family})"


def primary_finding(transfer: dict) -> str | None:
    """The primary test as a phrase when it detected a move toward the teacher, else None."""
    r = transfer.get("primary")
    return _phrase(r["split"], r["metric"], r) if r and r["detected"] and toward_teacher(r["metric"], r["value"]) else None


def verdict(name: str, against: str, transfer: dict) -> str:
    """One plain sentence decided by the primary test alone: detected, or what size the design could
    have detected; secondary tests that pass Holm are named after it."""
    r = transfer["primary"]
    test = describe_test(r["split"], r["metric"], r.get("direction", "toward_teacher"))
    if r.get("exploratory"):
        name = f"(exploratory, outside the preset's primary comparisons) {name}"
    if (found := primary_finding(transfer)) is not None:
        sentence = f"{name} vs {against}: transfer detected on the primary test, {found}."
    elif r.get("note"):
        sentence = f"{name} vs {against}: no test on the primary metric ({test}): {r['note']}"
    elif r["mde"] is None:
        sentence = (
            f"{name} vs {against}: no transfer detected on {test}; with one replicate the spread across seeds is unknown, so no effect size can be promised."
        )
    else:
        p = f"p={r['p_value']:.2g}" + (f", Holm p over the family={r['p_family']:.2g}" if r.get("p_family") is not None else "")
        sentence = (f"{name} vs {against}: no transfer detected on the primary test ({test} {r['value']:+.4f}, 95% CI {interval(r['ci95'])}, {p}); "
                    f"this design would have detected a difference of {r['mde']:.4f} with 80% power.")  # fmt: skip
    secondary = [
        _phrase(split, metric, t, "p_holm") for split in SPLITS for metric, t in transfer[split].items()
        if metric != "mde" and "p_holm" in t and t["detected"] and toward_teacher(metric, t["value"])
    ]  # fmt: skip
    return sentence + (f" Secondary (Holm): {'; '.join(secondary)}." if secondary else "")


def family_table(arms: dict, contrasts: dict, family: dict) -> list[str]:
    """The preset's primary verdicts side by side: raw p and p Holm-adjusted over the family."""
    which = "declared in evaluate.primary_comparisons" if family["declared"] else "every comparison: the preset names none"
    lines = ["", f"Primary verdicts, Holm across the family of {family['size']} ({which}); the rest are exploratory, at raw p.", ""]
    lines += ["| comparison | primary test | difference | 95% CI | p | Holm p (family) | MDE | detected |", "|---|---|---|---|---|---|---|---|"]
    rows = [(f"{name} vs {arm['against']}", arm["transfer"]["primary"]) for name, arm in arms.items()]
    rows += [(f"contrast {name}: {c['arm']} vs {c['against']}", c["primary"]) for name, c in contrasts.items()]
    for title, r in rows:
        lines.append(f"| {title} | {describe_test(r['split'], r['metric'], r.get('direction', 'toward_teacher'))} | {_cells(r)} |")
    return lines


def side_by_side(result: dict) -> list[str]:
    """A comparison's metrics in every direction, on the primary split: toward the teacher's picks,
    toward the placebo's (its reference minus the arm), and crossed; raw p (the declared primary
    alone decides; these show whether it holds across metrics and directions)."""
    directions, split = result.get("directions"), result["primary"]["split"]
    if not directions:
        return []
    lines = ["", f"Side by side on {split} (raw p; the primary decides, these show whether it is robust; placebo: {directions['placebo']}):", ""]
    lines += ["| metric | toward the teacher's picks | toward the placebo's picks | crossed |", "|---|---|---|---|"]
    for metric in directions["crossed"][split]:
        cells = [result[split][metric], directions["toward_placebo"][split][metric], directions["crossed"][split][metric]]
        lines.append(f"| {metric} | " + " | ".join(_short(r) for r in cells) + " |")
    return lines


def _short(r: dict) -> str:
    """value (CI, p): a result's cells in one."""
    if r["value"] is None:
        return "-"
    p = "" if r.get("p_value") is None else f", p {r['p_value']:.2g}"
    return f"{r['value']:+.4f}" + ("" if r["ci95"] is None else f" ({interval(r['ci95'])}{p})")


def markdown_tables(arms: dict, contrasts: dict, family: dict | None = None) -> list[str]:
    """report.md's evidence section: verdicts, the family of primary verdicts, then one table per
    comparison, its primary test first."""
    lines = ["", "## Transfer evidence", ""]
    lines += [f"- {arm['verdict']}" for arm in arms.values() if "verdict" in arm]
    lines += [f"- contrast {name}: {c['verdict']}" for name, c in contrasts.items()]
    control = positive_control(arms)
    lines += [f"- {control['verdict']}"] if control else []
    lines += family_table(arms, contrasts, family) if family else []
    comparisons = [
        (f"{name} vs {arm['against']}" + (f" ({arm['reference']})" if "reference" in arm else ""), arm["transfer"], arm.get("by_step"), arm.get("weight_space"))
        for name, arm in arms.items()
    ]
    comparisons += [(f"contrast {name}: {c['arm']} vs {c['against']}", c, c.get("by_step"), None) for name, c in contrasts.items()]
    head = ["| split | metric | difference | 95% CI | p | Holm p | MDE | detected |", "|---|---|---|---|---|---|---|---|"]
    for title, result, series, weights in comparisons:
        primary = result["primary"]
        crossed = primary.get("direction") == "crossed"
        rest = [(s, m) for s in SPLITS for m in METRICS if (crossed or (s, m) != (primary["split"], primary["metric"])) and result[s][m]["value"] is not None]
        label = f"**{primary['metric']}** (primary{', crossed' if crossed else ''})"
        lines += ["", f"### {title}", "", *head, f"| {primary['split']} | {label} | {_cells(primary)} |"]
        lines += [f"| {split} | {metric} | {_cells(result[split][metric])} |" for split, metric in rest]
        lines += side_by_side(result)
        if weights and "crossed" in weights:
            readings = "; ".join(f"{key.replace('_', ' ')} {_short(weights[key])}" for key in ("toward_teacher", "toward_placebo", "crossed"))
            lines += ["", f"Weight space (the share of each teacher's LoRA update carried, arm against reference; placebo {weights['placebo']}): {readings}."]
        if series and "points" in series:
            lines += ["", "Against training steps (each side at the same snapshot):", "", *head]
            for point in series["points"]:
                steps = ", ".join(str(s) for s in sorted(set(point["steps"])))
                lines += [f"| {steps}: {split} | {metric} | {_cells(point[split][metric])} |" for split in SPLITS for metric in SERIES]
            if last := series.get("last_interval"):
                steps = f"{'/'.join(map(str, last['from_steps']))} -> {'/'.join(map(str, last['to_steps']))}"
                lines += ["", f"Still learning at the end? {last['metric']} on {last['split']}, steps {steps}: {_cells(last)}"]
        elif series:
            lines += ["", f"Against training steps: {series['note']}"]
    return lines


def _cells(r: dict) -> str:
    if r["value"] is None:
        return f"- | - | - | - | - | {r.get('note', '')}"
    p, mde = ("-", "-") if r["p_value"] is None else (f"{r['p_value']:.3g}", f"{r['mde']:.4f}")
    if "p_holm" in r:
        holm_p = "-" if r["p_holm"] is None else f"{r['p_holm']:.3g}"
    else:  # the primary test: adjusted over the preset's family of primary comparisons
        holm_p = "exploratory" if r.get("exploratory") else ("-" if r.get("p_family") is None else f"{r['p_family']:.3g} (family)")
    return f"{r['value']:+.4f} | {interval(r['ci95'])} | {p} | {holm_p} | {mde} | {r['detected']}" + (f" ({r['note']})" if r.get("note") else "")
