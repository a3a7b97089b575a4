"""Evaluation fan-out: four models scored in parallel vs one after the other, same service, same run.

    python bench/eval_fanout.py [--questions 1000] [--replicas 2]

The pipeline's evaluation stage (jobs.phases.evaluate.score_models) splits the work
by (model, chunk) and keeps 2 requests per replica in flight, so every
replica is busy with any model. The baseline scores the models in sequence,
one request at a time, as the original scripts evaluate them. The service is the
evaluation stage's on CPU: transformers-engine replicas; the adapters have
random weights (any adapter will do for timing).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench_common import mc_questions, tiny_model

from jobs.phases.evaluate import score_models
from jobs.sources.tiny_model import random_lora_adapter
from serve.settings import ServiceSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=128)
    args = parser.parse_args()
    import ray

    from serve.launch import start_service, stop_service

    model = tiny_model()
    questions = [{**q, "subset": q.pop("subject")} for q in mc_questions(args.questions)]
    work = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    adapters = {
        name: str(random_lora_adapter(model, work / name, seed=i))
        for i, name in enumerate(["teacher", "student", "control"])
    }
    models = {"base": None, **{name: name for name in adapters}}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    handle = start_service(
        ServiceSettings(model=model, engine="hf"), adapters, replicas=args.replicas, num_cpus=2 / args.replicas
    )
    score_models(handle, {"base": None}, questions[: args.chunk], args.chunk, 1)  # warm-up

    started = time.perf_counter()
    sequential = {}
    for name, adapter in models.items():
        sequential.update(score_models(handle, {name: adapter}, questions, args.chunk, in_flight=1))
    sequential_s = time.perf_counter() - started
    started = time.perf_counter()
    parallel = score_models(handle, models, questions, args.chunk, in_flight=2 * args.replicas)
    parallel_s = time.perf_counter() - started
    stop_service()
    same = all([r["prediction"] for r in sequential[n]] == [r["prediction"] for r in parallel[n]] for n in models)
    print(
        json.dumps(
            {
                "questions": len(questions),
                "models": len(models),
                "replicas": args.replicas,
                "sequential_s": round(sequential_s, 1),
                "parallel_s": round(parallel_s, 1),
                "speedup": round(sequential_s / parallel_s, 2),
                "same_predictions": same,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
