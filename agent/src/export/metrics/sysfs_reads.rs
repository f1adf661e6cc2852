//! How the agent reads the kernel's counters from sysfs: on a timer of its
//! own, not at each scrape (see [`super::sysfs::Refresher`]), so what a
//! scrape shows is as old as the last read.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::export::registry::{Counter, Gauge, IntCounter};

use super::Registrar;

#[derive(Clone)]
pub struct SysfsReadMetrics {
    reads: IntCounter,
    read_seconds: Counter,
    last_read: Gauge,
}

impl SysfsReadMetrics {
    pub fn new(r: &mut Registrar) -> Self {
        Self {
            reads: r.counter(
                "qpwatch_sysfs_reads_total",
                "Reads of every sysfs counter file that the ib_cm, port and hw_stats families export (one every sysfs_counters.interval_seconds).",
            ),
            read_seconds: r.float_counter(
                "qpwatch_sysfs_read_seconds_total",
                "Wall-clock time spent in those reads.",
            ),
            last_read: r.float_gauge(
                "qpwatch_sysfs_last_read_timestamp_seconds",
                "When the last of those reads began (Unix time): the values exported are at least that recent.",
            ),
        }
    }

    /// A read that began at `started` and took `took`.
    pub fn read(&self, started: SystemTime, took: Duration) {
        self.reads.inc();
        self.read_seconds.inc_by(took.as_secs_f64());
        let since_epoch = started.duration_since(UNIX_EPOCH).unwrap_or_default();
        self.last_read.set(since_epoch.as_secs_f64());
    }
}
