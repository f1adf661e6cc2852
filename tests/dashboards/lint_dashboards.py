#!/usr/bin/env python3
"""Static checks of the qpwatch dashboards and rules (no Prometheus needed).

    lint_dashboards.py --metrics agent/src/export/metrics --rules dashboards/rules.yml dashboards/*.json

Dashboards:
  * valid JSON, schemaVersion >= 36, a uid and a title;
  * a `datasource` variable of type datasource (query prometheus), and every
    datasource reference in the file is {"type": "prometheus", "uid":
    "${datasource}"} (the built-in annotation's "-- Grafana --" aside): no
    hard-coded datasource uid;
  * variables `job` and `instance` (the overview also `device` and `target`),
    all of type query with label_values(metric{...}, label);
  * every panel has a unique id and a gridPos inside the 24-column grid;
    every non-row panel has targets, each with refId, expr and datasource;
  * units: every non-row panel sets fieldConfig.defaults.unit; a panel that
    shows seconds (histogram_quantile over a *_seconds histogram, a
    *_seconds_sum / *_seconds_count mean, a ratio of *_seconds_total) uses
    "s"; a heatmap of a *_seconds histogram has y-axis unit "s";
  * range selectors use $__rate_interval, $__interval or $__range, never a
    hard-coded window.
Dashboards and rules:
  * every metric name is registered in agent/src/export/metrics/ (histogram
    names with _bucket/_sum/_count), or is `up`, `process_*`, or a recording
    rule of --rules;
  * every label in a matcher or a by/without clause is a label of a metric of
    that expression (or job, instance, le for histograms, quantile);
  * rate/irate/increase only over counters (_total) and histogram series;
  * histogram_quantile over a `sum by (le, ...)` (or over a recorded series);
  * every alert has a severity (critical, warning, info), a summary and a
    description; recording rule names follow level:metric:operations.
Exits 1 with one line per problem. Python 3 standard library only.
"""

import argparse
import json
import os
import re
import sys

FUNCS_RANGE = ("rate", "irate", "increase")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset", "inf", "nan"}
GROUPING = ("by", "without", "on", "ignoring", "group_left", "group_right")
EXTRA_LABELS = {"job", "instance"}
ALLOWED_WINDOWS = {"$__rate_interval", "$__interval", "$__range"}

problems = []


def problem(where, msg):
    problems.append("%s: %s" % (where, msg))


# ---------------------------------------------------------------------------
# agent/src/export/metrics/


def collector_metrics(text):
    """Families of a hand-written collector: `const X: &str = "qpwatch_...";`
    with their labels in `const LABELS: [&str; N] = [...]`."""
    found = {}
    lm = re.search(r'const LABELS: \[&str; \d+\] = \[([^\]]*)\]', text)
    labels = set(re.findall(r'"(\w+)"', lm.group(1))) if lm else set()
    for name in re.findall(r'const \w+: &str = "(qpwatch_\w+)";', text):
        found[name] = ("counter" if name.endswith("_total") else "gauge", labels)
    return found


