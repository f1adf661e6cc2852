#!/usr/bin/env python3
"""Generates the qpwatch Grafana dashboards (dashboards/*.json).

The JSON files are committed; this script is their source. Edit it, then run

    dashboards/generate.py          # rewrite the JSON files
    dashboards/generate.py --check  # exit 1 if a committed file is out of date

Every panel and variable uses the `${datasource}` variable, every query
selects `job=~"$job", instance=~"$instance"`, and the PromQL follows the rules
in dashboards/README.md (rate over counters, `sum by (le, ...)` inside
histogram_quantile, `$__rate_interval`). Python 3 standard library only.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance"'
DEV = SEL + ', device=~"$device"'
RI = "$__rate_interval"


# --------------------------------------------------------------------------
# building blocks


def q(expr, legend="", ref=None, instant=False, fmt=None):
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        t["instant"] = True
        t["range"] = False
    else:
        t["range"] = True
    if fmt:
        t["format"] = fmt
    return t


def quantiles(metric, by, sel, qs=(0.5, 0.9, 0.99), legend_prefix=""):
    """histogram_quantile queries for metric_bucket, one per quantile."""
    by_clause = ", ".join(["le"] + list(by))
    legend_labels = " ".join("{{%s}}" % b for b in by)
    out = []
    for qv in qs:
        name = "p%g" % (qv * 100)
        legend = (legend_prefix + " " + legend_labels + " " + name).strip()
        out.append(
            q(
                "histogram_quantile(%g, sum by (%s) (rate(%s_bucket{%s}[%s])))"
                % (qv, by_clause, metric, sel, RI),
                legend,
            )
        )
    return out


class Board:
    def __init__(self):
        self.panels = []
        self.x = 0
        self.y = 0
        self.row_h = 0

    def _place(self, w, h):
        if self.x + w > 24:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self, title):
        if self.x:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def add(self, panel, w=12, h=8):
        panel["gridPos"] = self._place(w, h)
        self.panels.append(panel)
        return panel

    def finish(self):
        for i, p in enumerate(self.panels, start=1):
            p["id"] = i
            for j, t in enumerate(p.get("targets", [])):
                t["refId"] = t["refId"] or chr(ord("A") + j)
        return self.panels


def timeseries(title, targets, unit, description, stack=False, min0=True, links=None, decimals=None):
    custom = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    if stack:
        custom["fillOpacity"] = 40
    defaults = {"unit": unit, "custom": custom}
    if min0:
        defaults["min"] = 0
    if decimals is not None:
        defaults["decimals"] = decimals
    if links:
        defaults["links"] = links
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"], "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def heatmap(title, metric, sel, description, repeat=None):
    p = {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": {"unit": "s", "custom": {"scaleDistribution": {"type": "linear"}}}, "overrides": []},
        "options": {
            "calculate": False,
            "yAxis": {"unit": "s", "axisPlacement": "left", "reverse": False},
            "rowsFrame": {"layout": "auto"},
            "cellValues": {"unit": "ops"},
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5, "steps": 64, "fill": "dark-orange", "reverse": False},
            "filterValues": {"le": 1e-9},
            "tooltip": {"show": True, "yHistogram": True},
            "legend": {"show": True},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
        },
        "targets": [
            q("sum by (le) (rate(%s_bucket{%s}[%s]))" % (metric, sel, RI), "{{le}}", fmt="heatmap")
        ],
    }
    if repeat:
        p["repeat"] = repeat
        p["repeatDirection"] = "h"
        p["maxPerRow"] = 4
    return p


def stat(title, targets, unit, description, thresholds=None, color_mode="value", graph="area", mappings=None, decimals=None):
    steps = thresholds or [{"color": "green", "value": None}]
    defaults = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}, "mappings": mappings or []}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": color_mode,
            "graphMode": graph,
            "textMode": "auto",
            "orientation": "auto",
            "justifyMode": "auto",
        },
        "targets": targets,
    }


def table(title, targets, description, unit="short", exclude=()):
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"align": "auto"}}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {n: True for n in exclude}}},
        ],
        "targets": targets,
    }


def var_datasource():
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "includeAll": False,
        "multi": False,
        "options": [],
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
    }


def var_query(name, label, query, multi=True, include_all=True, hide=0):
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "multi": multi,
        "includeAll": include_all,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]} if include_all else {},
        "options": [],
        "hide": hide,
        "skipUrlSync": False,
    }


def dashboard(uid, title, description, panels, variables, links=()):
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": list(links),
        "liveNow": False,
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": ["qpwatch", "rdma"],
        "templating": {"list": variables},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


COMMON_VARS = [
    var_datasource(),
    var_query("job", "Job", "label_values(qpwatch_build_info, job)"),
    var_query("instance", "Instance", 'label_values(qpwatch_build_info{job=~"$job"}, instance)'),
]

DRILLDOWN_LINK = {
    "title": "Probe target ${__field.labels.target}",
    "url": "/d/qpwatch-probe-target/qpwatch-probe-target?var-target=${__field.labels.target}&${datasource:queryparam}&${job:queryparam}&${instance:queryparam}&${__url_time_range}",
}


# --------------------------------------------------------------------------
# overview


def overview():
    b = Board()
    b.row("QP lifecycle")
    b.add(timeseries(
        "QP create rate",
        [q("sum by (device, qp_type, origin) (rate(qpwatch_qp_created_total{%s}[%s]))" % (DEV, RI), "{{device}} {{qp_type}} {{origin}}")],
        "ops",
        "QPs created per second (ib_create_qp_user / ib_create_qp_kernel), by device, QP type and origin (user = uverbs, kernel = in-kernel consumer).",
    ), w=8)
    b.add(timeseries(
        "QP create latency",
        quantiles("qpwatch_qp_create_duration_seconds", ["origin"], DEV),
        "s",
        "Duration of the kernel's create call, p50/p90/p99 by origin over the selected devices.",
    ), w=8)
    b.add(timeseries(
        "QP create errors",
        [q("sum by (device, origin, errno) (rate(qpwatch_qp_create_errors_total{%s}[%s]))" % (DEV, RI), "{{device}} {{origin}} {{errno}}")],
        "ops",
        "Failed QP creations per second, by errno. The series exists once a creation has failed.",
    ), w=8)
    b.add(heatmap(
        "Transition latency into $to",
        "qpwatch_qp_transition_duration_seconds",
        SEL + ', to=~"$to"',
        "Distribution of successful state-changing _ib_modify_qp calls that entered $to, per second (one panel per target state; edges into the same state are summed, see the p99 panel for each edge).",
        repeat="to",
    ), w=24, h=7)
    b.add(timeseries(
        "Transition latency p99 by edge",
        [q("histogram_quantile(0.99, sum by (le, from, to) (rate(qpwatch_qp_transition_duration_seconds_bucket{%s}[%s])))" % (SEL, RI), "{{from}} → {{to}}")],
        "s",
        "p99 duration of successful state-changing modify calls, by edge (from → to; from=unknown for QPs whose previous state was never seen).",
    ), w=12)
    b.add(timeseries(
        "QP modify errors",
        [q("sum by (to, errno) (rate(qpwatch_qp_modify_errors_total{%s}[%s]))" % (SEL, RI), "→ {{to}} {{errno}}")],
        "ops",
        "Failed _ib_modify_qp calls per second, by requested state (unchanged = attribute-only modify) and errno.",
    ), w=12)
    b.add(timeseries(
        "Live QPs by state",
        [q("sum by (state) (qpwatch_qps{%s})" % DEV, "{{state}}")],
        "short",
        "QPs the agent tracks, by current state (qpwatch_qps, a gauge).",
        stack=True,
    ), w=8)
    b.add(timeseries(
        "Live QPs by device and type",
        [q("sum by (device, qp_type) (qpwatch_qps{%s})" % DEV, "{{device}} {{qp_type}}")],
        "short",
        "QPs the agent tracks, by device and QP type.",
        stack=True,
    ), w=8)
    b.add(timeseries(
        "QP destroy rate",
        [q("sum by (device, qp_type) (rate(qpwatch_qp_destroyed_total{%s}[%s]))" % (DEV, RI), "{{device}} {{qp_type}}")],
        "ops",
        "QPs destroyed per second (also those created before the agent started).",
    ), w=8)
    b.add(timeseries(
        "Time to RTS",
        quantiles("qpwatch_qp_time_to_rts_seconds", [], SEL),
        "s",
        "From the end of create to the end of the first transition into RTS: p50/p90/p99.",
    ), w=8)
    b.add(timeseries(
        "Time in state p99",
        [q("histogram_quantile(0.99, sum by (le, state) (rate(qpwatch_qp_state_dwell_seconds_bucket{%s}[%s])))" % (SEL, RI), "{{state}}")],
        "s",
        "p99 time QPs spent in each state before the next transition or destroy.",
    ), w=8)
    b.add(timeseries(
        "QP lifetime",
        quantiles("qpwatch_qp_lifetime_seconds", [], SEL, qs=(0.5, 0.99)),
        "s",
        "From the end of create to the end of destroy: p50/p99.",
    ), w=8)
    b.add(timeseries(
        "QPs created by process",
        [q("topk(10, sum by (comm) (rate(qpwatch_qp_created_by_process_total{%s}[%s])))" % (SEL, RI), "{{comm}}")],
        "ops",
        "QPs created per second by task name (the first --max-process-labels names; the rest are \"other\").",
    ), w=12, h=7)
    b.add(timeseries(
        "QPs created by cgroup",
        [q("topk(10, sum by (cgroup) (rate(qpwatch_qp_created_by_cgroup_total{%s}[%s])))" % (SEL, RI), "{{cgroup}}")],
        "ops",
        "QPs created per second by the creating task's cgroup v2 path: a systemd unit (/system.slice/NAME.service), a session, or a Kubernetes pod (kubepods...pod<UID>...); the first --max-cgroup-labels paths, the rest \"other\"; \"unknown\" when the agent could not name it. qpwatch events has the full path of every create.",
    ), w=12, h=7)

    b.row("RDMA CM")
    b.add(timeseries(
        "CM connect latency",
        quantiles("qpwatch_cm_connect_duration_seconds", ["role"], SEL, qs=(0.5, 0.99)),
        "s",
        "Connection setup, p50/p99 by role: active = REQ sent → established, passive = CONNECT_REQUEST → ESTABLISHED.",
    ), w=8)
    b.add(timeseries(
        "CM events",
        [q("sum by (event) (rate(qpwatch_cm_events_total{%s}[%s]))" % (SEL, RI), "{{event}}")],
        "ops",
        "RDMA CM events delivered to consumers per second, by event.",
    ), w=8)
    b.add(timeseries(
        "CM error events",
        [q("sum by (event) (rate(qpwatch_cm_errors_total{%s}[%s]))" % (SEL, RI), "{{event}}")],
        "ops",
        "REJECTED, UNREACHABLE, CONNECT_ERROR, ADDR_ERROR and ROUTE_ERROR events per second. REJECTED with status reject_8 is a connect to a port nobody listens on.",
    ), w=8)
    b.add(timeseries(
        "CM call latency p99",
        [q("histogram_quantile(0.99, sum by (le, call) (rate(qpwatch_cm_call_duration_seconds_bucket{%s}[%s])))" % (SEL, RI), "{{call}}")],
        "s",
        "p99 duration of rdma_cm calls (rdma_resolve_addr, rdma_resolve_route, rdma_listen, rdma_create_qp) and, for kernel QPs, of the CMA's QP transitions (cma_modify_qp_rtr, ...).",
    ), w=8)
    b.add(timeseries(
        "CM call errors",
        [q("sum by (call, errno) (rate(qpwatch_cm_call_errors_total{%s}[%s]))" % (SEL, RI), "{{call}} {{errno}}")],
        "ops",
        "rdma_cm calls that returned an error, per second, by call and errno.",
    ), w=8)
    b.add(timeseries(
        "Address and route resolution p99",
        [
            q("histogram_quantile(0.99, sum by (le) (rate(qpwatch_cm_address_resolve_duration_seconds_bucket{%s}[%s])))" % (SEL, RI), "address p99"),
            q("histogram_quantile(0.99, sum by (le) (rate(qpwatch_cm_route_resolve_duration_seconds_bucket{%s}[%s])))" % (SEL, RI), "route p99"),
        ],
        "s",
        "rdma_resolve_addr() → ADDR_RESOLVED and rdma_resolve_route() → ROUTE_RESOLVED, successes only.",
    ), w=8)
    b.add(timeseries(
        "Live CM ids by state",
        [q("sum by (state) (qpwatch_cm_ids{%s})" % SEL, "{{state}}")],
        "short",
        "RDMA CM ids attached to a device, by rdma_cm_state (ESTABLISHED = CONNECT after establishment).",
        stack=True,
    ), w=12)
    b.add(timeseries(
        "IB CM and ucma handler p99",
        [q("histogram_quantile(0.99, sum by (le, handler, event) (rate(qpwatch_cm_handler_duration_seconds_bucket{%s}[%s])))" % (SEL, RI), "{{handler}} {{event}}")],
        "s",
        "p99 time in the CMA's IB CM handlers (cma_ib_handler, cma_ib_req_handler: IB CM events such as REP_RECEIVED) and in ucma_event_handler (delivery to userspace).",
    ), w=12)
    b.add(timeseries(
        "IB CM messages (top 10)",
        [q("topk(10, sum by (direction, message) (rate(qpwatch_ib_cm_messages_total{%s}[%s])))" % (DEV, RI), "{{direction}} {{message}}"),
         q("topk(10, sum by (direction, message) (rate(qpwatch_ib_cm_messages_repeated_total{%s}[%s])))" % (DEV, RI), "{{direction}} again {{message}}")],
        "ops",
        "IB CM messages per second (ib_cm's own per-port counters, every IB CM consumer): REQ/REP/RTU/REJ/MRA/DREQ/DREP sent and received; 'again': sent again after a timeout, or received twice.",
    ), w=12)
    b.add(timeseries(
        "IB CM tracepoint hits (top 10)",
        [q("topk(10, sum by (tracepoint) (rate(qpwatch_tracepoint_hits_total{%s}[%s])))" % (SEL, RI), "{{tracepoint}}")],
        "ops",
        "Hits per second of the ib_cma:* tracepoints, e.g. ib_cma:icm_no_listener_err, ib_cma:icm_staleconn_err. Only from agents running the opt-in ib-cm-tracepoints group (it pins ib_cm).",
    ), w=12)
    b.add(timeseries(
        "CM event handler p99",
        [q("histogram_quantile(0.99, sum by (le, event) (rate(qpwatch_cm_event_handler_duration_seconds_bucket{%s}[%s])))" % (SEL, RI), "{{event}}")],
        "s",
        "p99 time the consumer spent handling one CM event (cma_cm_event_handler), by event.",
    ), w=12)

    b.row("Why QPs died")
    b.add(timeseries(
        "QPs entering ERR by cause",
        [q("sum by (cause) (rate(qpwatch_qp_errors_total{%s}[%s]))" % (SEL, RI), "{{cause}}")],
        "ops",
        "QPs that entered ERR per second, by cause: requested (a modify to ERR by the owner, e.g. rdma_disconnect), async_event:<event> (an affiliated error the device reported: QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR), completion:<status> (the device moved it after that error completion, e.g. RETRY_EXC_ERR; soft-RoCE only), unknown (the device moved it, no cause seen).",
        stack=True,
    ), w=8)
    b.add(timeseries(
        "QP async events",
        [q("sum by (device, event) (rate(qpwatch_qp_async_events_total{%s}[%s]))" % (DEV, RI), "{{device}} {{event}}")],
        "ops",
        "QP async events delivered to the QPs' consumers per second (uverbs for userspace QPs, the ULP's handler for kernel QPs), by the kernel's event name. QP_FATAL, QP_REQ_ERR and QP_ACCESS_ERR put the QP in ERR; SQ_DRAINED, COMM_EST, PATH_MIG, QP_LAST_WQE_REACHED are informational.",
    ), w=8)
    b.add(timeseries(
        "Completion errors by status",
        [q("sum by (device, status) (rate(qpwatch_qp_completion_errors_total{%s}[%s]))" % (DEV, RI), "{{device}} {{status}}")],
        "ops",
        "Work completions in error per second, flushes left out, by the kernel's status name (RETRY_EXC_ERR: transport retries ran out; RNR_RETRY_EXC_ERR; REM_ACCESS_ERR, ...). Soft-RoCE only: other devices write completions where the kernel does not see them; see the device counters below.",
    ), w=8)

    b.row("Device counters")
    b.add(timeseries(
        "Device error and retry counters (top 10)",
        [q("topk(10, sum by (device, port, counter) (rate(qpwatch_port_hw_stats_total{%s, counter=~\".*(err|retry|retries|timeout|nak|seq|sequence|duplicate|discard|downed).*\"}[%s])) or sum by (device, counter) (rate(qpwatch_device_hw_stats_total{%s, counter=~\".*(err|retry|retries|timeout|nak|seq|sequence|duplicate|discard|downed).*\"}[%s])))" % (DEV, RI, DEV, RI), "{{device}}/{{port}} {{counter}}")],
        "ops",
        "Per second, the driver's error, retry, sequence and NAK counters of each device port and device (sysfs hw_counters, read at each scrape; names as the driver gives them: soft-RoCE's retry_exceeded_err, mlx5's local_ack_timeout_err, out_of_sequence, ...). A QP that went to ERR after retries ran out shows here as retry_exceeded_err or local_ack_timeout_err.",
    ), w=12)
    b.add(timeseries(
        "Device counters (top 10)",
        [q("topk(10, sum by (device, port, counter) (rate(qpwatch_port_hw_stats_total{%s}[%s])) or sum by (device, counter) (rate(qpwatch_device_hw_stats_total{%s}[%s])) or sum by (device, port, counter) (rate(qpwatch_port_ib_stats_total{%s}[%s])))" % (DEV, RI, DEV, RI, DEV, RI), "{{device}}/{{port}} {{counter}}")],
        "ops",
        "Per second, the busiest of every device counter: the driver's (hw_counters) and the IB port counters where the device has them (port_xmit_data and port_rcv_data in 4-octet words).",
    ), w=12)

    b.row("Synthetic probes")
    b.add(timeseries(
        "Probe success ratio",
        [q('sum by (target) (rate(qpwatch_probe_total{%s, target=~"$target", result="ok"}[%s])) / sum by (target) (rate(qpwatch_probe_total{%s, target=~"$target"}[%s]))' % (SEL, RI, SEL, RI), "{{target}}")],
        "percentunit",
        "Share of probes that succeeded (connect, ping-pong, disconnect), by target. Click a series for the target's drill-down.",
        links=[DRILLDOWN_LINK],
    ), w=8)
    b.add(timeseries(
        "Probe RTT p99",
        [q('histogram_quantile(0.99, sum by (le, target) (rate(qpwatch_probe_rtt_seconds_bucket{%s, target=~"$target"}[%s])))' % (SEL, RI), "{{target}}")],
        "s",
        "p99 round-trip time of the probes' SEND/RECV ping-pong, by target. Empty (NaN) for a target without a successful ping in the window.",
        links=[DRILLDOWN_LINK],
    ), w=8)
    b.add(timeseries(
        "Probe failures by result",
        [q('sum by (target, result) (rate(qpwatch_probe_total{%s, target=~"$target", result!="ok"}[%s]))' % (SEL, RI), "{{target}} {{result}}")],
        "ops",
        "Failed probes per second, by target and result (timeout, rejected, unreachable, addr_error, route_error, connect_error, error).",
        links=[DRILLDOWN_LINK],
    ), w=8)
    b.add(stat(
        "Probe targets up",
        [q('max by (target) (qpwatch_probe_up{%s, target=~"$target"})' % SEL, "{{target}}", instant=True)],
        "short",
        "1 if the target's last probe succeeded, 0 if not.",
        thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}],
        color_mode="background",
        graph="none",
        mappings=[{"type": "value", "options": {"0": {"text": "DOWN", "index": 0}, "1": {"text": "UP", "index": 1}}}],
    ), w=6, h=6)
    b.add(timeseries(
        "Probe QPs unseen by eBPF",
        [q('sum by (target) (increase(qpwatch_probe_qps_unseen_total{%s, target=~"$target"}[%s]))' % (SEL, RI), "{{target}}")],
        "short",
        "Probe QPs with a verb call the eBPF path did not see (the agent's tracing self-test); anything above 0 means hooks miss events.",
    ), w=6, h=6)
    b.add(timeseries(
        "Responder",
        [
            q("sum by (event) (rate(qpwatch_responder_connections_total{%s}[%s]))" % (SEL, RI), "connections {{event}}"),
            q("sum(rate(qpwatch_responder_echoes_total{%s}[%s]))" % (SEL, RI), "echoes"),
        ],
        "ops",
        "This agent's probe responder (what other agents' targets point at): connections by event and echoed messages per second.",
    ), w=8, h=6)
    b.add(stat(
        "Responder connections open",
        [q("sum(qpwatch_responder_active_connections{%s})" % SEL, "", instant=True)],
        "short",
        "Probe responder connections open now (persistent-mode targets keep one each).",
    ), w=4, h=6)
    b.add(timeseries(
        "Refused: HTTP endpoint and probe responder",
        [
            q("sum by (reason) (rate(qpwatch_http_connections_refused_total{%s}[%s]))" % (SEL, RI), "http {{reason}}"),
            q("sum by (reason) (rate(qpwatch_http_auth_failures_total{%s}[%s]))" % (SEL, RI), "http auth {{reason}}"),
            q("sum by (reason) (rate(qpwatch_responder_refused_total{%s}[%s]))" % (SEL, RI), "responder {{reason}}"),
            q("sum by (reason) (rate(qpwatch_responder_malformed_total{%s}[%s]))" % (SEL, RI), "responder malformed {{reason}}"),
        ],
        "ops",
        "What the agent turned away per second (README \"Security\"): HTTP connections over a limit or timed out, failed basic auth, probe responder connect requests refused (allow-list, caps) and messages that were not probes. The UD responder's refusals are in the mesh dashboard's \"Dropped messages\".",
    ), w=12, h=6)

    b.row("Agent health")
    b.add(stat(
        "Up",
        [q("min(up{%s})" % SEL, "", instant=True)],
        "short",
        "Prometheus scrape health of the selected agents (min: 0 if any is down).",
        thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}],
        color_mode="background",
        graph="none",
        mappings=[{"type": "value", "options": {"0": {"text": "DOWN", "index": 0}, "1": {"text": "UP", "index": 1}}}],
    ), w=4, h=5)
    b.add(stat(
        "Hooks attached",
        [q("sum(qpwatch_hook_attached{%s})" % SEL, "", instant=True)],
        "short",
        "kprobes, kretprobes and raw tracepoints attached, over the selected agents.",
        graph="none",
    ), w=4, h=5)
    b.add(stat(
        "Hooks not attached",
        [q("sum(1 - qpwatch_hook_attached{%s})" % SEL, "", instant=True)],
        "short",
        "Hooks of an enabled group that did not attach (qpwatch_hook_attached == 0); the agent's log says why.",
        thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
        color_mode="background",
        graph="none",
    ), w=4, h=5)
    b.add(stat(
        "TLS certificate expires in",
        [q("min(qpwatch_http_tls_cert_expiry_timestamp_seconds{%s}) - time()" % SEL, "", instant=True)],
        "s",
        "Time until the first of the selected agents' served TLS certificates expires (web configuration cert_file, as reloaded); red under 14 days, as QpwatchTlsCertExpiringSoon. No value for agents without TLS.",
        thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 14 * 86400}],
        color_mode="background",
        graph="none",
    ), w=4, h=5)
    b.add(stat(
        "Events lost",
        [q("sum(increase(qpwatch_events_lost_total{%s}[$__range]))" % SEL, "", instant=True)],
        "short",
        "Kernel events that never reached the agent over the dashboard's time range (ring buffer full, pending table full, unmatched returns).",
        thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
        color_mode="background",
        graph="none",
        decimals=0,
    ), w=4, h=5)
    b.add(stat(
        "Tracked QPs",
        [q("sum(qpwatch_tracked_qps{%s})" % SEL, "", instant=True)],
        "short",
        "Size of the agents' QP state tables (bounded by --max-tracked-qps).",
    ), w=4, h=5)
    b.add(table(
        "Agent build",
        [q("max by (instance, version, kernel) (qpwatch_build_info{%s})" % SEL, "", instant=True, fmt="table")],
        "qpwatch version and kernel of each agent.",
        exclude=("Time", "Value"),
    ), w=4, h=5)
    b.add(timeseries(
        "Kernel events received",
        [q("sum by (kind) (rate(qpwatch_events_total{%s}[%s]))" % (SEL, RI), "{{kind}}")],
        "ops",
        "Events decoded from the ring buffer per second, by kind.",
    ), w=8)
    b.add(timeseries(
        "Events lost",
        [q("sum by (reason) (rate(qpwatch_events_lost_total{%s}[%s]))" % (SEL, RI), "{{reason}}")],
        "ops",
        "Events lost in the kernel per second, by reason (ring_buffer_full: raise --ring-buffer-bytes).",
    ), w=8)
    b.add(timeseries(
        "Table evictions and label overflow",
        [
            q("sum(rate(qpwatch_tracked_qps_evicted_total{%s}[%s]))" % (SEL, RI), "QPs evicted (table full)"),
            q("sum by (label) (rate(qpwatch_label_overflow_total{%s}[%s]))" % (SEL, RI), "folded into other: {{label}}"),
        ],
        "ops",
        "QPs evicted from the full state table (raise --max-tracked-qps) and observations folded into \"other\" by a label cap (--max-device-labels, --max-process-labels).",
    ), w=8)
    b.add(timeseries(
        "BPF CPU time by hook (top 10)",
        [q("topk(10, sum by (hook) (rate(qpwatch_bpf_program_run_seconds_total{%s}[%s])))" % (SEL, RI), "{{hook}}")],
        "percentunit",
        "Share of one CPU spent in each hook's BPF program (kernel BPF statistics; the agent must run with --bpf-stats).",
    ), w=12)
    b.add(timeseries(
        "BPF run time per invocation (top 10)",
        [q("topk(10, sum by (hook) (rate(qpwatch_bpf_program_run_seconds_total{%s}[%s])) / sum by (hook) (rate(qpwatch_bpf_program_runs_total{%s}[%s])))" % (SEL, RI, SEL, RI), "{{hook}}")],
        "s",
        "Mean run time of one invocation of each hook's BPF program (--bpf-stats).",
    ), w=12)
    b.add(timeseries(
        "Agent CPU",
        [q("sum by (instance) (rate(process_cpu_seconds_total{%s}[%s]))" % (SEL, RI), "{{instance}}")],
        "percentunit",
        "Share of one CPU the qpwatch process uses (user + system, from /proc/self/stat).",
    ), w=12)
    b.add(timeseries(
        "Agent resident memory",
        [q("sum by (instance) (process_resident_memory_bytes{%s})" % SEL, "{{instance}}")],
        "bytes",
        "Resident set size of the qpwatch process.",
    ), w=12)
    b.add(timeseries(
        "Kernel counters: age of the last sysfs read",
        [q("max by (instance) (time() - qpwatch_sysfs_last_read_timestamp_seconds{%s})" % SEL, "{{instance}}")],
        "s",
        "How old the ib_cm, port and hw_stats counters are: the agent reads them from sysfs every sysfs_counters.interval_seconds (5 s); a rising line is a read that hangs (QpwatchSysfsCountersStale).",
    ), w=12)
    return dashboard(
        "qpwatch-overview",
        "qpwatch overview",
        "RDMA Queue Pair lifecycle, RDMA CM, synthetic probes and agent health, from qpwatch.",
        b.finish(),
        COMMON_VARS
        + [
            var_query("device", "Device", 'label_values(qpwatch_qps{job=~"$job", instance=~"$instance"}, device)'),
            var_query("target", "Probe target", 'label_values(qpwatch_probe_total{job=~"$job", instance=~"$instance"}, target)'),
            var_query("to", "Transition into", 'label_values(qpwatch_qp_transition_duration_seconds_count{job=~"$job", instance=~"$instance"}, to)'),
        ],
        links=[{"title": "Probe target drill-down", "type": "link", "url": "/d/qpwatch-probe-target/qpwatch-probe-target", "icon": "dashboard", "includeVars": True, "keepTime": True}],
    )


# --------------------------------------------------------------------------
# per-target probe drill-down


def probe_target():
    t = SEL + ', target="$target"'
    b = Board()
    b.row("Target $target")
    b.add(stat(
        "Up",
        [q("max(qpwatch_probe_up{%s})" % t, "", instant=True)],
        "short",
        "1 if the last probe of this target succeeded.",
        thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}],
        color_mode="background",
        graph="none",
        mappings=[{"type": "value", "options": {"0": {"text": "DOWN", "index": 0}, "1": {"text": "UP", "index": 1}}}],
    ), w=6, h=5)
    b.add(stat(
        "Success ratio",
        [q('sum(increase(qpwatch_probe_total{%s, result="ok"}[$__range])) / sum(increase(qpwatch_probe_total{%s}[$__range]))' % (t, t), "", instant=True)],
        "percentunit",
        "Share of the probes over the dashboard's time range that succeeded.",
        thresholds=[{"color": "red", "value": None}, {"color": "orange", "value": 0.9}, {"color": "green", "value": 0.99}],
        graph="none",
    ), w=6, h=5)
    b.add(stat(
        "Probes",
        [q("sum(increase(qpwatch_probe_total{%s}[$__range]))" % t, "", instant=True)],
        "short",
        "Probes run over the dashboard's time range.",
        graph="none",
        decimals=0,
    ), w=6, h=5)
    b.add(stat(
        "Mean RTT",
        [q("sum(rate(qpwatch_probe_rtt_seconds_sum{%s}[$__range])) / sum(rate(qpwatch_probe_rtt_seconds_count{%s}[$__range]))" % (t, t), "", instant=True)],
        "s",
        "Mean ping-pong round-trip time over the dashboard's time range.",
        graph="none",
    ), w=6, h=5)
    b.add(timeseries(
        "Probe results",
        [q("sum by (result) (rate(qpwatch_probe_total{%s}[%s]))" % (t, RI), "{{result}}")],
        "ops",
        "Probes per second by result (ok, timeout, rejected, unreachable, addr_error, route_error, connect_error, error).",
        stack=True,
    ), w=12)
    b.add(timeseries(
        "RTT percentiles",
        quantiles("qpwatch_probe_rtt_seconds", [], t, qs=(0.5, 0.9, 0.99)),
        "s",
        "Round-trip time of the SEND/RECV ping-pong: p50/p90/p99.",
    ), w=12)
    b.add(heatmap(
        "RTT distribution",
        "qpwatch_probe_rtt_seconds",
        t,
        "Ping-pong round-trip times per second, by bucket.",
    ), w=12)
    b.add(timeseries(
        "Setup step latency p99",
        [q("histogram_quantile(0.99, sum by (le, step) (rate(qpwatch_probe_setup_duration_seconds_bucket{%s}[%s])))" % (t, RI), "{{step}}")],
        "s",
        "p99 latency of each connection step (addr_resolve, route_resolve, qp_create, connect, established, disconnect).",
    ), w=12)
    b.add(timeseries(
        "Setup step mean latency",
        [q("sum by (step) (rate(qpwatch_probe_setup_duration_seconds_sum{%s}[%s])) / sum by (step) (rate(qpwatch_probe_setup_duration_seconds_count{%s}[%s]))" % (t, RI, t, RI), "{{step}}")],
        "s",
        "Mean latency of each connection step; with the p99 panel it tells a slow tail from a slow step.",
    ), w=12)
    b.add(timeseries(
        "Probe QPs unseen by eBPF",
        [q("sum(increase(qpwatch_probe_qps_unseen_total{%s}[%s]))" % (t, RI), "unseen")],
        "short",
        "Probe QPs of this target with a verb call the eBPF path did not see. Above 0: the agent's hooks miss events.",
    ), w=12)
    b.row("eBPF cross-check (all targets of the agent)")
    b.add(timeseries(
        "Userspace minus kernel verb duration",
        quantiles("qpwatch_probe_kernel_userspace_skew_seconds", ["call"], SEL, qs=(0.5, 0.99)),
        "s",
        "Probe QP verb calls: the duration userspace measured minus the one the eBPF hooks measured (syscall and library overhead, normally a few µs). Not per target: the histogram has only a call label.",
        min0=False,
    ), w=24)
    return dashboard(
        "qpwatch-probe-target",
        "qpwatch probe target",
        "One synthetic probe target of a qpwatch agent: results, RTT, setup steps and the eBPF cross-check.",
        b.finish(),
        COMMON_VARS
        + [var_query("target", "Probe target", 'label_values(qpwatch_probe_total{job=~"$job", instance=~"$instance"}, target)', multi=False, include_all=False)],
        links=[{"title": "qpwatch overview", "type": "link", "url": "/d/qpwatch-overview/qpwatch-overview", "icon": "dashboard", "includeVars": True, "keepTime": True}],
    )


# --------------------------------------------------------------------------
# fleet mode: the UD probe mesh


def matrix(title, expr, unit, description, thresholds):
    """A source instance x target table of one instant value per path
    (Grafana's groupingToMatrix transformation), cells coloured by value."""
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {"align": "auto", "cellOptions": {"type": "color-background"}},
                "thresholds": {"mode": "absolute", "steps": thresholds},
            },
            "overrides": [],
        },
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [
            {"id": "groupingToMatrix", "options": {"rowField": "instance", "columnField": "target", "valueField": "Value", "emptyValue": "null"}},
        ],
        "targets": [q(expr, "", instant=True, fmt="table")],
    }


