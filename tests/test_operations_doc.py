"""docs/operations.md and the Grafana dashboard against the metrics the code reports: a metric
renamed or added in the code must show up in both, or this fails. (The end-to-end test checks
the other side: every project metric a real run exports has a panel.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

from serve.proxy_guard import REFUSED_METRIC
from train.loop import GAUGES

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "subliminal_dashboard.json"
PROJECT_METRIC = re.compile(r"ray_(?:lora_train|subliminal_serve)_\w+")


def family(name: str) -> str:
    """A Prometheus series name's metric family: the histogram's and counter's suffixes dropped."""
    return re.sub(r"_(bucket|sum|count|total)$", "", name)


def dashboard_families() -> set[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    return {family(name) for expr in exprs for name in PROJECT_METRIC.findall(expr)}


def reported_families() -> set[str]:
    """What the code declares: the trainer's gauges and the service's and its proxy guard's Ray metrics, with Ray's prefix."""
    source = (ROOT / "serve" / "metrics.py").read_text()
    served = re.findall(r'metrics\.(?:Counter|Histogram|Gauge)\(\s*"(\w+)"', source) + [REFUSED_METRIC]
    return {f"ray_lora_train_{g}" for g in GAUGES} | {f"ray_{name}" for name in served}


def test_the_dashboard_has_a_panel_for_every_reported_metric():
    assert dashboard_families() == reported_families()


def test_every_panel_queries_the_datasource_variable_and_has_a_title():
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and "datasource" in {v["name"] for v in board["templating"]["list"]}
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for p in panels:
        assert p["title"] and p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]


def test_the_operations_page_documents_every_reported_metric():
    doc = (ROOT / "docs" / "operations.md").read_text()
    documented = {family(name) for name in re.findall(r"^\| `(ray_\w+)` \|", doc, re.M)}
    assert documented == reported_families()
    assert "docs/grafana/subliminal_dashboard.json" in doc


def test_no_metric_label_is_one_prometheus_owns():
    """Prometheus sets `job` and `instance` on every scraped series and renames a metric's own
    label of that name to exported_<name>, which the dashboard's queries would never find."""
    sources = [(ROOT / "train" / "loop.py").read_text(), (ROOT / "serve" / "metrics.py").read_text()]
    labels = {label for source in sources for keys in re.findall(r"tag_keys=\(([^)]*)\)", source) for label in re.findall(r'"(\w+)"', keys)}
    assert labels and not labels & {"job", "instance"}, labels
