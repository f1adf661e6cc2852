//! The probe loop: probes one after another, each a one-shot connection or a
//! round on one persistent connection, paced and ended by a [`ProbeDriver`].
//! The agent's probe threads and both command lines run it.

use std::time::Duration;

use crate::outcome::{ProbeMode, ProbeOutcome};
use crate::requester::{probe_once, PersistentProbe, ProbeConfig};
use crate::summary::ProbeSummary;

/// What a run does around its probes: the agent counts and cross-checks each
/// outcome, the command lines collect them for a summary.
pub trait ProbeDriver {
    /// Waits before probe `index` (0 for the first); `false` ends the run.
    fn pause(&mut self, index: u64) -> bool;

    /// One probe's outcome.
    fn outcome(&mut self, outcome: ProbeOutcome);

    /// A persistent run that [`ProbeDriver::pause`] ended with its connection
    /// up: the disconnect and the QP's last calls, as an outcome of its own
    /// (not a probe).
    fn closed(&mut self, outcome: ProbeOutcome);
}

/// Runs `count` probes (`None`: until the driver's `pause` ends the run). A
/// persistent run that reaches `count` disconnects within its last probe,
/// whose outcome then carries the `disconnect` step and the QP's last calls.
pub fn run_probes(
    config: &ProbeConfig,
    mode: ProbeMode,
    count: Option<u64>,
    driver: &mut impl ProbeDriver,
) {
    let mut persistent = match mode {
        ProbeMode::Persistent => Some(PersistentProbe::new(config.clone())),
        ProbeMode::OneShot => None,
    };
    let mut index = 0;
    while count.is_none_or(|count| index < count) && driver.pause(index) {
        let mut outcome = match persistent.as_mut() {
            Some(probe) => probe.round(),
            None => probe_once(config),
        };
        index += 1;
        if count == Some(index) {
            if let Some(probe) = persistent.as_mut() {
                probe.close(&mut outcome);
            }
        }
        driver.outcome(outcome);
    }
    if let Some(last) = persistent.as_mut().and_then(PersistentProbe::shut) {
        driver.closed(last);
    }
}

/// `count` probes, `interval` apart, and their summary: the command lines'
/// run.
pub fn probe_summary(
    config: &ProbeConfig,
    mode: ProbeMode,
    count: u32,
    interval: Duration,
) -> ProbeSummary {
    let mut collect = Collect {
        interval,
        outcomes: Vec::with_capacity(count as usize),
    };
    run_probes(config, mode, Some(count.into()), &mut collect);
    ProbeSummary::from_outcomes(config.target, mode, config.message_size, collect.outcomes)
}

struct Collect {
    interval: Duration,
    outcomes: Vec<ProbeOutcome>,
}

impl ProbeDriver for Collect {
    fn pause(&mut self, index: u64) -> bool {
        if index > 0 {
            std::thread::sleep(self.interval);
        }
        true
    }

    fn outcome(&mut self, outcome: ProbeOutcome) {
        self.outcomes.push(outcome);
    }

    /// Not reached: a counted run its driver never stops disconnects within
    /// its last probe.
    fn closed(&mut self, _: ProbeOutcome) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::ProbeResult;
    use crate::step::Step;

    /// Probes that fail before touching RDMA (an invalid message size).
    fn invalid_config() -> ProbeConfig {
        let mut config = ProbeConfig::new("198.18.0.1:9723".parse().unwrap());
        config.message_size = 1;
        config
    }

    #[derive(Default)]
    struct Record {
        pauses: Vec<u64>,
        stop_at: Option<u64>,
        outcomes: Vec<ProbeOutcome>,
        closed: usize,
    }

    impl ProbeDriver for Record {
        fn pause(&mut self, index: u64) -> bool {
            self.pauses.push(index);
            self.stop_at != Some(index)
        }

        fn outcome(&mut self, outcome: ProbeOutcome) {
            self.outcomes.push(outcome);
        }

        fn closed(&mut self, _: ProbeOutcome) {
            self.closed += 1;
        }
    }

    #[test]
    fn runs_until_the_count_or_the_driver_stops() {
        for mode in [ProbeMode::OneShot, ProbeMode::Persistent] {
            let mut counted = Record::default();
            run_probes(&invalid_config(), mode, Some(3), &mut counted);
            assert_eq!(counted.pauses, vec![0, 1, 2]);
            assert_eq!(counted.outcomes.len(), 3);
            assert!(counted.outcomes.iter().all(|o| o.mode == mode
                && o.result == ProbeResult::Error
                && o.failed_step == Some(Step::AddrResolve)));

            let mut stopped = Record {
                stop_at: Some(2),
                ..Record::default()
            };
            run_probes(&invalid_config(), mode, None, &mut stopped);
            assert_eq!(stopped.pauses, vec![0, 1, 2]);
            assert_eq!(stopped.outcomes.len(), 2);
            // never connected: nothing to close
            assert_eq!(stopped.closed, 0);
        }
    }

    #[test]
    fn summary_of_a_counted_run() {
        let summary = probe_summary(&invalid_config(), ProbeMode::OneShot, 2, Duration::ZERO);
        assert_eq!(summary.probes, 2);
        assert_eq!(summary.results[&ProbeResult::Error], 2);
        assert!(!summary.all_ok());
    }
}
