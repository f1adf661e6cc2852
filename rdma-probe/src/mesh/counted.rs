//! `qpwatch probe --ud`: a mesh with one target, a fixed number of probes,
//! and an ib_send_lat-like summary.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::Error;
use crate::outcome::QpCall;
use crate::stats::{micros, write_rtt_header, write_rtt_row, LatencySummary};

use super::{Answer, Dropped, Mesh, MeshConfig, MeshSink, MeshTarget};

/// One target probed `count` times.
#[derive(Debug, Clone)]
pub struct CountedProbe {
    pub target: SocketAddr,
    /// Local address to probe from; `None`: routing decides.
    pub source: Option<std::net::IpAddr>,
    pub count: u64,
    pub interval: Duration,
    pub config: MeshConfig,
}

/// What a counted UD probe run measured.
#[derive(Debug, Clone, Serialize)]
pub struct CountedSummary {
    pub target: SocketAddr,
    pub message_size: usize,
    pub device: Option<String>,
    pub qp_num: Option<u32>,
    pub remote_qp_num: Option<u32>,
    /// UD QPs the mesh created (one per device in use).
    pub qps_created: usize,
    pub sent: u64,
    pub answered: u64,
    pub lost: u64,
    pub send_failed: u64,
    pub dropped: BTreeMap<&'static str, u64>,
    pub rtt: Option<LatencySummary>,
    /// Time the probes spent in the responder.
    pub responder_delay: Option<LatencySummary>,
    /// Why the target could not be resolved (the run ends at the first failure).
    pub error: Option<String>,
}

impl CountedSummary {
    pub fn all_ok(&self, count: u64) -> bool {
        self.error.is_none() && self.answered == count && self.lost == 0 && self.send_failed == 0
    }

    pub fn render_table(&self) -> String {
        let rule = "-".repeat(96);
        let mut s = String::new();
        let _ = writeln!(s, "{rule}");
        let _ = writeln!(
            s,
            " UD probe mesh to {}  device {}  QP {}  remote QP {}",
            self.target,
            self.device.as_deref().unwrap_or("-"),
            self.qp_num.map_or("-".into(), |q| format!("{q:#x}")),
            self.remote_qp_num.map_or("-".into(), |q| format!("{q:#x}")),
        );
        let _ = writeln!(
            s,
            " sent {}  answered {}  lost {}  send_failed {}",
            self.sent, self.answered, self.lost, self.send_failed
        );
        let _ = writeln!(s, "{rule}");
        write_rtt_header(&mut s);
        if let Some(r) = &self.rtt {
            write_rtt_row(&mut s, self.message_size, r);
        }
        if let Some(d) = &self.responder_delay {
            let _ = writeln!(
                s,
                " responder delay [usec]: p50 {}  p99 {}  max {}",
                micros(d.p50),
                micros(d.p99),
                micros(d.max)
            );
        }
        if let Some(e) = &self.error {
            let _ = writeln!(s, " error: {e}");
        }
        let _ = writeln!(s, "{rule}");
        s
    }
}

#[derive(Default)]
struct Record {
    device: Option<String>,
    qp_num: Option<u32>,
    remote_qp_num: Option<u32>,
    qps_created: usize,
    sent: u64,
    lost: u64,
    send_failed: u64,
    rtts: Vec<Duration>,
    delays: Vec<Duration>,
    dropped: BTreeMap<&'static str, u64>,
    error: Option<String>,
}

#[derive(Default)]
struct Recorder {
    record: Mutex<Record>,
    changed: Condvar,
}

impl Recorder {
    fn update(&self, f: impl FnOnce(&mut Record)) {
        if let Ok(mut r) = self.record.lock() {
            f(&mut r);
        }
        self.changed.notify_all();
    }

    fn lock(&self) -> Result<MutexGuard<'_, Record>, Error> {
        self.record.lock().map_err(poisoned)
    }

    /// Waits until `count` probes are answered, lost or failed to send, the
    /// target failed to resolve, `give_up` has passed or `finished()` says
    /// the mesh thread ended. Returns with the record unlocked: the mesh
    /// thread goes on reporting (a late answer, a loss) until it is stopped,
    /// and stopping it joins it.
    fn wait_done(
        &self,
        count: u64,
        give_up: Instant,
        finished: impl Fn() -> bool,
    ) -> Result<(), Error> {
        let mut record = self.lock()?;
        loop {
            let done = record.rtts.len() as u64 + record.lost + record.send_failed;
            let now = Instant::now();
            if done >= count || record.error.is_some() || now >= give_up || finished() {
                return Ok(());
            }
            record = self
                .changed
                .wait_timeout(record, (give_up - now).min(Duration::from_millis(200)))
                .map_err(poisoned)?
                .0;
        }
    }

    /// The record so far, taken out.
    fn take(&self) -> Result<Record, Error> {
        Ok(std::mem::take(&mut *self.lock()?))
    }
}

