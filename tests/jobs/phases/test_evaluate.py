"""The evaluate phase's scoring (jobs/phases/evaluate.py) with the choices in several cyclic orders
(`evaluate.permutations`): the rotation and its inverse, the averaged log-probabilities, and the
letter prior (jobs/stats/accuracy.py) they make visible; then the same through a real service, and
a letter teacher trained as the positive control's is, seen through it."""

import math

import pytest

from common.config import ConfigError
from jobs.phases.evaluate import check_orders, over_orders, rotated, score_models, unrotated
from jobs.sources.wmdp import synthetic_questions
from jobs.stats.accuracy import accuracy_over_orders, letter_prior
from serve.launch import start_service, stop_service
from serve.schemas import Question, ScoreResult
from serve.settings import ServiceSettings

APP = "t-orders"


def scored_by(prefers, questions: list[dict], orders: int) -> list[dict]:
    """Rows as score_models makes them, from a stand-in scorer: `prefers(question shown)` gives the
    probability of each letter shown. It stands in for the model so the arithmetic has known truth."""
    rows = []
    for q in questions:
        body = Question(question=q["question"], choices=q["choices"], answer=q["answer"])
        results = []
        for order in range(orders):
            shown = rotated(body, order)
            logprobs = [math.log(p) for p in prefers(shown)]
            results.append(
                ScoreResult(prediction=max(range(4), key=logprobs.__getitem__), logprobs=logprobs, truncated_tokens=0)
            )
        rows.append({**q, **over_orders(results)})
    return rows


# every answer is A
QUESTIONS = [{"question": f"q{i}", "choices": ["w", "x", "y", "z"], "answer": 0, "subset": "bio"} for i in range(20)]


def test_a_rotation_and_its_inverse_put_each_log_probability_back_on_its_choice():
    q = Question(question="q", choices=["w", "x", "y", "z"], answer=1)
    for order in range(4):
        shown = rotated(q, order)
        assert shown.choices[shown.answer] == "x"  # the answer follows its text
        by_letter = [float(ord(c)) for c in shown.choices]  # a log-probability that names its choice
        assert unrotated(by_letter, order) == [float(ord(c)) for c in q.choices]


def test_a_pure_letter_preference_scores_chance_once_the_choices_are_rotated():
    """A model that always picks A, on questions whose answer is always A: 100% with the choices as
    written, exactly 1/4 over 4 orders, and its letter prior shows where the score came from."""
    always_a = lambda shown: [0.7, 0.1, 0.1, 0.1]  # noqa: E731
    as_written = scored_by(always_a, QUESTIONS, 1)
    assert accuracy_over_orders(as_written) == 1.0 and letter_prior(as_written) == [1.0, 0.0, 0.0, 0.0]
    rotated_rows = scored_by(always_a, QUESTIONS, 4)
    assert accuracy_over_orders(rotated_rows) == 0.25 and letter_prior(rotated_rows) == [1.0, 0.0, 0.0, 0.0]
    for row in rotated_rows:  # averaged, no choice is preferred: the letter carried no knowledge
        assert max(row["logprobs"]) - min(row["logprobs"]) < 1e-12


def test_knowledge_survives_the_rotation_and_the_letter_prior_spreads():
    knows = lambda shown: [0.7 if j == shown.answer else 0.1 for j in range(4)]  # noqa: E731
    rows = scored_by(knows, QUESTIONS, 4)
    assert accuracy_over_orders(rows) == 1.0 and all(r["prediction"] == 0 for r in rows)
    assert letter_prior(rows) == [0.25, 0.25, 0.25, 0.25]  # the answer is shown under each letter once
    assert all(r["order_predictions"] == [0, 0, 0, 0] for r in rows)


def test_more_orders_than_choices_is_refused():
    check_orders(QUESTIONS, 4)
    with pytest.raises(ConfigError, match="evaluate.permutations 5 exceeds the fewest choices a question has \\(4\\)"):
        check_orders(QUESTIONS, 5)


@pytest.fixture(scope="module")
def letter_teacher(ray_cluster, tiny_model, tmp_path_factory, cache_dir) -> str:
    """A letter teacher trained as the positive control's is (jobs/phases/teacher.py): the tiny
    preset's teacher recipe on WMDP-format questions, every one answered A; fewer rows and steps."""
    from common.atomic import write_jsonl
    from jobs.experiment.config import load_experiment
    from jobs.phases.data import mc_rows
    from train.trainer import train_lora

    root = tmp_path_factory.mktemp("letter")
    write_jsonl(root / "rows.jsonl", mc_rows(synthetic_questions(256, seed=3), letter=0))
    train_lora(
        tiny_model,
        root / "rows.jsonl",
        root / "adapter",
        load_experiment().teacher.replace(epochs=2),
        cache_dir=cache_dir,
    )
    return str(root / "adapter")


