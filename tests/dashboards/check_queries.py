#!/usr/bin/env python3
"""Runs every PromQL expression of the qpwatch dashboards and rules against a
live Prometheus, and fails unless each one returns data.

    check_queries.py --prometheus http://127.0.0.1:9090 --rules dashboards/rules.yml \
        [--var NAME=VALUE ...] [--builtin NAME=VALUE ...] \
        [--expect-alert 'NAME{label="value",...}' ...] [--expect-no-alert 'NAME{...}' ...] \
        [--rule-groups REGEX] [--wait SECONDS] dashboards/*.json

What is checked (dashboards/README.md, "Validation", says the same):

* Template variables: `label_values(selector, label)` is resolved through
  /api/v1/series over the last hour, in dashboard order, each selector with
  the variables before it substituted. It must yield at least one value. The
  values become the variable's selection the way Grafana formats them for
  Prometheus: multi-value or include-All variables select every value ("All"),
  regex-escaped and joined as (a|b); single-value variables the first value,
  unless --var [DASHBOARD_UID:]NAME=VALUE picks one (it must be among the
  values).
* Panels: every target's expr, with $variables, ${variables} and the
  built-ins ($__rate_interval, $__interval, $__range, ...; --builtin sets
  them) substituted, runs as an instant query (/api/v1/query). It must
  succeed and return at least one series with a finite value (NaN and ±Inf do
  not count: a quantile over a window without observations is NaN). Panels
  repeated over a variable run once per value.
* Rules: read from the server (/api/v1/rules, so the file really loaded), and
  compared with the `- record:` / `- alert:` entries of --rules (only the
  groups whose name matches --rule-groups, if given: the single-host bed
  checks qpwatch.rules and qpwatch.alerts, the fleet the mesh groups). Every rule
  must have health "ok" and no lastError.
  - recording rule: its expr must return finite data, and so must the series
    it recorded (the name with the rule's labels).
  - alerting rule whose top-level operator is a comparison (A > B, A == 0,
    ...): the whole expression must be accepted by the server (its result may
    be empty: a healthy system does not alert), and A must return finite data,
    so the condition is evaluated on a metric that exists.
  - alerting rule `absent(A)`: A must return data, and the whole expression
    must be empty (the agent is there).
  - any other alert expression must return data itself.
  An alert shape this script cannot take apart (a top-level and/or/unless)
  fails: nothing is skipped.
* --expect-alert / --expect-no-alert: alerts (pending or firing, from
  /api/v1/alerts) that must / must not exist with the given labels.

Prints one table row per expression and exits 1 if any check failed.
--wait SECONDS repeats the whole check (every expression, at one moment)
until one attempt passes completely or the time is up, for a system that is
still warming up (the first samples, the first rule evaluations); it prints
one line per failed attempt and the table of the last one.
Python 3 standard library only.
"""

import argparse
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
}
VAR_RE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)\]\]")
LABEL_VALUES_RE = re.compile(r"^\s*label_values\(\s*(?:(.*?)\s*,\s*)?([A-Za-z_]\w*)\s*\)\s*$", re.S)
REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")


