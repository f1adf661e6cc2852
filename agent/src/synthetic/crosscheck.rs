//! The cross-check of the probes' own QP calls: each verb call a probe timed
//! in userspace should have its kernel call, seen by the eBPF path, inside
//! its time span.
//!
//! The pipeline records this process's kernel QP calls into an [`OwnCallLog`]
//! (through [`OwnCallSink`]); probe threads wait on the same log, never on the
//! pipeline, until every userspace call has its kernel counterpart or a
//! grace period has passed.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Condvar, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use rdma_probe::QpCallKind;

use crate::{
    kernel::rdma::QpState,
    model::events::{Call, QpCall},
    model::pipeline::OwnCallSink,
};

/// A kernel QP call of this process, kept for the cross-check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCall {
    pub kind: QpCallKind,
    pub to: Option<QpState>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub rc: i32,
}

/// A QP: (device, qp_num).
pub type QpKey = (String, u32);

/// The kernel's record of the QP calls made by this process (the probes and
/// the responder), by QP; oldest QPs dropped beyond a bound.
#[derive(Debug, Default)]
pub struct OwnCalls {
    calls: HashMap<QpKey, Vec<KernelCall>>,
    order: VecDeque<QpKey>,
}

impl OwnCalls {
    const MAX_QPS: usize = 4096;

    pub fn record(&mut self, call: &QpCall) {
        let (kind, to) = match call.call {
            Call::Create { .. } => (QpCallKind::Create, None),
            Call::Modify { to: Some(to), .. } => (QpCallKind::Modify, Some(to)),
            Call::Modify { to: None, .. } => return,
            Call::Destroy => (QpCallKind::Destroy, None),
            // not calls of the QP's owner: the device's, in whatever task
            // the driver runs them
            Call::AsyncEvent { .. } | Call::CompletionError { .. } | Call::DeviceError => return,
        };
        let key = (call.device().to_owned(), call.qp_num);
        let entry = self.calls.entry(key.clone()).or_insert_with(|| {
            self.order.push_back(key);
            Vec::new()
        });
        entry.push(KernelCall {
            kind,
            to,
            start_ns: call.start_ns,
            end_ns: call.end_ns,
            rc: call.rc,
        });
        while self.order.len() > Self::MAX_QPS {
            if let Some(old) = self.order.pop_front() {
                self.calls.remove(&old);
            }
        }
    }

    fn get(&self, key: &QpKey) -> &[KernelCall] {
        self.calls.get(key).map_or(&[], Vec::as_slice)
    }

    fn take(&mut self, key: &QpKey) -> Vec<KernelCall> {
        self.order.retain(|k| k != key);
        self.calls.remove(key).unwrap_or_default()
    }

    /// Drops the first `n` recorded calls of a QP that lives on.
    fn consume(&mut self, key: &QpKey, n: usize) {
        if let Some(calls) = self.calls.get_mut(key) {
            calls.drain(..n.min(calls.len()));
        }
    }
}

/// [`OwnCalls`] shared between the pipeline, which records, and the probe
/// threads, which wait for the calls of their QPs. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct OwnCallLog {
    shared: Arc<(Mutex<OwnCalls>, Condvar)>,
}

impl OwnCallLog {
    fn lock(&self) -> MutexGuard<'_, OwnCalls> {
        self.shared.0.lock().expect("not poisoned")
    }

    pub fn record(&self, call: &QpCall) {
        self.lock().record(call);
        self.shared.1.notify_all();
    }

    /// Cross-checks one QP's successful userspace calls against the kernel
    /// calls recorded for it, waiting up to `grace` for kernel calls still
    /// on their way through the ring buffer. Then forgets the QP if it was
    /// destroyed, else the kernel calls that were matched (a persistent
    /// probe's QP lives on; its later calls are checked later).
    pub fn check(&self, key: &QpKey, user: &[rdma_probe::QpCall], grace: Duration) -> CrossCheck {
        let deadline = Instant::now() + grace;
        let mut calls = self.lock();
        let checked = loop {
            let checked = cross_check(user, calls.get(key));
            let now = Instant::now();
            if checked.missing.is_empty() || now >= deadline {
                break checked;
            }
            calls = self
                .shared
                .1
                .wait_timeout(calls, deadline - now)
                .expect("not poisoned")
                .0;
        };
        if user.iter().any(|c| c.kind == QpCallKind::Destroy) {
            calls.take(key);
        } else {
            calls.consume(key, checked.skews.len());
        }
        checked
    }
}

impl OwnCallSink for OwnCallLog {
    fn own_call(&self, call: &QpCall) {
        self.record(call);
    }
}

/// Slack for reading CLOCK_MONOTONIC in userspace and bpf_ktime_get_ns() in
/// the kernel: the same clock, read through different accessors.
const CLOCK_SLACK_NS: u64 = 50_000;

