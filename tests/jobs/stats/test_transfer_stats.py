"""jobs/stats/transfer_stats.py on data with known truth: McNemar's exact test, two-sided calibration of
the interval and the test under nulls (unpaired, paired, against a fixed model), the standard
error against the spread it claims, power at the reported MDE, zero spread, and Holm.

Measured with the seeds below (2,000 nulls each; RMS reported SE over the empirical SD of the
value): unpaired 2.75% false positives, coverage 97.25%, SE ratio 1.08 (the cluster bootstrap
before, counting the interaction twice: 1.8%, 98.2%, 1.26); paired, rows sharing a replicate
offset of SD 0.2: 6.0%, 94.0%, 1.07, and the unpaired analysis of the same data 1.91x as wide;
against a fixed model on a subset: 4.95%, 95.05%, 1.01; power at the mean reported MDE 75.3%
(74.1% with the normal-theory MDE, t_0.975 + t_0.8, before the noncentral t).
The unpaired nulls sit low and the SE ratio above 1 where the replicate component, estimated
from 2 df, falls below 0 and is set to 0, and from the few df that estimate has."""

import math

import numpy as np
import pytest
from scipy import stats

from jobs.stats.transfer_stats import (
    choice_entropy,
    cluster_ids,
    detected,
    effect,
    fitted_temperature,
    holm,
    question_metrics,
)

