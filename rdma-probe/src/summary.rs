//! Statistics over a run of probes, and the `ib_send_lat`-style table.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::outcome::{ProbeMode, ProbeOutcome, ProbeResult};
use crate::stats::{micros, write_rtt_header, write_rtt_row, LatencySummary};
use crate::step::Step;

/// Summary of a run of probes against one target.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeSummary {
    pub target: SocketAddr,
    pub mode: ProbeMode,
    pub message_size: usize,
    pub probes: usize,
    /// Count of each result (all results present, zeros included).
    pub results: BTreeMap<ProbeResult, usize>,
    /// Over every ping of every probe.
    pub rtt: Option<LatencySummary>,
    /// Total setup time of the probes that set up a connection.
    pub setup: Option<LatencySummary>,
    /// Per step, over the probes that completed it.
    pub steps: BTreeMap<Step, LatencySummary>,
    pub devices: Vec<String>,
    pub qp_nums: Vec<u32>,
    pub outcomes: Vec<ProbeOutcome>,
}

impl ProbeSummary {
    pub fn from_outcomes(
        target: SocketAddr,
        mode: ProbeMode,
        message_size: usize,
        outcomes: Vec<ProbeOutcome>,
    ) -> ProbeSummary {
        let mut results: BTreeMap<ProbeResult, usize> =
            ProbeResult::ALL.iter().map(|r| (*r, 0)).collect();
        let mut rtts = Vec::new();
        let mut setups = Vec::new();
        let mut per_step: BTreeMap<Step, Vec<Duration>> = BTreeMap::new();
        let mut devices = Vec::new();
        let mut qp_nums = Vec::new();
        for o in &outcomes {
            *results.entry(o.result).or_default() += 1;
            rtts.extend_from_slice(&o.rtts);
            setups.extend(o.setup);
            for (step, d) in &o.steps {
                per_step.entry(*step).or_default().push(*d);
            }
            if let Some(dev) = &o.device {
                if !devices.contains(dev) {
                    devices.push(dev.clone());
                }
            }
            for qp in o.qp_calls.keys().copied().chain(o.qp_num) {
                if !qp_nums.contains(&qp) {
                    qp_nums.push(qp);
                }
            }
        }
        ProbeSummary {
            target,
            mode,
            message_size,
            probes: outcomes.len(),
            results,
            rtt: LatencySummary::from_samples(&rtts),
            setup: LatencySummary::from_samples(&setups),
            steps: per_step
                .into_iter()
                .filter_map(|(step, v)| Some((step, LatencySummary::from_samples(&v)?)))
                .collect(),
            devices,
            qp_nums,
            outcomes,
        }
    }

    pub fn ok_count(&self) -> usize {
        self.results.get(&ProbeResult::Ok).copied().unwrap_or(0)
    }

    pub fn all_ok(&self) -> bool {
        self.ok_count() == self.probes
    }