impl MeshSink for Recorder {
    fn qp_created(&self, device: &str, qp_num: u32, _calls: &[QpCall]) {
        self.update(|r| {
            r.qps_created += 1;
            r.qp_num = Some(qp_num);
            r.device = Some(device.to_string());
        });
    }
    fn resolved(&self, _target: &Arc<str>, device: &str, remote_qp_num: u32) {
        self.update(|r| {
            r.device = Some(device.to_string());
            r.remote_qp_num = Some(remote_qp_num);
        });
    }
    fn resolve_failed(&self, target: &Arc<str>, error: &Error) {
        self.update(|r| {
            r.error
                .get_or_insert_with(|| format!("resolving {target} failed: {error}"));
        });
    }
    fn sent(&self, _target: &Arc<str>) {
        self.update(|r| r.sent += 1);
    }
    fn send_failed(&self, _target: &Arc<str>, _error: &Error) {
        self.update(|r| r.send_failed += 1);
    }
    fn answered(&self, _target: &Arc<str>, answer: &Answer) {
        self.update(|r| {
            r.rtts.push(answer.rtt());
            r.delays.push(answer.responder_delay());
        });
    }
    fn lost(&self, _target: &Arc<str>, _seq: u64) {
        self.update(|r| r.lost += 1);
    }
    fn responded(&self, _device: &str) {}
    fn dropped(&self, reason: Dropped) {
        self.update(|r| *r.dropped.entry(reason.as_str()).or_default() += 1);
    }
}

/// Probes `probe.target` `probe.count` times (no listener); stops at the
/// first resolution failure.
pub fn probe_counted(probe: &CountedProbe) -> Result<CountedSummary, Error> {
    let recorder = Arc::new(Recorder::default());
    let mesh = Mesh::spawn_limited(probe.config.clone(), recorder.clone(), probe.count)?;
    mesh.set_targets(vec![MeshTarget {
        key: probe.target.to_string().into(),
        address: probe.target,
        source: probe.source,
        interval: probe.interval,
    }]);
    let budget = probe.config.resolve_timeout
        + probe.interval * u32::try_from(probe.count).unwrap_or(u32::MAX)
        + probe.config.timeout
        + Duration::from_secs(5);
    recorder.wait_done(probe.count, Instant::now() + budget, || mesh.is_finished())?;
    mesh.stop()?;
    let record = recorder.take()?;
    Ok(CountedSummary {
        target: probe.target,
        message_size: probe.config.message_size,
        device: record.device,
        qp_num: record.qp_num,
        remote_qp_num: record.remote_qp_num,
        qps_created: record.qps_created,
        sent: record.sent,
        answered: record.rtts.len() as u64,
        lost: record.lost,
        send_failed: record.send_failed,
        dropped: record.dropped,
        rtt: LatencySummary::from_samples(&record.rtts),
        responder_delay: LatencySummary::from_samples(&record.delays),
        error: record.error,
    })
}

/// A thread panicked while it held the record.
fn poisoned<T>(_: T) -> Error {
    Error::InvalidConfig("probe recorder poisoned".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::thread;

    /// The mesh thread reports until it is stopped (late answers, losses
    /// after the last probe is done), and stopping it joins it: a record
    /// still locked then is a deadlock (`qpwatch probe --ud` hung in a CI
    /// run of responder_guard, a stranger's burst of 150 probes).
    #[test]
    fn the_mesh_is_stopped_with_the_record_unlocked() {
        let recorder = Arc::new(Recorder::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mesh_thread = {
            let (recorder, stop) = (recorder.clone(), stop.clone());
            thread::spawn(move || {
                let target: Arc<str> = "198.18.0.1:9723".into();
                while !stop.load(Ordering::Acquire) {
                    recorder.lost(&target, 0);
                }
            })
        };
        let (lost_tx, lost_rx) = mpsc::channel();
        thread::spawn(move || {
            let give_up = Instant::now() + Duration::from_secs(30);
            recorder.wait_done(3, give_up, || false).unwrap();
            stop.store(true, Ordering::Release);
            mesh_thread.join().unwrap();
            lost_tx.send(recorder.take().unwrap().lost).unwrap();
        });
        let lost = lost_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("stopping the mesh thread did not return");
        assert!(lost >= 3, "lost {lost}");
    }
}