NULLS = 2000


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p from the discordant counts, written out."""
    n, k = b + c, min(b, c)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def test_one_replicate_one_question_per_cluster_is_mcnemar():
    rng = np.random.default_rng(0)
    a = (rng.random(300) < 0.55).astype(float)
    b = (rng.random(300) < 0.45).astype(float)
    result = effect(a, b, np.arange(300), binary=True)
    up, down = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    assert result.p_fixed_models == pytest.approx(mcnemar_exact(up, down), rel=1e-9)
    assert result.value == pytest.approx(a.mean() - b.mean())
    # One trained model a side says nothing about other seeds: no interval for them.
    assert result.ci95 is result.p_value is result.mde is None and not detected(result)
    # Against a fixed model (base) only a's seeds vary; with one of them, still none; paired, none either.
    assert effect(a, b, np.arange(300), binary=True, b_fixed=True).p_value is None
    assert effect(a, b, np.arange(300), binary=True, paired=True).p_value is None


def simulated(
    rng,
    replicates=3,
    shift=0.0,
    model_sd=0.05,
    cluster_sd=0.3,
    n_clusters=40,
    per_cluster=8,
    shared_sd=0.0,
    b_fixed=False,
):
    """Continuous per-question scores of two groups of models on the same questions. Each
    model (a training seed) has its own overall offset (model_sd) and its own offset per
    question cluster (cluster_sd): the spread a real replicate brings. Group a is `shift` up.
    shared_sd: an offset of replicate i that a's row i and b's row i share (the same numbers and
    data order). b_fixed: b is one model with no overall offset of its own (the fixed reference,
    at the population's mean), its cluster offsets and noise part of which questions were asked."""
    clusters = np.repeat(np.arange(n_clusters), per_cluster)
    questions = rng.normal(0, 1, clusters.size)  # what every model shares: cancels in a difference
    shared = rng.normal(0, shared_sd, (replicates, 1))

    def models(rows, delta, model_sd):
        own = rng.normal(0, model_sd, (rows, 1)) + rng.normal(0, cluster_sd, (rows, n_clusters))[:, clusters]
        return questions + delta + own + rng.normal(0, 0.5, (rows, clusters.size))

    b = models(1, 0.0, 0.0) if b_fixed else models(replicates, 0.0, model_sd) + shared
    return models(replicates, shift, model_sd) + shared, b, clusters


def standard_error(result: dict) -> float:
    return (result.ci95[1] - result.ci95[0]) / 2 / stats.t.ppf(0.975, result.df)


def assert_calibrated(results: list[dict]) -> None:
    """Two-sided bands: at 2,000 nulls a rate's standard error is 0.5 points, so 5% +- 3 is +- 6 of them."""
    false_positives = np.mean([detected(r) for r in results])
    coverage = np.mean([r.ci95[0] <= 0 <= r.ci95[1] for r in results])
    se_ratio = np.sqrt(np.mean([standard_error(r) ** 2 for r in results])) / np.std([r.value for r in results])
    assert 0.02 <= false_positives <= 0.08, false_positives
    assert 0.92 <= coverage <= 0.98, coverage
    # Each source of chance counted once: the variance it reports is the variance the value has
    # (counting the interaction twice made this 1.25).
    assert 0.85 <= se_ratio <= 1.15, se_ratio


@pytest.fixture(scope="module")
def unpaired_nulls() -> list[dict]:
    rng = np.random.default_rng(7)
    return [effect(*simulated(rng), binary=False) for _ in range(NULLS)]


def test_testing_one_model_a_side_over_questions_finds_effects_that_are_not_there():
    # What a test over questions alone does with one model per side: the models' own quirks look like an effect.
    rng = np.random.default_rng(7)
    results = [
        effect(a, b, np.arange(clusters.size), binary=False)
        for a, b, clusters in (simulated(rng, replicates=1) for _ in range(150))
    ]
    assert np.mean([r.p_fixed_models < 0.05 for r in results]) > 0.3


def test_three_replicates_a_side_are_calibrated(unpaired_nulls):
    assert_calibrated(unpaired_nulls)


def test_pairing_by_replicate_is_calibrated_and_removes_the_shared_draw():
    # Replicate i's numbers and data order move a's row i and b's row i alike (offset SD 0.2, four
    # times a model's own): it cancels in the difference, and only the paired analysis knows.
    rng = np.random.default_rng(8)
    data = [simulated(rng, shared_sd=0.2) for _ in range(NULLS)]
    paired = [effect(a, b, clusters, binary=False, paired=True) for a, b, clusters in data]
    assert_calibrated(paired)
    unpaired = [effect(a, b, clusters, binary=False) for a, b, clusters in data]
    width = lambda results: np.mean([r.ci95[1] - r.ci95[0] for r in results])  # noqa: E731
    assert width(unpaired) >= 1.5 * width(paired)
    with pytest.raises(ValueError):
        effect(data[0][0], data[0][1][:2], data[0][2], binary=False, paired=True)


def test_against_a_fixed_model_on_a_subset_is_calibrated():
    # Half the questions outside the metric's subset (NaN, the same for every row): clusters of unequal size.
    rng = np.random.default_rng(9)
    results = []
    for _ in range(NULLS):
        a, b, clusters = simulated(rng, b_fixed=True)
        outside = rng.random(clusters.size) < 0.5
        results.append(
            effect(np.where(outside, np.nan, a), np.where(outside, np.nan, b), clusters, binary=False, b_fixed=True)
        )
    assert_calibrated(results)


def test_power_at_the_reported_mde_is_about_eighty_percent(unpaired_nulls):
    mde = np.mean([r.mde for r in unpaired_nulls])
    rng = np.random.default_rng(3)
    results = [effect(*simulated(rng, shift=mde), binary=False) for _ in range(1000)]
    power = np.mean([detected(r) and r.value > 0 for r in results])
    assert 0.7 <= power <= 0.9, power


def test_zero_spread_gives_no_interval_and_says_so():
    clusters = np.repeat(np.arange(10), 4)
    right, base = np.ones((3, 40)), np.zeros((1, 40))
    for result in (
        effect(right, base, clusters, binary=True, b_fixed=True),  # every replicate right on every question
        effect(right, right, clusters, binary=True),  # no difference at all
        effect(right + 0.5, right, clusters, binary=False, paired=True),  # the same shift everywhere
    ):
        assert result.ci95 is result.p_value is result.mde is None and not detected(result)
        assert result.note.startswith("zero spread")
    assert effect(right, base, clusters, binary=True, b_fixed=True).value == 1.0


def test_holm_by_hand():
    # m = 4 (None not counted): 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (monotone).
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None, "e": 0.005}) == pytest.approx(
        {"a": 0.03, "b": 0.06, "c": 0.06, "d": None, "e": 0.02}
    )
    assert holm({"x": 0.5, "y": 0.6}) == {"x": 1.0, "y": 1.0}  # 0.5 x 2 capped at 1, then monotone
    assert holm({"x": None}) == {"x": None} and holm({}) == {}


