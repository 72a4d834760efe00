"""monitoring/: the Prometheus rules pass promtool's checks and their own unit tests, every
metric name the rules and the Grafana dashboard use is one the agent's registry exposes, the
dashboard holds to Grafana's dashboard model, and a scrape passes `promtool check metrics`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from numa_agent.core.caller import Caller
from numa_agent.service.requests import AdmitRequest
from numa_agent.views.metrics import build_registry
from tests.support.metrics_service import metrics_service, scrape_text

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
RULES = MONITORING / "prometheus" / "numa-agent.rules.yml"
RULE_TESTS = MONITORING / "prometheus" / "numa-agent.rules.test.yml"
DASHBOARD = MONITORING / "grafana" / "numa-agent.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found: install Debian's `prometheus` package (.ci/run does)")
# Series Prometheus makes itself for every target, not the agent's registry.
PROMETHEUS_OWN = {"up"}


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=120,
                          cwd=RULES.parent)


# ---- PromQL: the metric names an expression reads -----------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
# An identifier that is not part of a number, a $variable or a longer name, and not a call.
_NAME = re.compile(r"(?<![\w.:$])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
             "offset", "bool", "inf", "nan", "atan2", "sum", "min", "max", "avg", "count", "group",
             "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values"}


def metric_names(expr: str) -> set[str]:
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    return {name for name in _NAME.findall(text) if name not in _KEYWORDS}


def test_metric_names_of_an_expression():
    expr = ('histogram_quantile(0.99, sum by (le, instance) (rate(a_seconds_bucket{job="x", i=~"$instance"}'
            '[$__rate_interval]))) / on (instance) group_left (numa_node) b_total offset 15m > 1e3 '
            'and max without (cpu) (c) or vector(0) unless count(d{state="a b"} == 0)')
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c", "d"}


# ---- the rules file's expressions (no YAML library: the file's own simple layout) ----------

def rule_exprs(text: str) -> list[str]:
    """Every `expr:` of a rules file, inline or as an indented `|` block."""
    exprs, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if not m:
            continue
        indent, value = len(m.group(1)), m.group(2).strip()
        if value not in ("|", ">", "|-", ">-"):
            exprs.append(value.strip("'\""))
            continue
        block = []
        for follow in lines[i + 1:]:
            if follow.strip() and len(follow) - len(follow.lstrip()) <= indent:
                break
            block.append(follow.strip())
        exprs.append(" ".join(block))
    return exprs


def variable_expr(query: str) -> str:
    """A query variable's PromQL: Grafana's label_values(EXPR, LABEL) reads EXPR."""
    return re.sub(r"^label_values\((.+),\s*\w+\)$", r"\1", query.strip())


def dashboard_exprs(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if var.get("type") == "query":
            exprs.append(variable_expr(query["query"] if isinstance(query, dict) else query))
    return exprs


def exported_names(tmp_path) -> set[str]:
    """Every sample name the agent's registry can expose, families without samples included."""
    service = metrics_service(tmp_path)
    service.admit(AdmitRequest(name="web", cpus=2, memory_bytes=1 << 30), Caller(pid=os.getpid(), uid=1000, gid=1000))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}
    names = set()
    for family in build_registry(service.metrics_snapshot).collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def test_every_metric_the_rules_and_dashboard_use_is_exported(tmp_path):
    exported = exported_names(tmp_path) | PROMETHEUS_OWN
    rules_text = RULES.read_text()
    exprs = rule_exprs(rules_text) + dashboard_exprs(json.loads(DASHBOARD.read_text()))
    used = set().union(*(metric_names(e) for e in exprs))
    # ...and every numa_agent_ name the annotations and descriptions mention
    mentioned = set(re.findall(r"\bnuma_agent_\w+", rules_text + DASHBOARD.read_text()))
    assert len(rule_exprs(rules_text)) == rules_text.count("- alert:")
    assert {"up", "numa_agent_checkpoint_healthy", "numa_agent_cpus", "process_cpu_seconds_total",
            "numa_agent_admission_duration_seconds_bucket", "numa_agent_exclusive_cpu_intruders"} <= used
    assert sorted((used | mentioned) - exported) == []


# ---- promtool -----------------------------------------------------------------------------

@needs_promtool
def test_promtool_check_rules():
    result = promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"SUCCESS: (\d+) rules found", result.stdout)
    assert found and int(found.group(1)) == len(rule_exprs(RULES.read_text()))


@needs_promtool
def test_promtool_test_rules():
    result = promtool("test", "rules", RULE_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_promtool_check_metrics_on_a_scrape(tmp_path):
    service = metrics_service(tmp_path)
    service.admit(AdmitRequest(name="web", cpus=2, memory_bytes=1 << 30), Caller(pid=os.getpid(), uid=1000, gid=1000))
    text = scrape_text(service)
    assert "numa_agent_cpus_capacity" in text and "process_cpu_seconds_total" in text
    result = promtool("check", "metrics", stdin=text)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


# ---- the dashboard: Grafana's dashboard model, the parts a load needs ----------------------

PANEL_TYPES = {"row", "timeseries", "stat", "bargauge", "gauge", "table", "text", "heatmap"}
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range", "__all"}


def test_dashboard_model():
    dashboard = json.loads(DASHBOARD.read_text())
    for key, kind in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list),
                      ("templating", dict), ("time", dict), ("tags", list)):
        assert isinstance(dashboard.get(key), kind), key
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    instance = variables["instance"]  # one node or a fleet
    assert instance["type"] == "query" and instance["multi"] and instance["includeAll"]
    assert metric_names(variable_expr(instance["query"]["query"])) == {"numa_agent_info"}

    ids, cells = set(), set()
    for panel in dashboard["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        assert isinstance(panel["id"], int) and panel["id"] not in ids, panel["id"]
        ids.add(panel["id"])
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert grid["w"] > 0 and grid["h"] > 0 and 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        taken = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not taken & cells, f"{panel['title']} overlaps another panel"
        cells |= taken
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        targets = panel["targets"]
        assert targets and len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for target in targets:
            assert target["expr"].strip() and metric_names(target["expr"]), panel["title"]
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= set(variables) | BUILTIN_VARIABLES, (panel["title"], used)
            assert 'instance=~"$instance"' in target["expr"], panel["title"]
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("free cpus per numa node", "free memory per numa node", "refusals by reason",
                  "admission latency", "intruders"):
        assert topic in titles
