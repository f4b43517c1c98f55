"""The metrics the broker registers (gateway/src/metrics.rs), the metrics docs/operations.md
explains, and the metrics the Grafana dashboard and Prometheus rules under deploy/ query are
the same set: a renamed or added metric cannot leave a dashboard panel silently empty or a
metric undocumented."""

import json
import re

import pytest
import yaml

from conftest import REPO

# Every gateway source file that registers metric families: metrics.rs, and the modules of
# an area that register their own (metrics/kafka.rs, groups/metrics.rs).
GATEWAY_SRC = REPO / "gateway" / "src"
OPERATIONS = REPO / "docs" / "operations.md"
DASHBOARD = REPO / "deploy" / "grafana" / "felix.json"
PROMETHEUS = REPO / "deploy" / "prometheus" / "prometheus.yml"
ALERTS = REPO / "deploy" / "prometheus" / "felix-alerts.yml"

NAME = re.compile(r"\bfelix_[a-z0-9_]+\b")


def exported_metrics() -> dict[str, str]:
    """Exported family name -> type, as prometheus-client names them (`_total` appended
    to counters)."""
    src = "".join(
        text
        for p in sorted(GATEWAY_SRC.rglob("*.rs"))
        if "registry.register(" in (text := p.read_text())
    )
    field_type = {}
    for field, ty in re.findall(r"pub (\w+): (?:Family<\w+, )?(Counter|Gauge|Histogram)", src):
        field_type[field] = ty
    out = {}
    for name, field in re.findall(r'registry\.register\(\s*"(felix_\w+)",\s*"[^"]*",\s*(?:m|self)\.(\w+)\.clone\(\)', src, re.S):
        ty = field_type[field]
        out[name + "_total" if ty == "Counter" else name] = ty
    assert len(out) >= 20, "could not read the registered metrics from metrics.rs"
    return out


def queried(names: set[str]) -> set[str]:
    """Family names, with a histogram's _bucket/_sum/_count suffix removed."""
    histograms = {n for n, ty in exported_metrics().items() if ty == "Histogram"}
    return {
        base if (base := re.sub(r"_(bucket|sum|count)$", "", n)) in histograms else n
        for n in names
    }


def test_every_registered_metric_is_explained_in_operations_md():
    documented = set(re.findall(r"^\| `(felix_\w+)` \|", OPERATIONS.read_text(), re.M))
    assert documented == set(exported_metrics()), (
        f"missing from docs/operations.md: {sorted(set(exported_metrics()) - documented)}; "
        f"documented but not registered: {sorted(documented - set(exported_metrics()))}"
    )


def test_operations_md_names_no_metric_that_does_not_exist(module):
    # felix_binary_url and the like are the Terraform module's variables, not metrics.
    names = queried(set(NAME.findall(OPERATIONS.read_text()))) - set(module.variables())
    assert names <= set(exported_metrics()), sorted(names - set(exported_metrics()))


def test_dashboard_is_valid_and_charts_every_metric():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    names = queried({n for e in exprs for n in NAME.findall(e)})
    assert names <= set(exported_metrics()), sorted(names - set(exported_metrics()))
    assert names == set(exported_metrics()), f"not charted: {sorted(set(exported_metrics()) - names)}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for expr in exprs:
        assert expr.count("(") == expr.count(")"), expr


@pytest.mark.parametrize("path", [PROMETHEUS, ALERTS], ids=lambda p: p.name)
def test_prometheus_files_parse_and_name_real_metrics(path):
    doc = yaml.safe_load(path.read_text())
    assert doc
    names = queried(set(NAME.findall(path.read_text())))
    assert names <= set(exported_metrics()), sorted(names - set(exported_metrics()))


def test_prometheus_scrapes_the_admin_port_and_loads_the_rules():
    doc = yaml.safe_load(PROMETHEUS.read_text())
    assert doc["rule_files"] == ["felix-alerts.yml"]
    for job in doc["scrape_configs"]:
        assert job["metrics_path"] == "/metrics"
    alerts = yaml.safe_load(ALERTS.read_text())
    rules = alerts["groups"][0]["rules"]
    assert {r["alert"] for r in rules} >= {"FelixBrokerDown", "FelixObjectStoreDown", "FelixAckedPublishesDropped"}
    for rule in rules:
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