def test_question_metrics_from_stored_logprobs():
    lp = lambda *p: list(np.log(p))  # noqa: E731
    base = [
        {"prediction": 0, "answer": 1, "logprobs": lp(0.7, 0.1, 0.1, 0.1), "question": "q0"},
        {"prediction": 1, "answer": 1, "logprobs": lp(0.1, 0.7, 0.1, 0.1), "question": "q1"},
    ]
    teacher = [
        {**base[0], "prediction": 1, "logprobs": lp(0.1, 0.7, 0.1, 0.1)},
        {**base[1], "prediction": 2, "logprobs": lp(0.1, 0.1, 0.7, 0.1)},
    ]
    student = [
        {**base[0], "prediction": 1, "logprobs": lp(0.2, 0.6, 0.1, 0.1)},
        {**base[1], "prediction": 1, "logprobs": lp(0.1, 0.6, 0.2, 0.1)},
    ]
    m = question_metrics(student, teacher, base)
    assert m["agreement"].tolist() == [1.0, 0.0]
    assert m["agreement_teacher_right"][0] == 1.0 and np.isnan(m["agreement_teacher_right"][1])
    assert m["agreement_teacher_wrong"][1] == 0.0 and np.isnan(m["agreement_teacher_wrong"][0])
    assert m["teacher_answer_logprob"] == pytest.approx([math.log(0.6 / 0.1), math.log(0.2 / 0.1)])
    assert m["teacher_answer_rank"] == pytest.approx([1.0, 2 / 3])  # q1: C (0.2) above A and D (0.1), below B (0.6)
    tie = [{**student[0], "logprobs": lp(0.4, 0.4, 0.1, 0.1)}, student[1]]
    assert question_metrics(tie, teacher, base)["teacher_answer_rank"][0] == pytest.approx(5 / 6)  # B ties A: a half
    assert m["label_nll"] == pytest.approx([-math.log(0.6), -math.log(0.6)])
    # The teacher picks B and C once each where base picked A and B: C gained, A lost.
    assert m["letter_bias"].tolist() == [0.0, 0.0]
    assert question_metrics(teacher, teacher, base)["letter_bias"].tolist() == [0.0, 0.5]
    assert cluster_ids(
        [{"question": "x", "cluster": "k"}, {"question": "y", "cluster": "k"}, {"question": "z"}]
    ).tolist() == [0, 0, 1]


