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
    labels = {
        label
        for source in sources
        for keys in re.findall(r"tag_keys=\(([^)]*)\)", source)
        for label in re.findall(r'"(\w+)"', keys)
    }
    assert labels and not labels & {"job", "instance"}, labels


def shell_commands(markdown: str) -> list[str]:
    """The commands of a page's bash blocks: continuation lines joined, comments and blank lines dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", markdown, re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [" ".join(line.split()) for line in lines if line]


def test_prometheus_and_grafana_are_started_on_loopback_without_anonymous_access():
    """Section 4's set-up: Prometheus (every interface by default) and Grafana on 127.0.0.1, and Grafana's
    anonymous access off over Ray's grafana.ini, whose template (read here) turns anonymous Viewer on."""
    from ray.dashboard.modules.metrics.templates import GRAFANA_INI_TEMPLATE

    assert re.search(r"\[auth\.anonymous\]\s*enabled = true", GRAFANA_INI_TEMPLATE)  # why the override is needed
    doc = (ROOT / "docs" / "operations.md").read_text()
    commands = shell_commands(doc[doc.index("## 4.") : doc.index("## 5.")])
    prometheus = [c for c in commands if c.split()[0] == "prometheus"]
    grafana = [c.split("grafana-server")[0].split() for c in commands if "grafana-server" in c]
    assert prometheus and all("--web.listen-address=127.0.0.1:9090" in c.split() for c in prometheus)
    assert grafana and all(
        {"GF_SERVER_HTTP_ADDR=127.0.0.1", "GF_AUTH_ANONYMOUS_ENABLED=false"} <= set(env) for env in grafana
    )
    assert not [c for c in commands if c.startswith("ray metrics launch-prometheus")]  # 0.0.0.0, lifecycle API on