def mesh():
    t = SEL + ', target=~"$target"'
    loss_by = lambda by, sel, w: (  # noqa: E731
        "sum by (%s) (rate(qpwatch_mesh_probes_lost_total{%s}[%s])) / (sum by (%s) (rate(qpwatch_mesh_probes_sent_total{%s}[%s])) > 0)"
        % (by, sel, w, by, sel, w)
    )
    rtt_by = lambda qv, by, sel, w: (  # noqa: E731
        "histogram_quantile(%g, sum by (le, %s) (rate(qpwatch_mesh_probe_rtt_seconds_bucket{%s}[%s])))" % (qv, by, sel, w)
    )
    loss_steps = [{"color": "green", "value": None}, {"color": "orange", "value": 0.001}, {"color": "red", "value": 0.01}]
    b = Board()
    b.row("Paths: source instance x target")
    b.add(matrix(
        "Loss ratio by path (time range)",
        loss_by("instance, target", t, "$__range"),
        "percentunit",
        "Share of the UD probes from each agent (rows) to each target (columns) that got no answer within the timeout, over the dashboard's time range. A column of losses: the target or its link; a row: the source.",
        loss_steps,
    ), w=12, h=9)
    b.add(matrix(
        "Median RTT by path (time range)",
        rtt_by(0.5, "instance, target", t, "$__range"),
        "s",
        "Median round-trip time of the UD probes from each agent (rows) to each target (columns) over the dashboard's time range.",
        [{"color": "green", "value": None}],
    ), w=12, h=9)
    b.add(timeseries(
        "Loss ratio by path",
        [q(loss_by("instance, target", t, RI), "{{instance}} -> {{target}}")],
        "percentunit",
        "Lost / sent UD probes per path (rule: instance_target:qpwatch_mesh_probes_lost:ratio_rate1m; alert QpwatchMeshPathLoss above 1% for 1m).",
    ), w=12)
    b.add(timeseries(
        "Median RTT by path",
        [q(rtt_by(0.5, "instance, target", t, RI), "{{instance}} -> {{target}}")],
        "s",
        "Median UD probe round-trip time per path (alert QpwatchMeshPathRttHigh: the 5m median above twice the path's 1h median for 10m).",
    ), w=12)
    b.row("Network or host: the RTT breakdown ([mesh] rtt_breakdown)")
    b.add(timeseries(
        "Network RTT and responder delay by path (median)",
        [
            q("histogram_quantile(0.5, sum by (le, instance, target) (rate(qpwatch_mesh_probe_network_rtt_seconds_bucket{%s}[%s])))" % (t, RI), "{{instance}} -> {{target}} network"),
            q("histogram_quantile(0.5, sum by (le, instance, target) (rate(qpwatch_mesh_responder_delay_seconds_bucket{%s}[%s])))" % (t, RI), "{{instance}} -> {{target}} responder"),
        ],
        "s",
        "Median network RTT (the RTT less the responder's delay; label clock says which clock timed it) and median responder delay (probe received to answer posted, with the responder thread's run-queue wait) per path.",
    ), w=12)
    b.add(table(
        "Slow paths: network or host",
        [
            q('max by (instance, target) (instance_target:qpwatch_mesh_path_slow_network:bool{%s})' % t, "network", ref="A", instant=True, fmt="table"),
            q('max by (instance, target) (instance_target:qpwatch_mesh_path_slow_host:bool{%s})' % t, "host", ref="B", instant=True, fmt="table"),
        ],
        "Per path, 1 where it is slow now (a part of its RTT rose by more than 10% of its normal network RTT) and which part rose more: network (Value #A) or the target host (Value #B). Alert QpwatchMeshPathSlow{cause} after 1m.",
        exclude=("Time",),
    ), w=12)
    b.row("Worst paths")
    b.add(timeseries(
        "Top 10 paths by loss ratio",
        [q("topk(10, %s)" % loss_by("instance, target", t, RI), "{{instance}} -> {{target}}")],
        "percentunit",
        "The ten paths with the highest share of lost probes.",
    ), w=12)
    b.add(timeseries(
        "Top 10 paths by p99 RTT",
        [q("topk(10, %s)" % rtt_by(0.99, "instance, target", t, RI), "{{instance}} -> {{target}}")],
        "s",
        "The ten paths with the highest p99 UD probe round-trip time.",
    ), w=12)
    b.row("Target racks and ToRs (the targets file's labels)")
    b.add(timeseries(
        "Loss ratio by target rack",
        [q(loss_by("rack", t, RI), "rack {{rack}}")],
        "percentunit",
        "Lost / sent probes of every source to the targets of each rack (label rack of the targets file; rule job_rack:qpwatch_mesh_probes_lost:ratio_rate1m).",
    ), w=12)
    b.add(timeseries(
        "Loss ratio by target ToR",
        [q(loss_by("tor", t, RI), "tor {{tor}}")],
        "percentunit",
        "Lost / sent probes of every source to the targets behind each ToR (label tor; rule job_tor:qpwatch_mesh_probes_lost:ratio_rate1m).",
    ), w=12)
    b.add(timeseries(
        "Median RTT by target rack",
        [q(rtt_by(0.5, "rack", t, RI), "rack {{rack}}")],
        "s",
        "Median probe round-trip time to the targets of each rack, every source together.",
    ), w=12)
    b.add(timeseries(
        "Median RTT by target ToR",
        [q(rtt_by(0.5, "tor", t, RI), "tor {{tor}}")],
        "s",
        "Median probe round-trip time to the targets behind each ToR, every source together.",
    ), w=12)
    b.row("Probes, targets and responders")
    b.add(timeseries(
        "Probes by agent",
        [
            q("sum by (instance) (rate(qpwatch_mesh_probes_sent_total{%s}[%s]))" % (t, RI), "{{instance}} sent"),
            q("sum by (instance) (rate(qpwatch_mesh_probes_answered_total{%s}[%s]))" % (t, RI), "{{instance}} answered"),
            q("sum by (instance) (rate(qpwatch_mesh_probes_lost_total{%s}[%s]))" % (t, RI), "{{instance}} lost"),
        ],
        "ops",
        "UD probes sent, answered and lost per second by each agent, all its targets together.",
    ), w=12)
    b.add(timeseries(
        "Targets by agent",
        [
            q("sum by (instance, source) (qpwatch_mesh_targets{%s})" % SEL, "{{instance}} {{source}}"),
            q("sum by (instance) (1 - qpwatch_mesh_target_resolved{%s})" % SEL, "{{instance}} unresolved"),
        ],
        "short",
        "Targets each agent probes (from the configuration or the targets file) and those it has no address handle for (alert QpwatchMeshTargetUnresolved).",
    ), w=12)
    b.add(timeseries(
        "Target resolution failures",
        [q("sum by (instance, reason) (rate(qpwatch_mesh_resolve_failures_total{%s}[%s]))" % (SEL, RI), "{{instance}} {{reason}}")],
        "ops",
        "Failed resolutions of a target (rdma_cm address, route or SIDR) per second by reason: addr_error, route_error, unreachable, rejected, timeout, error. They are retried.",
    ), w=12)
    b.add(timeseries(
        "Targets file",
        [
            q("min by (instance) (qpwatch_mesh_targets_file_ok{%s})" % SEL, "{{instance}} last read ok"),
            q("sum by (instance, result) (increase(qpwatch_mesh_targets_file_reloads_total{%s}[%s]))" % (SEL, RI), "{{instance}} reloads {{result}}"),
        ],
        "short",
        "1 if the last read of the targets file was good (alert QpwatchMeshTargetsFileBad); reloads by result. A bad file keeps the last good list.",
    ), w=12)
    b.add(timeseries(
        "Responder answers",
        [q("sum by (instance, device) (rate(qpwatch_mesh_responses_total{%s}[%s]))" % (SEL, RI), "{{instance}} {{device}}")],
        "ops",
        "UD probes from peers each agent answered per second, by device: every agent in fleet mode is a responder.",
    ), w=12)
    b.add(timeseries(
        "Dropped messages",
        [q("sum by (instance, reason) (rate(qpwatch_mesh_messages_dropped_total{%s}[%s]))" % (SEL, RI), "{{instance}} {{reason}}")],
        "ops",
        "UD messages the mesh dropped per second by reason: malformed, unknown_answer (late, after its probe's timeout, or duplicated), no_return_path, send_queue_full.",
    ), w=12)
    b.add(timeseries(
        "Mesh UD QPs",
        [
            q("sum by (instance) (qpwatch_mesh_qps{%s})" % SEL, "{{instance}} UD QPs"),
            q('sum by (instance) (increase(qpwatch_probe_qps_unseen_total{%s, target="mesh"}[%s]))' % (SEL, RI), "{{instance}} unseen by eBPF"),
        ],
        "short",
        "UD QPs the mesh holds (one per local RDMA device, whatever the number of targets) and those whose creation the eBPF path did not see.",
    ), w=12)
    return dashboard(
        "qpwatch-mesh",
        "qpwatch mesh",
        "Fleet mode: loss and RTT of the UD probe mesh between qpwatch agents, per path (source instance x target), per target rack and ToR, with the worst paths.",
        b.finish(),
        COMMON_VARS
        + [var_query("target", "Target", 'label_values(qpwatch_mesh_probes_sent_total{job=~"$job", instance=~"$instance"}, target)')],
        links=[{"title": "qpwatch overview", "type": "link", "url": "/d/qpwatch-overview/qpwatch-overview", "icon": "dashboard", "includeVars": True, "keepTime": True}],
    )


FILES = {
    "qpwatch-overview.json": overview,
    "qpwatch-probe-target.json": probe_target,
    "qpwatch-mesh.json": mesh,
}


def render(fn):
    return json.dumps(fn(), indent=2, ensure_ascii=False) + "\n"


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for name, fn in FILES.items():
        path = os.path.join(HERE, name)
        text = render(fn)
        if check:
            try:
                with open(path, encoding="utf-8") as f:
                    current = f.read()
            except FileNotFoundError:
                current = None
            if current != text:
                stale.append(name)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            print("wrote", os.path.relpath(path))
    if stale:
        print("dashboards out of date (run dashboards/generate.py): " + ", ".join(stale), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
