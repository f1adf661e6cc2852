#!/usr/bin/env python3
"""Unit tests of check_queries.py's PromQL and Grafana helpers (no server):
    python3 -m unittest discover -s tests/dashboards"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_queries as cq  # noqa: E402


class Helpers(unittest.TestCase):
    def test_comparison_split(self):
        self.assertEqual(cq.top_level_comparison('up{job="qpwatch"} == 0'), ('up{job="qpwatch"}', "==", "0"))
        self.assertEqual(cq.top_level_comparison("a:b:c{quantile=\"0.99\"} > 0.1"), ('a:b:c{quantile="0.99"}', ">", "0.1"))
        self.assertEqual(cq.top_level_comparison("increase(x[15m]) >= 1"), ("increase(x[15m])", ">=", "1"))
        # comparisons and matchers inside brackets, braces or strings do not count
        self.assertIsNone(cq.top_level_comparison('sum(x{a!="b", c=~"d>e"}) / sum(y)'))
        self.assertIsNone(cq.top_level_comparison("sum(x > 0)"))
        self.assertEqual(cq.top_level_comparison("(a > 1) != bool 0")[1], "!=")

    def test_absent(self):
        self.assertEqual(cq.absent_argument('absent(up{job="qpwatch"})'), 'up{job="qpwatch"}')
        self.assertEqual(cq.absent_argument("absent_over_time(x[5m])"), "x[5m]")
        self.assertIsNone(cq.absent_argument("absent(x) or absent(y)"))
        self.assertIsNone(cq.absent_argument("sum(absent(x))"))

    def test_set_ops(self):
        self.assertTrue(cq.has_top_level_set_op("a > 0 and b"))
        self.assertFalse(cq.has_top_level_set_op('sum(a and b) > 0'))
        self.assertFalse(cq.has_top_level_set_op('x{op="and"} > 0'))

    def test_grafana_formatting(self):
        self.assertEqual(cq.regex_escape("127.0.0.1:9721"), "127\\\\.0\\\\.0\\\\.1:9721")
        self.assertEqual(cq.format_multi(["a.b", "c"]), "(a\\\\.b|c)")
        self.assertEqual(cq.format_multi(["c"]), "c")

    def test_substitute(self):
        text, unknown = cq.substitute('x{a=~"$a", b="${b}", c="[[c]]"}[$__rate_interval] $nope', {"a": "1", "b": "2", "c": "3", "__rate_interval": "1m"})
        self.assertEqual(text, 'x{a=~"1", b="2", c="3"}[1m] $nope')
        self.assertEqual(unknown, ["nope"])
        # the longest name wins: $__range_s is not $__range followed by "_s"
        self.assertEqual(cq.substitute("$__range_s", {"__range": "5m", "__range_s": "300"})[0], "300")

    def test_rule_groups(self):
        rules = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "dashboards", "rules.yml")
        everything = cq.rule_entries(rules)
        single_host = cq.rule_entries(rules, r"qpwatch\.(rules|alerts)")
        mesh = cq.rule_entries(rules, r"qpwatch\.mesh\..*")
        self.assertIn(("alert", "QpwatchMeshPathLoss"), mesh)
        self.assertNotIn(("alert", "QpwatchMeshPathLoss"), single_host)
        self.assertIn(("alert", "QpwatchAgentDown"), single_host)
        self.assertEqual(sorted(single_host + mesh), everything)


if __name__ == "__main__":
    unittest.main()