#[derive(Debug, Default, PartialEq)]
pub struct CrossCheck {
    /// (call, userspace duration − kernel duration in seconds) per matched call.
    pub skews: Vec<(&'static str, f64)>,
    /// Userspace calls with no kernel call inside their time span.
    pub missing: Vec<String>,
}

/// Matches each userspace verb call to the kernel call of the same kind (and
/// target state) that ran inside it.
pub fn cross_check(user: &[rdma_probe::QpCall], kernel: &[KernelCall]) -> CrossCheck {
    let mut result = CrossCheck::default();
    let mut used = vec![false; kernel.len()];
    for call in user {
        let to = call.target_state;
        let user_end = call.start_ns + call.duration.as_nanos() as u64;
        let found = kernel.iter().enumerate().find(|(i, k)| {
            !used[*i]
                && k.kind == call.kind
                && k.to == to
                && k.start_ns + CLOCK_SLACK_NS >= call.start_ns
                && k.end_ns <= user_end + CLOCK_SLACK_NS
        });
        match found {
            Some((i, k)) => {
                used[i] = true;
                let user_s = call.duration.as_secs_f64();
                let kernel_s =
                    Duration::from_nanos(k.end_ns.saturating_sub(k.start_ns)).as_secs_f64();
                result.skews.push((call.kind.as_str(), user_s - kernel_s));
            }
            None => result.missing.push(match to {
                Some(state) => format!("{} to {state}", call.kind.as_str()),
                None => call.kind.as_str().to_owned(),
            }),
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(kind: QpCallKind, to: Option<QpState>, start: u64, dur: u64) -> rdma_probe::QpCall {
        rdma_probe::QpCall {
            kind,
            target_state: to,
            start_ns: start,
            duration: Duration::from_nanos(dur),
            rc: 0,
        }
    }

    fn kernel(kind: QpCallKind, to: Option<QpState>, start: u64, end: u64) -> KernelCall {
        KernelCall {
            kind,
            to,
            start_ns: start,
            end_ns: end,
            rc: 0,
        }
    }

    #[test]
    fn matches_each_call_inside_its_userspace_span() {
        let u = vec![
            user(QpCallKind::Create, None, 1_000_000, 100_000),
            user(QpCallKind::Modify, Some(QpState::Init), 2_000_000, 20_000),
            user(QpCallKind::Modify, Some(QpState::Rtr), 3_000_000, 30_000),
            user(QpCallKind::Destroy, None, 9_000_000, 50_000),
        ];
        let k = vec![
            kernel(QpCallKind::Create, None, 1_010_000, 1_090_000),
            kernel(
                QpCallKind::Modify,
                Some(QpState::Init),
                2_005_000,
                2_015_000,
            ),
            kernel(QpCallKind::Modify, Some(QpState::Rtr), 3_002_000, 3_025_000),
            kernel(QpCallKind::Destroy, None, 9_001_000, 9_040_000),
        ];
        let c = cross_check(&u, &k);
        assert!(c.missing.is_empty(), "{c:?}");
        assert_eq!(c.skews.len(), 4);
        assert!(
            (c.skews[0].1 - 20e-6).abs() < 1e-9,
            "create: 100 µs − 80 µs"
        );
        assert_eq!(c.skews[0].0, "create");
    }

    #[test]
    fn reports_what_the_kernel_side_missed() {
        let u = vec![
            user(QpCallKind::Create, None, 1_000_000, 100_000),
            user(QpCallKind::Modify, Some(QpState::Rts), 5_000_000, 10_000),
        ];
        // an RTS transition outside the call's span does not count
        let k = vec![
            kernel(QpCallKind::Create, None, 1_010_000, 1_090_000),
            kernel(QpCallKind::Modify, Some(QpState::Rts), 7_000_000, 7_001_000),
        ];
        let c = cross_check(&u, &k);
        assert_eq!(c.missing, vec!["modify to RTS".to_owned()]);
    }

    #[test]
    fn own_calls_are_bounded() {
        let mut own = OwnCalls::default();
        for qp in 0..(OwnCalls::MAX_QPS as u32 + 10) {
            own.record(&QpCall::synthetic(Call::Destroy, "rxe0", qp, 1, 2));
        }
        assert_eq!(own.calls.len(), OwnCalls::MAX_QPS);
        assert!(own.get(&("rxe0".into(), 0)).is_empty());
        assert_eq!(
            own.get(&("rxe0".into(), OwnCalls::MAX_QPS as u32 + 9))
                .len(),
            1
        );
    }

    fn modify(to: QpState, start: u64, end: u64) -> QpCall {
        let call = Call::Modify {
            to: Some(to),
            attr_mask: qpwatch_common::IB_QP_STATE_MASK,
            invalid_state: false,
        };
        QpCall::synthetic(call, "rxe0", 7, start, end)
    }

    #[test]
    fn check_waits_for_calls_recorded_later() {
        let log = OwnCallLog::default();
        let key = ("rxe0".to_owned(), 7);
        let u = vec![user(QpCallKind::Modify, Some(QpState::Rtr), 1_000, 10_000)];
        let recorder = log.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            recorder.record(&modify(QpState::Rtr, 2_000, 9_000));
        });
        let c = log.check(&key, &u, Duration::from_secs(30));
        late.join().unwrap();
        assert!(c.missing.is_empty(), "{c:?}");
        assert_eq!(c.skews.len(), 1);
        // matched calls of a QP that lives on are consumed
        assert!(log.lock().get(&key).is_empty());
    }

    #[test]
    fn check_gives_up_after_the_grace_period() {
        let log = OwnCallLog::default();
        let key = ("rxe0".to_owned(), 7);
        log.record(&modify(QpState::Init, 500, 600));
        let u = vec![
            user(QpCallKind::Modify, Some(QpState::Rtr), 1_000, 10_000),
            user(QpCallKind::Destroy, None, 20_000, 10_000),
        ];
        let c = log.check(&key, &u, Duration::from_millis(20));
        assert_eq!(c.missing, vec!["modify to RTR", "destroy"]);
        // a destroyed QP is forgotten
        assert!(log.lock().calls.is_empty());
    }
}