def rust_files(paths):
    """The .rs files of `paths`: files as given, directories' files (sorted)."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".rs"))
        else:
            files.append(path)
    return files


def registered_metrics(text):
    """Families built through the Registrar: r.counter_vec("name", "help",
    &["a", "b"]), r.histogram("name", "help", &buckets),
    r.duration_histogram_vec("name", "help", &["a"], &buckets) etc."""
    found = {}
    for kind, name, labels in re.findall(
        r'\.(counter|float_counter|gauge|float_gauge|histogram|duration_histogram)(?:_vec)?\(\s*"(qpwatch_\w+)",\s*"(?:[^"\\]|\\.)*",?\s*(?:&\[([^\]]*)\])?', text
    ):
        kind = "counter" if kind.endswith("counter") else "histogram" if kind.endswith("histogram") else kind
        found[name] = (kind, set(re.findall(r'"(\w+)"', labels)))
    return found


# The mesh's per-target families carry `target` and the labels configured in
# [mesh] target_labels, known only at run time; the shipped rules and the mesh
# dashboard assume rack and tor (--mesh-target-labels).
MESH_TARGET_FAMILIES = re.compile(
    r"^qpwatch_mesh_(probes_\w+_total|probe_rtt_seconds|probe_network_rtt_seconds|responder_delay_seconds"
    r"|prober_delay_seconds|responder_times_rejected_total|target_resolved)$"
)


def agent_metrics(paths, mesh_target_labels=()):
    """name -> (kind, set of labels), kind in counter/gauge/histogram."""
    found = {}
    for path in rust_files(paths):
        text = open(path, encoding="utf-8").read()
        found.update(collector_metrics(text))
        found.update(registered_metrics(text))
    for name, (kind, labels) in found.items():
        if MESH_TARGET_FAMILIES.match(name):
            found[name] = (kind, labels | {"target"} | set(mesh_target_labels))
    return found


# ---------------------------------------------------------------------------
# rules.yml (our own layout, line based: no YAML parser in the standard library)


def read_rules(path):
    """[(kind, name, expr, labels dict, block text)]"""
    lines = open(path, encoding="utf-8").read().splitlines()
    rules, cur = [], None
    block_indent = None  # inside `expr: |`: the indentation of its first line
    for line in lines:
        if block_indent is not None:
            indent = len(line) - len(line.lstrip())
            if line.strip() and (block_indent == 0 or indent >= block_indent):
                block_indent = block_indent or indent
                cur["expr"] = (cur["expr"] + " " + line.strip()).strip()
                cur["block"].append(line)
                continue
            block_indent = None
        m = re.match(r"^\s*-\s*(alert|record):\s*(\S+)\s*$", line)
        if m:
            cur = {"kind": m.group(1), "name": m.group(2), "expr": None, "labels": {}, "block": [line]}
            rules.append(cur)
            continue
        if re.match(r"^\s*-\s*name:", line):
            cur = None
            continue
        if cur is None:
            continue
        cur["block"].append(line)
        m = re.match(r"^\s*expr:\s*(.+?)\s*$", line)
        if m:
            cur["expr"] = m.group(1)
            if cur["expr"] == "|":
                cur["expr"], block_indent = "", 0
        m = re.match(r'^\s{8,}(\w+):\s*"?([^"]*)"?\s*$', line)
        if m and cur["expr"] is not None and m.group(1) not in ("summary", "description", "expr"):
            cur["labels"][m.group(1)] = m.group(2)
    return rules


# ---------------------------------------------------------------------------
# PromQL scanning


def strip_strings(expr):
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)


def matchers(expr):
    """[(metric or None, [label names])] for every {...} in expr."""
    out = []
    for m in re.finditer(r"([a-zA-Z_:][\w:]*)?\s*\{([^}]*)\}", strip_strings(expr)):
        out.append((m.group(1), re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", m.group(2))))
    return out


def replaced_labels(expr):
    """Labels label_replace() sets: label_replace(v, "dst", "$1", ...)."""
    return re.findall(r'"(\w+)"\s*,\s*"\$\d+"', expr)


def grouping_labels(expr):
    labels = []
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", strip_strings(expr)):
        labels += [l.strip() for l in m.group(1).split(",") if l.strip()]
    return labels


def metric_names(expr):
    s = strip_strings(expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = []
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", s):
        tok, call = m.group(1), m.group(2)
        if call or tok.lower() in KEYWORDS:
            continue
        names.append(tok)
    return names


def resolve(name, metrics, recorded):
    """-> (kind, labels) or None."""
    if name in recorded:
        return recorded[name]
    if name == "up":
        return ("gauge", set())
    if name.startswith("process_"):
        return ("gauge", set())
    if name in metrics:
        kind, labels = metrics[name]
        if kind == "histogram":
            return None  # a histogram is only used through its series
        return metrics[name]
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)] if name.endswith(suffix) else None
        if base and base in metrics and metrics[base][0] == "histogram":
            labels = set(metrics[base][1])
            if suffix == "_bucket":
                labels.add("le")
            return ("counter", labels)
    return None


def check_expr(where, expr, metrics, recorded, dashboard):
    names = metric_names(expr)
    if not names:
        problem(where, "no metric in %r" % expr)
    labels = set(EXTRA_LABELS) | {"quantile"} | set(replaced_labels(expr))
    for n in names:
        r = resolve(n, metrics, recorded)
        if r is None:
            problem(where, "unknown metric %s (not registered in agent/src/export/metrics/, not a recording rule)" % n)
        else:
            labels |= r[1]
    for metric, ls in matchers(expr):
        for l in ls:
            if l != "__name__" and l not in labels:
                problem(where, "label %s is not a label of %s" % (l, metric or ", ".join(names)))
    for l in grouping_labels(expr):
        if l not in labels:
            problem(where, "grouping label %s is not a label of %s" % (l, ", ".join(names)))
    for m in re.finditer(r"\b(%s)\(\s*([a-zA-Z_:][\w:]*)" % "|".join(FUNCS_RANGE), expr):
        arg = m.group(2)
        if not re.search(r"(_total|_bucket|_sum|_count)$", arg):
            problem(where, "%s() over %s, which is not a counter" % (m.group(1), arg))
    for m in re.finditer(r"histogram_quantile\(", expr):
        rest = expr[m.end():]
        inner = re.match(r"\s*[\d.]+\s*,\s*([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?\s*\)", rest)
        if inner and inner.group(1) in recorded:
            continue
        if not re.search(r"\bby\s*\(([^)]*\ble\b[^)]*)\)", rest) or "_bucket" not in rest:
            problem(where, "histogram_quantile without sum by (le, ...) over a _bucket rate")
    if dashboard:
        for w in re.findall(r"\[([^\]]*)\]", strip_strings(expr)):
            if w.strip() not in ALLOWED_WINDOWS:
                problem(where, "range [%s]: use $__rate_interval (or $__range / $__interval)" % w)


def shows_seconds(expr):
    if re.search(r"histogram_quantile\(.*_seconds_bucket", expr, re.S):
        return True
    if "_seconds_sum" in expr:
        return True
    if "_seconds_total" in expr and "/" in expr:
        return True
    return False


# ---------------------------------------------------------------------------


def walk(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield path + "/" + k, k, v
            yield from walk(v, path + "/" + k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from walk(v, "%s[%d]" % (path, i))


def check_dashboard(path, metrics, recorded):
    try:
        dash = json.load(open(path, encoding="utf-8"))
    except ValueError as e:
        problem(path, "invalid JSON: %s" % e)
        return
    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
        problem(path, "schemaVersion %r < 36" % dash.get("schemaVersion"))
    for key in ("uid", "title"):
        if not dash.get(key):
            problem(path, "no %s" % key)
    for p, k, v in walk(dash):
        if k != "datasource":
            continue
        if v == {"type": "prometheus", "uid": "${datasource}"}:
            continue
        if v == {"type": "grafana", "uid": "-- Grafana --"} and p.startswith("/annotations"):
            continue
        problem(path, "%s: datasource %r (use {\"type\": \"prometheus\", \"uid\": \"${datasource}\"})" % (p, v))
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problem(path, "no datasource variable of type datasource / query prometheus")
    required = ["job", "instance"] + (["device", "target"] if dash.get("uid") == "qpwatch-overview" else ["target"])
    for name in required:
        if name not in variables:
            problem(path, "no $%s variable" % name)
    for name, v in variables.items():
        if v.get("type") == "datasource":
            continue
        where = "%s: variable $%s" % (path, name)
        if v.get("type") != "query":
            problem(where, "type %s (only query variables)" % v.get("type"))
            continue
        query = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query")
        if v.get("definition") != query:
            problem(where, "definition differs from query")
        m = re.match(r"^label_values\((.+),\s*(\w+)\)$", query or "")
        if not m:
            problem(where, "query %r is not label_values(metric{...}, label)" % query)
            continue
        sel, label = m.group(1), m.group(2)
        check_expr(where, sel, metrics, recorded, True)
        names = metric_names(sel)
        r = resolve(names[0], metrics, recorded) if names else None
        if r and label not in r[1] | EXTRA_LABELS:
            problem(where, "label %s is not a label of %s" % (label, names[0]))

    ids = set()

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash.get("panels", [])):
        title = p.get("title", "?")
        where = "%s: panel %r" % (path, title)
        if p.get("id") in ids:
            problem(where, "duplicate id %s" % p.get("id"))
        ids.add(p.get("id"))
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")):
            problem(where, "gridPos %r" % g)
        elif g["x"] + g["w"] > 24 or g["w"] < 1 or g["h"] < 1:
            problem(where, "gridPos %r outside the 24-column grid" % g)
        if p.get("type") == "row":
            continue
        targets = p.get("targets") or []
        if not targets:
            problem(where, "no targets")
        unit = (p.get("fieldConfig", {}).get("defaults", {}) or {}).get("unit")
        if not unit:
            problem(where, "no unit (fieldConfig.defaults.unit)")
        refs = set()
        seconds = False
        for t in targets:
            for key in ("refId", "expr", "datasource"):
                if not t.get(key):
                    problem(where, "target without %s" % key)
            if t.get("refId") in refs:
                problem(where, "duplicate refId %s" % t.get("refId"))
            refs.add(t.get("refId"))
            expr = t.get("expr") or ""
            check_expr("%s [%s]" % (where, t.get("refId")), expr, metrics, recorded, True)
            seconds |= shows_seconds(expr)
            if p.get("type") == "heatmap" and "_seconds_bucket" in expr:
                if (p.get("options", {}).get("yAxis") or {}).get("unit") != "s":
                    problem(where, "heatmap of a seconds histogram without yAxis unit s")
                if t.get("format") != "heatmap":
                    problem(where, "heatmap target without format heatmap")
        if seconds and unit != "s":
            problem(where, "shows seconds but unit is %r" % unit)


def check_rules(path, metrics):
    rules = read_rules(path)
    if not rules:
        problem(path, "no rules")
    recorded = {}
    for r in rules:
        if r["kind"] == "record":
            if not re.match(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$", r["name"]):
                problem(path, "recording rule %s does not follow level:metric:operations" % r["name"])
            expr = r["expr"] or ""
            labels = set(EXTRA_LABELS) | set(r["labels"]) | set(grouping_labels(expr)) | set(replaced_labels(expr))
            if not re.search(r"\bby\s*\(", expr):
                # no aggregation by some labels: the inputs' labels stay
                for n in metric_names(expr):
                    found = resolve(n, metrics, recorded)
                    if found:
                        labels |= found[1]
            labels.discard("le")
            recorded[r["name"]] = ("gauge", labels)
    for r in rules:
        where = "%s: %s %s" % (path, r["kind"], r["name"])
        if not r["expr"]:
            problem(where, "no single-line expr")
            continue
        check_expr(where, r["expr"], metrics, recorded, False)
        if r["kind"] == "alert":
            block = "\n".join(r["block"])
            if not re.search(r"^\s*severity:\s*(critical|warning|info)\s*$", block, re.M):
                problem(where, "no severity critical/warning/info")
            for key in ("summary", "description"):
                if not re.search(r"^\s*%s:\s*\S" % key, block, re.M):
                    problem(where, "no %s annotation" % key)
    return recorded


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--metrics", required=True, nargs="+",
                    help="the metric family files or their directory (agent/src/export/metrics)")
    ap.add_argument("--rules", required=True)
    ap.add_argument("--mesh-target-labels", default="rack,tor",
                    help="the [mesh] target_labels the rules and dashboards assume (comma-separated)")
    ap.add_argument("dashboards", nargs="+")
    args = ap.parse_args()
    metrics = agent_metrics(args.metrics, [l for l in args.mesh_target_labels.split(",") if l])
    if len(metrics) < 40:
        problem(" ".join(args.metrics), "only %d metrics found: the parser no longer matches the family files" % len(metrics))
    recorded = check_rules(args.rules, metrics)
    for path in args.dashboards:
        check_dashboard(path, metrics, recorded)
    for p in problems:
        print(p)
    print("lint: %d metrics in %s, %d recording rules, %d dashboards: %s"
          % (len(metrics), " ".join(args.metrics), len(recorded), len(args.dashboards), "%d problems" % len(problems) if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