class Prom:
    def __init__(self, base, workers=4):
        self.base = base.rstrip("/")
        self.workers = workers
        self.cache = {}

    def get(self, path, params, method="GET"):
        data = urllib.parse.urlencode(params, doseq=True)
        if method == "POST":
            req = urllib.request.Request(self.base + path, data=data.encode(), method="POST")
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        else:
            req = urllib.request.Request(self.base + path + ("?" + data if data else ""))
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            try:
                body = json.load(e)
            except ValueError:
                return {"status": "error", "error": "HTTP %d" % e.code}
        return body

    def query(self, expr):
        """-> (error or None, series count, finite value count)."""
        if expr not in self.cache:
            self.cache[expr] = self._query(expr)
        return self.cache[expr]

    def prefetch(self, exprs):
        """Runs the queries a few at a time (the VM is slow, the server is not busy)."""
        todo = [e for e in dict.fromkeys(exprs) if e not in self.cache]
        with ThreadPoolExecutor(self.workers) as ex:
            for e, r in zip(todo, ex.map(self._query, todo)):
                self.cache[e] = r

    def _query(self, expr):
        body = self.get("/api/v1/query", {"query": expr, "time": "%.3f" % time.time()}, method="POST")
        if body.get("status") != "success":
            return "%s: %s" % (body.get("errorType", "error"), body.get("error", "?")), 0, 0
        data = body["data"]
        rtype, result = data["resultType"], data["result"]
        if rtype == "scalar":
            values = [result[1]]
        elif rtype == "vector":
            values = [s["value"][1] for s in result]
        elif rtype == "matrix":
            values = [v[1] for s in result for v in s["values"]]
        else:
            return "unexpected result type %s" % rtype, 0, 0
        finite = sum(1 for v in values if math.isfinite(float(v)))
        return None, (1 if rtype == "scalar" else len(result)), finite

    def series(self, match, seconds=3600):
        now = time.time()
        body = self.get("/api/v1/series", {"match[]": match, "start": "%.3f" % (now - seconds), "end": "%.3f" % now})
        if body.get("status") != "success":
            return "%s: %s" % (body.get("errorType", "error"), body.get("error", "?")), []
        return None, body["data"]


def regex_escape(value):
    # Grafana's prometheusSpecialRegexEscape: one backslash for the regex,
    # doubled because it sits inside a PromQL string literal.
    return REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def regular_escape(value):
    # Grafana's prometheusRegularEscape (single-value variables).
    return value.replace("\\", "\\\\").replace("'", "\\'")