def test_teacher_answer_rank_does_not_move_when_choices_only_flatten():
    """A student whose choice distributions flatten (a temperature on its scores) raises
    log p(teacher's answer) wherever it was below its share, but keeps every choice's place."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(50, 4)) * 2
    renorm = lambda z: z - np.log(np.exp(z).sum(1, keepdims=True))  # noqa: E731
    rows = lambda z: [  # noqa: E731
        {"prediction": int(np.argmax(r)), "answer": 0, "logprobs": r.tolist(), "question": f"q{i}"}
        for i, r in enumerate(renorm(z))
    ]
    base = rows(logits)
    teacher = rows(rng.normal(size=(50, 4)) * 2)
    sharp, flat = question_metrics(base, teacher, base), question_metrics(rows(logits / 4), teacher, base)
    assert flat["teacher_answer_rank"].tolist() == sharp["teacher_answer_rank"].tolist()
    # the logprob metric reads it as transfer
    assert flat["teacher_answer_logprob"].mean() > sharp["teacher_answer_logprob"].mean() + 0.2
    swapped = logits.copy()
    t_pred = np.array([r["prediction"] for r in teacher])
    swapped[np.arange(50), t_pred] = logits.max(1) + 1  # the teacher's answer moved to the top
    assert question_metrics(rows(swapped), teacher, base)["teacher_answer_rank"].tolist() == [1.0] * 50


def test_a_fitted_temperature_takes_flattening_out_of_the_log_probability():
    """True answers drawn from softmax(z): the base reports log softmax(z) (temperature 1 fits it),
    a flattened student log softmax(z / 2) (0.5 fits it). Its raw log p of the teacher's pick moves
    wherever that pick had less than its share; at the fitted temperatures it does not move, and
    its choices are flatter (higher entropy)."""
    rng = np.random.default_rng(0)
    z = rng.normal(0, 2.0, (3000, 4))
    # the same questions for both
    answers = [int(rng.choice(4, p=np.exp(row))) for row in z - np.log(np.exp(z).sum(1, keepdims=True))]

    def rows(scale):
        lp = z / scale - np.log(np.exp(z / scale).sum(1, keepdims=True))
        return [{"logprobs": list(p), "answer": a, "prediction": int(np.argmax(p))} for p, a in zip(lp, answers)]

    base, student = rows(1.0), rows(2.0)
    tau_base, tau_student = fitted_temperature(base), fitted_temperature(student)
    assert tau_base == pytest.approx(1.0, rel=0.1) and tau_student == pytest.approx(0.5, rel=0.1)
    teacher = [{**r, "prediction": int(np.argmin(r["logprobs"]))} for r in base]  # picks the base's least likely choice
    metrics = question_metrics(student, teacher, base, (tau_student, tau_base))
    assert metrics["teacher_answer_logprob"].mean() > 0.5
    assert abs(metrics["teacher_answer_logprob_calibrated"].mean()) < 0.01
    # no temperatures, not measured
    assert np.isnan(question_metrics(student, teacher, base)["teacher_answer_logprob_calibrated"]).all()
    assert choice_entropy(student) > choice_entropy(base)
    assert choice_entropy([{"logprobs": [np.log(0.25)] * 4}]) == pytest.approx(np.log(4))


def test_the_calibrated_change_of_a_question_with_fewer_choices_is_its_own_softmax():
    """Rows of 3 and 4 choices in one call: each row renormalised over its own choices, as one
    question alone would be (the arithmetic runs on one padded array)."""
    three, four = np.log([0.5, 0.3, 0.2]), np.log([0.4, 0.3, 0.2, 0.1])
    rows = [
        {"logprobs": list(three), "answer": 0, "prediction": 0},
        {"logprobs": list(four), "answer": 1, "prediction": 0},
    ]
    base = [
        {"logprobs": list(np.log([1 / 3] * 3)), "answer": 0, "prediction": 0},
        {"logprobs": list(np.log([0.25] * 4)), "answer": 1, "prediction": 1},
    ]
    teacher = [{**rows[0], "prediction": 2}, {**rows[1], "prediction": 3}]
    tau = 2.0

    def at(lp, t):
        z = np.asarray(lp) / tau
        return z[t] - np.log(np.exp(z).sum())

    got = question_metrics(rows, teacher, base, (tau, 1.0))["teacher_answer_logprob_calibrated"]
    assert got.tolist() == pytest.approx([at(three, 2) - np.log(1 / 3), at(four, 3) - np.log(0.25)], abs=1e-12)


def test_p_only_gives_the_full_tests_value_interval_and_p_and_nothing_else():
    """What a test inverted over a grid reads (jobs/stats/share.py) is the full test's, paired and
    unpaired, and the parts it skips are None, not stale."""
    rng = np.random.default_rng(3)
    clusters = np.repeat(np.arange(20), 5)
    a, b = rng.normal(0.1, 1, (3, 100)), rng.normal(0, 1, (3, 100))
    for paired in (False, True):
        full, short = (
            effect(a, b, clusters, binary=False, paired=paired),
            effect(a, b, clusters, binary=False, paired=paired, p_only=True),
        )
        assert (short.value, short.ci95, short.p_value, short.df) == (full.value, full.ci95, full.p_value, full.df)
        assert short.mde is short.p_fixed_models is None and full.mde > 0 and full.p_fixed_models is not None