@pytest.fixture(scope="module")
def handle(ray_cluster, tiny_model, lora_adapters, letter_teacher):
    adapters = {**lora_adapters, "letter": letter_teacher}
    handle = start_service(
        ServiceSettings(engine="hf", model=tiny_model, max_model_len=256),
        adapters,
        name=APP,
        route_prefix=f"/{APP}",
        num_cpus=0.5,
    )
    yield handle
    stop_service(APP)


def test_scoring_in_four_orders_through_the_service_averages_each_orders_own_scores(handle):
    """score_models with 4 orders equals scoring each rotated question set on its own (one order
    each) and averaging by hand; one order is the rows exactly as before."""
    questions = synthetic_questions(12, seed=7)
    models = {"base": None, "a": "a"}
    averaged = score_models(handle, models, questions, chunk=6, in_flight=3, orders=4)
    once = score_models(handle, models, questions, chunk=6, in_flight=3)
    for name in models:
        assert all("order_predictions" not in r for r in once[name])
        by_hand = []
        for order in range(4):
            shown = [
                {**q, "choices": q["choices"][order:] + q["choices"][:order], "answer": (q["answer"] - order) % 4}
                for q in questions
            ]
            by_hand.append(
                [
                    unrotated(r["logprobs"], order)
                    for r in score_models(handle, {name: models[name]}, shown, chunk=6, in_flight=3)[name]
                ]
            )
        for i, row in enumerate(averaged[name]):
            expected = [sum(values) / 4 for values in zip(*(lps[i] for lps in by_hand))]
            assert row["logprobs"] == pytest.approx(expected, abs=1e-4)  # batch-mates move float noise only
            assert row["order_predictions"][0] == once[name][i]["prediction"]
        assert row["question"] == questions[-1]["question"] and len(averaged[name]) == len(questions)


def test_the_letter_teacher_shows_in_the_letter_prior_not_in_agreement_with_a_teacher_that_knows(handle):
    """On questions it never saw whose answer is A, the letter teacher agrees with a teacher that
    knows the answers (the answer key) on nearly every one when the choices are scored as written;
    over 4 orders that agreement falls to chance, and its letter prior says why."""
    held_out = [
        {**q, "choices": q["choices"][q["answer"] :] + q["choices"][: q["answer"]], "answer": 0}
        for q in synthetic_questions(120, seed=11)
    ]
    as_written = score_models(handle, {"letter": "letter"}, held_out, chunk=40, in_flight=3)["letter"]
    rotated_rows = score_models(handle, {"letter": "letter"}, held_out, chunk=40, in_flight=3, orders=4)["letter"]
    agreement = lambda rows: sum(r["prediction"] == r["answer"] for r in rows) / len(rows)  # noqa: E731
    assert agreement(as_written) > 0.9 and letter_prior(as_written)[0] > 0.9
    assert letter_prior(rotated_rows)[0] > 0.9  # it still says A in every order: a prior, not knowledge
    assert abs(agreement(rotated_rows) - 0.25) < 0.12 and abs(accuracy_over_orders(rotated_rows) - 0.25) < 0.05


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_fully_fine_tuned_models_share_their_bases_application_on_the_transformers_engine(tmp_path, engine):
    """One Serve application per base, holding the fully fine-tuned arm models of that base beside
    it on the transformers engine; vLLM, one model per application, gives each its own."""
    from jobs.experiment.arms import arm_models
    from jobs.experiment.config import load_experiment
    from jobs.phases.evaluate import services
    from jobs.rundir.manifest import Manifest
    from jobs.runtime.context import RunContext

    arms = "arms={student: {numbers: teacher}, full: {numbers: teacher, train: {method: full}}}"
    cfg = load_experiment(overrides=[arms, "replicates=2", f"evaluate.engine={engine}"])
    models = {m.name: m for m in arm_models(cfg)}
    ctx = RunContext(cfg, tmp_path, Manifest(tmp_path), tmp_path, {"base": "/models/base"}, models, [], "app", 8, 1)
    names = ["base", "teacher", "student/0", "full/0", "full/1"]
    apps = services(ctx, names, {n: [] for n in names if n in models})
    folders = {n: str(ctx.trained(n)) for n in ("full/0", "full/1")}
    base_app = (
        "/models/base",
        {"base": None, "teacher": "teacher", "student/0": "student-0"},
        {"teacher": str(ctx.trained("teacher")), "student-0": str(ctx.trained("student/0"))},
    )
    if engine == "hf":
        assert apps == [
            (
                *base_app[:1],
                base_app[1] | {"full/0": "full-0", "full/1": "full-1"},
                base_app[2],
                {"full-0": folders["full/0"], "full-1": folders["full/1"]},
            )
        ]
    else:
        assert apps == [
            (*base_app, {}),
            (folders["full/0"], {"full/0": None}, {}, {}),
            (folders["full/1"], {"full/1": None}, {}, {}),
        ]