    /// Human-readable table, in the spirit of perftest's `ib_send_lat`.
    pub fn render_table(&self) -> String {
        let rule = "-".repeat(96);
        let mut s = String::new();
        let mode = match self.mode {
            ProbeMode::OneShot => "one-shot",
            ProbeMode::Persistent => "persistent",
        };
        let _ = writeln!(s, "{rule}");
        let _ = writeln!(
            s,
            " rdma-probe {mode} to {}  device {}  {} probes",
            self.target,
            if self.devices.is_empty() {
                "-".to_string()
            } else {
                self.devices.join(",")
            },
            self.probes
        );
        let counts: Vec<String> = self
            .results
            .iter()
            .filter(|(r, n)| **n > 0 || **r == ProbeResult::Ok)
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        let _ = writeln!(s, " results: {}", counts.join("  "));
        let _ = writeln!(s, "{rule}");
        write_rtt_header(&mut s);
        match &self.rtt {
            Some(r) => write_rtt_row(&mut s, self.message_size, r),
            None => {
                let _ = writeln!(s, " {:<8} {:<12} (no completed ping)", self.message_size, 0);
            }
        }
        let _ = writeln!(s, "{rule}");
        let _ = writeln!(
            s,
            " {:<21} {:>12} {:>12} {:>12} {:>12} {:>12}",
            "step", "#samples", "min[usec]", "p50[usec]", "max[usec]", "avg[usec]"
        );
        let row = |s: &mut String, name: &str, l: &LatencySummary| {
            let _ = writeln!(
                s,
                " {:<21} {:>12} {:>12} {:>12} {:>12} {:>12}",
                name,
                l.count,
                micros(l.min),
                micros(l.p50),
                micros(l.max),
                micros(l.mean)
            );
        };
        for (step, l) in &self.steps {
            row(&mut s, step.as_str(), l);
        }
        if let Some(l) = &self.setup {
            row(&mut s, "setup (total)", l);
        }
        let _ = writeln!(s, "{rule}");
        if !self.qp_nums.is_empty() {
            let qps: Vec<String> = self.qp_nums.iter().map(|q| format!("{q:#x}")).collect();
            let _ = writeln!(s, " QPs: {}", qps.join(" "));
        }
        for (i, o) in self.outcomes.iter().enumerate().filter(|(_, o)| !o.is_ok()) {
            let _ = writeln!(
                s,
                " probe {i}: {} at {}: {}",
                o.result,
                o.failed_step.map_or("-", Step::as_str),
                o.error.as_deref().unwrap_or("")
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{QpCall, QpCallKind};

    fn outcome(rtts_us: &[u64], result: ProbeResult, qp: u32) -> ProbeOutcome {
        let mut o = ProbeOutcome::new("198.18.0.1:9723".parse().unwrap(), ProbeMode::OneShot, 0);
        o.result = result;
        o.rtts = rtts_us.iter().map(|&u| Duration::from_micros(u)).collect();
        o.device = Some("rxe0".into());
        o.qp_num = Some(qp);
        o.qp_calls.insert(
            qp,
            vec![QpCall {
                kind: QpCallKind::Create,
                target_state: None,
                start_ns: 1,
                duration: Duration::from_micros(3),
                rc: 0,
            }],
        );
        if result == ProbeResult::Ok {
            o.steps
                .insert(Step::Connect, Duration::from_micros(100 * qp as u64));
            o.setup = Some(Duration::from_micros(1000));
        } else {
            o.failed_step = Some(Step::Connect);
            o.error = Some("Connect: expected X, got Y".into());
        }
        o
    }

    #[test]
    fn summarizes_outcomes() {
        let outcomes = vec![
            outcome(&[10, 20], ProbeResult::Ok, 17),
            outcome(&[30], ProbeResult::Ok, 18),
            outcome(&[], ProbeResult::Rejected, 19),
        ];
        let s = ProbeSummary::from_outcomes(
            "198.18.0.1:9723".parse().unwrap(),
            ProbeMode::OneShot,
            64,
            outcomes,
        );
        assert_eq!(s.probes, 3);
        assert_eq!(s.ok_count(), 2);
        assert!(!s.all_ok());
        assert_eq!(s.results[&ProbeResult::Rejected], 1);
        assert_eq!(s.results[&ProbeResult::Timeout], 0);
        assert_eq!(s.results.len(), ProbeResult::ALL.len());
        let rtt = s.rtt.unwrap();
        assert_eq!(
            (rtt.count, rtt.p50, rtt.max),
            (3, Duration::from_micros(20), Duration::from_micros(30))
        );
        assert_eq!(s.steps[&Step::Connect].count, 2);
        assert_eq!(s.setup.unwrap().count, 2);
        assert_eq!(s.devices, vec!["rxe0".to_string()]);
        assert_eq!(s.qp_nums, vec![17, 18, 19]);
        let table = s.render_table();
        assert!(table.contains("t_p50[usec]"), "{table}");
        assert!(table.contains(" 64       3"), "{table}");
        assert!(table.contains("QPs: 0x11 0x12 0x13"), "{table}");
        assert!(table.contains("probe 2: rejected at connect"), "{table}");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["results"]["ok"], 2);
        assert_eq!(json["rtt"]["p50_ns"], 20_000);
        assert_eq!(json["steps"]["connect"]["count"], 2);
    }
}