def format_multi(values):
    escaped = [regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(text, variables):
    """Replaces Grafana variables; returns (text, [unknown variable names])."""
    unknown = []

    def repl(m):
        name = m.group(1) or m.group(3) or m.group(4)
        if name in variables:
            return variables[name]
        unknown.append(name)
        return m.group(0)

    return VAR_RE.sub(repl, text), unknown


def mask_nested(expr):
    """expr with everything inside (), [], {} and string literals blanked out."""
    out, depth, i = [], 0, 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            j = i + 1
            while j < len(expr) and expr[j] != c:
                j += 2 if expr[j] == "\\" and c != "`" else 1
            out.append(" " * (min(j, len(expr) - 1) - i + 1))
            i = j + 1
            continue
        if c in "([{":
            depth += 1
            out.append(c if depth == 1 else " ")
        elif c in ")]}":
            depth -= 1
            out.append(c if depth == 0 else " ")
        else:
            out.append(c if depth == 0 else " ")
        i += 1
    return "".join(out)


def top_level_comparison(expr):
    """(lhs, op, rhs) for the first comparison at nesting depth 0, else None."""
    masked = mask_nested(expr)
    for i, c in enumerate(masked):
        two = masked[i:i + 2]
        if two in ("==", "!=", ">=", "<="):
            return expr[:i].strip(), two, expr[i + 2:].strip()
        if c in "<>":
            return expr[:i].strip(), c, expr[i + 1:].strip()
    return None


def has_top_level_set_op(expr):
    return re.search(r"\b(and|or|unless)\b", mask_nested(expr)) is not None


def absent_argument(expr):
    m = re.match(r"^\s*absent(?:_over_time)?\s*\((.*)\)\s*$", expr, re.S)
    if not m:
        return None
    inner = m.group(1)
    # the closing parenthesis must be absent()'s own
    return inner if mask_nested("(" + inner + ")").replace(" ", "") == "()" else None


class Report:
    """One line per expression; printed as it is checked when echo is set,
    else kept for print_rows() (--wait prints only the last attempt)."""

    HEADER = "%-4s %-20s %-52s %6s %6s  %s" % ("", "source", "panel / rule", "series", "finite", "expression")

    def __init__(self, echo=True):
        self.echo = echo
        self.lines = []
        self.rows = 0
        self.failures = 0
        self.failed = []
        self._out(self.HEADER)

    def _out(self, line):
        self.lines.append(line)
        if self.echo:
            print(line, flush=True)

    def add(self, source, what, expr, count, finite, ok, note=""):
        self.rows += 1
        if not ok:
            self.failures += 1
            self.failed.append("%s: %s" % (source, what))
        self._out("%-4s %-20s %-52s %6s %6s  %s" % ("ok" if ok else "FAIL", source[:20], what[:52], count, finite, " ".join(expr.split())))
        if note:
            self._out("       -> " + note)

    def print_rows(self):
        if not self.echo:
            print("\n".join(self.lines), flush=True)

    def summary(self):
        print("%d expressions, %d failed" % (self.rows, self.failures))


def check_dashboard(path, prom, report, overrides, builtins):
    with open(path, encoding="utf-8") as f:
        dash = json.load(f)
    name = dash.get("uid") or path
    values, formatted = {}, dict(builtins)
    for v in dash.get("templating", {}).get("list", []):
        vname, vtype = v["name"], v.get("type")
        if vtype == "datasource":
            ok = v.get("query") == "prometheus"
            formatted[vname] = "prometheus-under-test"
            report.add(name, "variable $" + vname, "datasource: " + str(v.get("query")), "-", "-", ok,
                       "" if ok else "a datasource variable of type prometheus is expected")
            continue
        if vtype != "query":
            report.add(name, "variable $" + vname, "type " + str(vtype), 0, 0, False, "unsupported variable type")
            continue
        query = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
        m = LABEL_VALUES_RE.match(query)
        if not m:
            report.add(name, "variable $" + vname, query, 0, 0, False, "only label_values(selector, label) is supported")
            continue
        selector, label = m.group(1), m.group(2)
        if not selector:
            report.add(name, "variable $" + vname, query, 0, 0, False, "label_values(label) without a metric is not allowed (unbounded)")
            continue
        selector, unknown = substitute(selector, formatted)
        if unknown:
            report.add(name, "variable $" + vname, query, 0, 0, False, "undefined variables: " + ", ".join(unknown))
            continue
        err, series = prom.series(selector)
        found = sorted({s[label] for s in series if label in s})
        shown = "label_values(%s, %s)" % (selector, label)
        if err or not found:
            report.add(name, "variable $" + vname, shown, len(series), len(found), False,
                       err or "%d series, none with label %s" % (len(series), label))
            values[vname] = []
            formatted[vname] = "__no_value__"
            continue
        multi = v.get("multi") or v.get("includeAll")
        key = "%s:%s" % (name, vname) if "%s:%s" % (name, vname) in overrides else vname
        if key in overrides:
            chosen = overrides[key]
            missing = [c for c in chosen if c not in found]
            if missing:
                report.add(name, "variable $" + vname, shown, len(series), len(found), False,
                           "--var value(s) %s not among %s" % (missing, found))
                chosen = [c for c in chosen if c in found] or found[:1]
        else:
            chosen = found if multi else found[:1]
        values[vname] = chosen
        formatted[vname] = format_multi(chosen) if multi else regular_escape(chosen[0])
        report.add(name, "variable $" + vname, shown, len(series), len(found), True,
                   "values %s; selected %s" % (",".join(found), formatted[vname]))

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    jobs = []
    for p in panels(dash.get("panels", [])):
        if p.get("type") == "row":
            continue
        targets = p.get("targets", [])
        title = p.get("title", "?")
        if not targets:
            report.add(name, title, "(no targets)", 0, 0, False, "panel without a query")
            continue
        repeat = p.get("repeat")
        instances = [(title, formatted)]
        if repeat:
            if not values.get(repeat):
                report.add(name, title, "(repeat over $%s)" % repeat, 0, 0, False, "repeat variable without values")
                continue
            instances = []
            for value in values[repeat]:
                scope = dict(formatted)
                scope[repeat] = regex_escape(value)
                instances.append((substitute(title, {repeat: value})[0], scope))
        for shown_title, scope in instances:
            for t in targets:
                jobs.append(("%s [%s]" % (shown_title, t.get("refId", "?")), t.get("expr"), scope))
    prom.prefetch(substitute(e, scope)[0] for _, e, scope in jobs if e)
    for what, expr, scope in jobs:
        if not expr:
            report.add(name, what, "(empty)", 0, 0, False, "target without expr")
            continue
        text, unknown = substitute(expr, scope)
        if unknown:
            report.add(name, what, expr, 0, 0, False, "undefined variables: " + ", ".join(unknown))
            continue
        err, count, finite = prom.query(text)
        report.add(name, what, text, count, finite, err is None and finite > 0,
                   err or ("" if finite else "no finite value"))


def rule_entries(path, groups=None):
    """[(alert|record, name)] of the file, of the groups whose name matches
    the regex `groups` (all if None)."""
    entries, group = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^\s*-\s*name:\s*['\"]?([\w.:-]+)", line)
            if m:
                group = m.group(1)
                continue
            m = re.match(r"^\s*-\s*(alert|record):\s*['\"]?([\w:]+)", line)
            if m and (groups is None or re.fullmatch(groups, group or "")):
                entries.append((m.group(1), m.group(2)))
    return sorted(entries)


def wait_for_rules(prom, expected, timeout, groups=None):
    """Rules from /api/v1/rules (of the groups matching the regex `groups`)
    once every rule was evaluated (or timeout)."""
    deadline = time.time() + timeout
    while True:
        body = prom.get("/api/v1/rules", {})
        rules = [r for g in body.get("data", {}).get("groups", [])
                 if groups is None or re.fullmatch(groups, g["name"]) for r in g["rules"]]
        evaluated = all(r.get("health") != "unknown" for r in rules)
        if len(rules) >= len(expected) and evaluated:
            return rules
        if time.time() > deadline:
            return rules
        time.sleep(1)


def selector_with_labels(name, labels):
    if not labels:
        return name
    return name + "{" + ",".join('%s="%s"' % (k, v.replace("\\", "\\\\").replace('"', '\\"')) for k, v in sorted(labels.items())) + "}"


def check_rules(path, prom, report, timeout, groups=None):
    expected = rule_entries(path, groups)
    rules = wait_for_rules(prom, expected, timeout, groups)
    loaded = sorted(("alert" if r["type"] == "alerting" else "record", r["name"]) for r in rules)
    ok = loaded == expected
    report.add("rules", "loaded by Prometheus", path, len(loaded), "-", ok,
               "" if ok else "file has %s, server has %s" % (expected, loaded))
    wanted = []
    for r in rules:
        wanted.append(r["query"])
        if r["type"] == "recording":
            wanted.append(selector_with_labels(r["name"], r.get("labels") or {}))
        elif absent_argument(r["query"]) is not None:
            wanted.append(absent_argument(r["query"]))
        elif top_level_comparison(r["query"]):
            wanted.append(top_level_comparison(r["query"])[0])
    prom.prefetch(wanted)
    for r in rules:
        kind, rname, expr = r["type"], r["name"], r["query"]
        health_note = ""
        if r.get("health") != "ok" or r.get("lastError"):
            health_note = "health %s %s" % (r.get("health"), r.get("lastError", ""))
        if kind == "recording":
            err, count, finite = prom.query(expr)
            report.add("rules", "record " + rname, expr, count, finite, err is None and finite > 0 and not health_note,
                       err or health_note or ("" if finite else "no finite value"))
            sel = selector_with_labels(rname, r.get("labels") or {})
            err, count, finite = prom.query(sel)
            report.add("rules", "recorded " + rname, sel, count, finite, err is None and finite > 0,
                       err or ("" if finite else "the recorded series is missing or has no finite value"))
            continue
        what = "alert " + rname
        if has_top_level_set_op(expr):
            report.add("rules", what, expr, 0, 0, False, "top-level and/or/unless: write the alert so this check can split it")
            continue
        inner = absent_argument(expr)
        cmp_ = top_level_comparison(expr) if inner is None else None
        if inner is not None:
            err, count, finite = prom.query(inner)
            report.add("rules", what + " (argument)", inner, count, finite, err is None and finite > 0 and not health_note,
                       err or health_note or ("" if finite else "absent()'s argument is empty"))
            err, count, _ = prom.query(expr)
            report.add("rules", what + " (condition)", expr, count, "-", err is None and count == 0,
                       err or ("" if count == 0 else "absent() is non-empty although its argument exists"))
        elif cmp_ is not None:
            lhs, op, rhs = cmp_
            err, count, finite = prom.query(lhs)
            report.add("rules", what + " (operand)", lhs, count, finite, err is None and finite > 0 and not health_note,
                       err or health_note or ("" if finite else "the compared expression is empty"))
            err, count, _ = prom.query(expr)
            report.add("rules", what + " (condition)", expr, count, "-", err is None,
                       err or "condition %s %s holds for %d series" % (op, rhs, count))
        else:
            err, count, finite = prom.query(expr)
            report.add("rules", what, expr, count, finite, err is None and finite > 0 and not health_note,
                       err or health_note or ("" if finite else "no finite value"))


def parse_alert_spec(spec):
    m = re.match(r"^(\w+)(?:\{(.*)\})?$", spec)
    if not m:
        raise SystemExit("bad alert spec %r (NAME or NAME{label=\"value\",...})" % spec)
    labels = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', m.group(2) or ""))
    return m.group(1), labels


def check_alerts(prom, report, expect, expect_not):
    body = prom.get("/api/v1/alerts", {})
    alerts = body.get("data", {}).get("alerts", [])
    active = ["%s{%s} %s" % (a["labels"].get("alertname"), ",".join("%s=%s" % kv for kv in sorted(a["labels"].items()) if kv[0] != "alertname"), a["state"]) for a in alerts]

    def matching(name, labels):
        return [a for a in alerts if a["labels"].get("alertname") == name and all(a["labels"].get(k) == v for k, v in labels.items())]

    for spec in expect:
        found = matching(*parse_alert_spec(spec))
        report.add("alerts", "expected active", spec, len(found), "-", bool(found),
                   ", ".join(a["state"] for a in found) if found else "not pending or firing")
    for spec in expect_not:
        found = matching(*parse_alert_spec(spec))
        report.add("alerts", "expected inactive", spec, len(found), "-", not found,
                   "" if not found else "active: " + ", ".join(a["state"] for a in found))
    return active


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prometheus", default="http://127.0.0.1:9090")
    ap.add_argument("--rules", action="append", default=[])
    ap.add_argument("--rule-groups", metavar="REGEX",
                    help="check only the rule groups whose name matches REGEX (all of them must load)")
    ap.add_argument("--var", action="append", default=[], help="[DASHBOARD_UID:]NAME=VALUE[,VALUE]: select these values")
    ap.add_argument("--builtin", action="append", default=[], help="NAME=VALUE, e.g. __rate_interval=1m")
    ap.add_argument("--expect-alert", action="append", default=[])
    ap.add_argument("--expect-no-alert", action="append", default=[])
    ap.add_argument("--rules-timeout", type=float, default=60)
    ap.add_argument("--wait", type=float, default=0,
                    help="SECONDS: repeat the whole check until every item passes in one attempt or the time is up; only the last attempt's table is printed")
    ap.add_argument("--retry-interval", type=float, default=2)
    ap.add_argument("dashboards", nargs="*")
    args = ap.parse_args()

    overrides = {}
    for item in args.var:
        k, _, v = item.partition("=")
        overrides[k] = v.split(",")
    builtins = dict(BUILTINS)
    for item in args.builtin:
        k, _, v = item.partition("=")
        builtins[k.lstrip("$")] = v

    prom = Prom(args.prometheus)
    deadline = time.time() + args.wait
    attempt = 0
    while True:
        attempt += 1
        prom.cache.clear()
        report = Report(echo=args.wait <= 0)
        for path in args.dashboards:
            check_dashboard(path, prom, report, overrides, builtins)
        for path in args.rules:
            check_rules(path, prom, report, args.rules_timeout, args.rule_groups)
        active = check_alerts(prom, report, args.expect_alert, args.expect_no_alert)
        if not report.failures or time.time() >= deadline:
            break
        print("attempt %d: %d of %d checks failed, again in %gs: %s"
              % (attempt, report.failures, report.rows, args.retry_interval, "; ".join(report.failed)), flush=True)
        time.sleep(args.retry_interval)
    report.print_rows()
    report.summary()
    if args.wait > 0:
        print("attempts: %d" % attempt)
    print("active alerts: " + ("; ".join(active) if active else "none"))
    if not report.rows:
        print("nothing checked", file=sys.stderr)
        return 1
    return 1 if report.failures else 0

if __name__ == "__main__":
    sys.exit(main())
