//! The IB CM's own message counters, per device port: ib_cm keeps them for
//! every connection it handles, rdma_cm's and any other consumer's, in
//! `/sys/class/infiniband/DEV/ports/PORT/cm_{tx_msgs,tx_retries,rx_msgs,rx_duplicates}/MESSAGE`
//! (drivers/infiniband/core/cm.c, `cm_counter_groups`). Read at each scrape:
//! nothing is attached to ib_cm, so it stays free to unload, and a device
//! that goes away takes its series with it.
//!
//! The daemon registers it with [`super::Metrics::register_sysfs_counters`].

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Weak},
};

use crate::export::{
    exposition::Kind,
    registry::{Collector, Desc},
};

use super::sysfs::{counter_samples, entries, sanitize, CounterFiles, Refresh};

pub const SYSFS_DIR: &str = "/sys/class/infiniband";

const MESSAGES: &str = "qpwatch_ib_cm_messages_total";
const MESSAGES_HELP: &str =
    "IB CM messages sent and received on a device port (ib_cm's counters), by message type.";
const REPEATED: &str = "qpwatch_ib_cm_messages_repeated_total";
const REPEATED_HELP: &str = "IB CM messages sent again after a timeout (direction=\"sent\") and duplicates received (direction=\"received\"), by message type.";

/// The labels of both families.
const LABELS: [&str; 4] = ["device", "port", "direction", "message"];

/// The counter groups: directory, metric, direction.
const GROUPS: [(&str, &str, &str); 4] = [
    ("cm_tx_msgs", MESSAGES, "sent"),
    ("cm_rx_msgs", MESSAGES, "received"),
    ("cm_tx_retries", REPEATED, "sent"),
    ("cm_rx_duplicates", REPEATED, "received"),
];

/// One counter read from sysfs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reading {
    pub metric: &'static str,
    pub device: String,
    pub port: String,
    pub direction: &'static str,
    pub message: String,
    pub value: u64,
}

/// Reads every device port's counters under `dir`. Of the devices that have
/// them (not those without ib_cm's counters: ib_cm not loaded, or no IB CM on
/// the device), those beyond the first `max_devices` in name order are
/// summed as `device="other"`.
pub fn read(dir: &Path, max_devices: usize) -> Vec<Reading> {
    let files = counter_files(dir, max_devices);
    files.refresh();
    readings(&files)
}

/// (metric, port, direction, message)
type Key = (&'static str, String, &'static str, String);

fn counter_files(dir: &Path, max_devices: usize) -> CounterFiles<Key> {
    CounterFiles::new(dir, max_devices, device_counters, watched)
}

fn readings(files: &CounterFiles<Key>) -> Vec<Reading> {
    files
        .values()
        .into_iter()
        .map(
            |(device, (metric, port, direction, message), value)| Reading {
                metric,
                device,
                port,
                direction,
                message,
                value,
            },
        )
        .collect()
}

/// The directories whose listing changes when the device's counters do
/// (ib_cm adds its groups to every port when it loads).
fn watched(device: &Path) -> Vec<PathBuf> {
    let ports = device.join("ports");
    let mut dirs = vec![ports.clone()];
    for port in entries(&ports) {
        dirs.extend(GROUPS.map(|(group, _, _)| ports.join(&port).join(group)));
    }
    dirs
}

/// Every counter file of one device, with its key.
fn device_counters(device: &Path) -> Vec<(Key, PathBuf)> {
    let ports = device.join("ports");
    let mut counters = Vec::new();
    for port in entries(&ports) {
        for (group, metric, direction) in GROUPS {
            let group_dir = ports.join(&port).join(group);
            for message in entries(&group_dir) {
                counters.push((
                    (metric, port.clone(), direction, sanitize(&message)),
                    group_dir.join(&message),
                ));
            }
        }
    }
    counters
}

/// A collector of the values the counter files held when last read (see
/// [`super::sysfs::Refresher`]).
pub struct IbCmCounters {
    files: Arc<CounterFiles<Key>>,
    descs: [Desc; 2],
}

impl IbCmCounters {
    pub fn new(dir: impl Into<PathBuf>, max_devices: usize) -> Self {
        let desc = |name: &str, help: &str| {
            Desc::new(name, help, Kind::Counter, &LABELS).expect("valid metric")
        };
        Self {
            files: Arc::new(counter_files(&dir.into(), max_devices)),
            descs: [desc(MESSAGES, MESSAGES_HELP), desc(REPEATED, REPEATED_HELP)],
        }
    }
}

impl IbCmCounters {
    /// Its counter files, for the refresher to read.
    pub(super) fn source(&self) -> Weak<dyn Refresh> {
        let files: Arc<dyn Refresh> = self.files.clone();
        Arc::downgrade(&files)
    }
}

impl Collector for IbCmCounters {
    fn descs(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self, out: &mut [String]) {
        let readings = readings(&self.files);
        for (lines, name) in out.iter_mut().zip([MESSAGES, REPEATED]) {
            counter_samples(
                lines,
                name,
                readings.iter().filter(|r| r.metric == name).map(|r| {
                    (
                        vec![
                            ("device", r.device.clone()),
                            ("direction", r.direction.to_owned()),
                            ("message", r.message.clone()),
                            ("port", r.port.clone()),
                        ],
                        r.value,
                    )
                }),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::model::qp::OTHER;

    fn port(dir: &Path, device: &str, port: &str, group: &str, counters: &[(&str, u64)]) {
        let d = dir.join(device).join("ports").join(port).join(group);
        fs::create_dir_all(&d).unwrap();
        for (name, value) in counters {
            fs::write(d.join(name), format!("{value}\n")).unwrap();
        }
    }

    #[test]
    fn reads_every_group_of_every_port_and_caps_devices() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        port(d, "rxe0", "1", "cm_tx_msgs", &[("req", 3), ("rtu", 2)]);
        port(d, "rxe0", "1", "cm_rx_msgs", &[("rep", 2)]);
        port(d, "rxe0", "1", "cm_tx_retries", &[("req", 1)]);
        port(d, "rxe0", "1", "cm_rx_duplicates", &[("req", 4)]);
        port(d, "rxe1", "1", "cm_tx_msgs", &[("rtu", 5)]);
        port(d, "mlx5_1", "1", "cm_tx_msgs", &[("req", 10)]);
        port(d, "mlx5_2", "1", "cm_tx_msgs", &[("req", 20)]);
        // a device without ib_cm's counters has none
        fs::create_dir_all(d.join("hfi1_0/ports/1/hw_counters")).unwrap();
        let readings = read(d, 2);
        let find = |metric, device: &str, direction, message: &str| {
            readings
                .iter()
                .find(|r| {
                    r.metric == metric
                        && r.device == device
                        && r.direction == direction
                        && r.message == message
                })
                .map(|r| r.value)
        };
        // name order among devices with counters: mlx5_1, mlx5_2 keep their
        // names; rxe0 is "other"
        assert_eq!(find(MESSAGES, "mlx5_1", "sent", "req"), Some(10));
        assert_eq!(find(MESSAGES, "mlx5_2", "sent", "req"), Some(20));
        assert_eq!(find(MESSAGES, OTHER, "sent", "req"), Some(3));
        assert_eq!(find(MESSAGES, OTHER, "sent", "rtu"), Some(7));
        assert_eq!(find(MESSAGES, OTHER, "received", "rep"), Some(2));
        assert_eq!(find(REPEATED, OTHER, "sent", "req"), Some(1));
        assert_eq!(find(REPEATED, OTHER, "received", "req"), Some(4));
        assert!(readings.iter().all(|r| r.device != "hfi1_0"));
    }

    #[test]
    fn exported_through_a_registry() {
        let dir = tempfile::tempdir().unwrap();
        port(dir.path(), "rxe0", "1", "cm_tx_msgs", &[("req", 3)]);
        let registry = crate::export::registry::Registry::new();
        let collector = IbCmCounters::new(dir.path(), 64);
        let files = collector.source().upgrade().unwrap();
        registry.register(Box::new(collector)).unwrap();
        files.refresh();
        let text = crate::export::metrics::render(&registry);
        assert!(
            text.contains(
                "qpwatch_ib_cm_messages_total{device=\"rxe0\",direction=\"sent\",message=\"req\",port=\"1\"} 3"
            ),
            "{text}"
        );
        assert!(!text.contains(REPEATED), "no series, no family: {text}");
        // the device went away: so do its series
        fs::remove_dir_all(dir.path().join("rxe0")).unwrap();
        files.refresh();
        assert!(!crate::export::metrics::render(&registry).contains(MESSAGES));
    }
}
