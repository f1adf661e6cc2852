//! Every RDMA device's own counters, read from sysfs at each scrape:
//! - `DEV/ports/PORT/counters/*`: the IB port counters (PortCounters and
//!   PortCountersExtended; only devices that answer MADs have them),
//! - `DEV/ports/PORT/hw_counters/*` and `DEV/hw_counters/*`: the driver's
//!   statistics (drivers/infiniband/core/sysfs.c, `setup_hw_stats`), whatever
//!   the driver names them: soft-RoCE's `retry_exceeded_err`, mlx5's
//!   `local_ack_timeout_err` alike; nothing here is per driver.
//!
//! A device that goes away takes its series with it; one that appears is
//! read at the next scrape. Devices beyond `max_devices` (name order) are
//! summed as `device="other"`. Counter names come from the driver's fixed
//! table, so they are bounded without a cap of ours.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Weak},
};

use crate::export::{
    exposition::Kind,
    registry::{Collector, Desc},
};

use super::sysfs::{counter_samples, entries, sanitize, CounterFiles, Refresh};

pub const PORT_IB_STATS: &str = "qpwatch_port_ib_stats_total";
const PORT_IB_STATS_HELP: &str = "IB port counters of a device port (sysfs ports/PORT/counters), by counter; port_xmit_data and port_rcv_data count 4-octet words, as the kernel shows them.";
pub const PORT_HW_STATS: &str = "qpwatch_port_hw_stats_total";
const PORT_HW_STATS_HELP: &str =
    "The driver's statistics of a device port (sysfs ports/PORT/hw_counters), by counter.";
pub const DEVICE_HW_STATS: &str = "qpwatch_device_hw_stats_total";
const DEVICE_HW_STATS_HELP: &str =
    "The driver's device-wide statistics (sysfs hw_counters), by counter.";

/// The labels of the port families; the device-wide family has no `port`.
const LABELS: [&str; 3] = ["device", "port", "counter"];

/// Not a counter: how long (ms) the kernel keeps a read of `hw_counters`
/// before asking the driver again (drivers/infiniband/core/sysfs.c,
/// `hw_stat_device_lifespan`).
const LIFESPAN: &str = "lifespan";

/// One counter read from sysfs. `port` is `None` for device-wide counters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reading {
    pub metric: &'static str,
    pub device: String,
    pub port: Option<String>,
    pub counter: String,
    pub value: u64,
}

/// (metric, port, counter)
type Key = (&'static str, Option<String>, String);

/// Reads every device's counters under `dir` (normally
/// [`super::ib_cm::SYSFS_DIR`]).
pub fn read(dir: &Path, max_devices: usize) -> Vec<Reading> {
    let files = counter_files(dir, max_devices);
    files.refresh();
    readings(&files)
}

fn counter_files(dir: &Path, max_devices: usize) -> CounterFiles<Key> {
    CounterFiles::new(dir, max_devices, device_counters, watched)
}

fn readings(files: &CounterFiles<Key>) -> Vec<Reading> {
    files
        .values()
        .into_iter()
        .map(|(device, (metric, port, counter), value)| Reading {
            metric,
            device,
            port,
            counter,
            value,
        })
        .collect()
}

/// The directories whose listing changes when the device's counters do.
fn watched(device: &Path) -> Vec<PathBuf> {
    let ports = device.join("ports");
    let mut dirs = vec![device.join("hw_counters"), ports.clone()];
    for port in entries(&ports) {
        let port_dir = ports.join(port);
        dirs.push(port_dir.join("counters"));
        dirs.push(port_dir.join("hw_counters"));
    }
    dirs
}

/// Every counter file of one device, with its key.
fn device_counters(device: &Path) -> Vec<(Key, PathBuf)> {
    let mut counters = Vec::new();
    let mut group = |dir: &Path, metric: &'static str, port: Option<&String>| {
        for name in entries(dir) {
            if name != LIFESPAN {
                counters.push(((metric, port.cloned(), sanitize(&name)), dir.join(&name)));
            }
        }
    };
    group(&device.join("hw_counters"), DEVICE_HW_STATS, None);
    let ports = device.join("ports");
    for port in entries(&ports) {
        let port_dir = ports.join(&port);
        group(&port_dir.join("counters"), PORT_IB_STATS, Some(&port));
        group(&port_dir.join("hw_counters"), PORT_HW_STATS, Some(&port));
    }
    counters
}

/// A collector of the values the counter files held when last read (see
/// [`super::sysfs::Refresher`]).
pub struct DeviceCounters {
    files: Arc<CounterFiles<Key>>,
    descs: [Desc; 3],
}

const FAMILIES: [(&str, &str); 3] = [
    (PORT_IB_STATS, PORT_IB_STATS_HELP),
    (PORT_HW_STATS, PORT_HW_STATS_HELP),
    (DEVICE_HW_STATS, DEVICE_HW_STATS_HELP),
];

impl DeviceCounters {
    pub fn new(dir: impl Into<PathBuf>, max_devices: usize) -> Self {
        let desc = |(name, help): (&str, &str)| {
            let labels: Vec<&str> = LABELS
                .iter()
                .copied()
                .filter(|&l| l != "port" || name != DEVICE_HW_STATS)
                .collect();
            Desc::new(name, help, Kind::Counter, &labels).expect("valid metric")
        };
        Self {
            files: Arc::new(counter_files(&dir.into(), max_devices)),
            descs: FAMILIES.map(desc),
        }
    }
}

impl DeviceCounters {
    /// Its counter files, for the refresher to read.
    pub(super) fn source(&self) -> Weak<dyn Refresh> {
        let files: Arc<dyn Refresh> = self.files.clone();
        Arc::downgrade(&files)
    }
}

impl Collector for DeviceCounters {
    fn descs(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self, out: &mut [String]) {
        let readings = readings(&self.files);
        for (lines, (name, _)) in out.iter_mut().zip(FAMILIES) {
            counter_samples(
                lines,
                name,
                readings.iter().filter(|r| r.metric == name).map(|r| {
                    let mut labels =
                        vec![("counter", r.counter.clone()), ("device", r.device.clone())];
                    if let Some(port) = &r.port {
                        labels.push(("port", port.clone()));
                    }
                    (labels, r.value)
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

    fn counters(dir: &Path, counters: &[(&str, &str)]) {
        fs::create_dir_all(dir).unwrap();
        for (name, value) in counters {
            fs::write(dir.join(name), format!("{value}\n")).unwrap();
        }
    }

    fn find(
        readings: &[Reading],
        metric: &str,
        device: &str,
        port: Option<&str>,
        counter: &str,
    ) -> Option<u64> {
        readings
            .iter()
            .find(|r| {
                r.metric == metric
                    && r.device == device
                    && r.port.as_deref() == port
                    && r.counter == counter
            })
            .map(|r| r.value)
    }

    #[test]
    fn reads_any_drivers_counters_and_caps_devices() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // soft-RoCE: port hw_counters only (rxe_ib_alloc_hw_port_stats)
        counters(
            &d.join("rxe0/ports/1/hw_counters"),
            &[
                ("retry_exceeded_err", "3"),
                ("rcvd_seq_err", "1"),
                ("lifespan", "10"),
            ],
        );
        // mlx5: port counters, port and device hw_counters
        counters(
            &d.join("mlx5_0/ports/1/counters"),
            &[("port_xmit_data", "400"), ("symbol_error", "0")],
        );
        counters(
            &d.join("mlx5_0/ports/1/hw_counters"),
            &[
                ("local_ack_timeout_err", "2"),
                ("np_cnp_sent", "9"),
                ("out_of_sequence", "5"),
            ],
        );
        counters(&d.join("mlx5_0/hw_counters"), &[("rnr_nak_retry_err", "7")]);
        counters(
            &d.join("mlx5_1/ports/1/hw_counters"),
            &[("out_of_sequence", "6")],
        );
        // not a number: skipped
        counters(
            &d.join("mlx5_1/ports/1/counters"),
            &[("port_state", "ACTIVE")],
        );
        // no counters at all: takes no name
        fs::create_dir_all(d.join("hfi1_0/ports/1")).unwrap();
        let readings = read(d, 2);
        assert_eq!(
            find(
                &readings,
                PORT_IB_STATS,
                "mlx5_0",
                Some("1"),
                "port_xmit_data"
            ),
            Some(400)
        );
        assert_eq!(
            find(&readings, PORT_HW_STATS, "mlx5_0", Some("1"), "np_cnp_sent"),
            Some(9)
        );
        assert_eq!(
            find(
                &readings,
                DEVICE_HW_STATS,
                "mlx5_0",
                None,
                "rnr_nak_retry_err"
            ),
            Some(7)
        );
        assert_eq!(
            find(
                &readings,
                PORT_HW_STATS,
                "mlx5_1",
                Some("1"),
                "out_of_sequence"
            ),
            Some(6)
        );
        // the third device with counters, in name order, is "other"
        assert_eq!(
            find(
                &readings,
                PORT_HW_STATS,
                OTHER,
                Some("1"),
                "retry_exceeded_err"
            ),
            Some(3)
        );
        assert!(readings
            .iter()
            .all(|r| r.counter != "lifespan" && r.counter != "port_state"));
        assert!(readings
            .iter()
            .all(|r| r.device != "hfi1_0" && r.device != "rxe0"));
    }

    #[test]
    fn exported_through_a_registry_and_gone_with_the_device() {
        let dir = tempfile::tempdir().unwrap();
        counters(
            &dir.path().join("rxe0/ports/1/hw_counters"),
            &[("sent_pkts", "12")],
        );
        let registry = crate::export::registry::Registry::new();
        let collector = DeviceCounters::new(dir.path(), 64);
        let files = collector.source().upgrade().unwrap();
        registry.register(Box::new(collector)).unwrap();
        assert!(
            !crate::export::metrics::render(&registry).contains(PORT_HW_STATS),
            "nothing read yet, nothing exported"
        );
        files.refresh();
        let text = crate::export::metrics::render(&registry);
        assert!(
            text.contains(
                r#"qpwatch_port_hw_stats_total{counter="sent_pkts",device="rxe0",port="1"} 12"#
            ),
            "{text}"
        );
        assert!(
            !text.contains(PORT_IB_STATS),
            "no series, no family: {text}"
        );
        fs::remove_dir_all(dir.path().join("rxe0")).unwrap();
        assert!(
            crate::export::metrics::render(&registry).contains(PORT_HW_STATS),
            "a scrape reads nothing: the last values read"
        );
        files.refresh();
        assert!(!crate::export::metrics::render(&registry).contains(PORT_HW_STATS));
    }

    #[test]
    fn kept_open_files_show_new_values_and_new_devices() {
        let dir = tempfile::tempdir().unwrap();
        let rxe0 = dir.path().join("rxe0/ports/1/hw_counters");
        counters(&rxe0, &[("sent_pkts", "12")]);
        let collector = DeviceCounters::new(dir.path(), 64);
        let value = |device: &str| {
            collector.files.refresh();
            find(
                &readings(&collector.files),
                PORT_HW_STATS,
                device,
                Some("1"),
                "sent_pkts",
            )
        };
        assert_eq!(value("rxe0"), Some(12));
        counters(&rxe0, &[("sent_pkts", "13")]);
        assert_eq!(value("rxe0"), Some(13), "read again in place");
        counters(&rxe0, &[("rcvd_pkts", "4")]);
        collector.files.refresh();
        let names: Vec<_> = readings(&collector.files)
            .into_iter()
            .map(|r| r.counter)
            .collect();
        assert_eq!(names, ["rcvd_pkts", "sent_pkts"], "a new counter file");
        counters(
            &dir.path().join("rxe1/ports/1/hw_counters"),
            &[("sent_pkts", "5")],
        );
        assert_eq!(value("rxe1"), Some(5), "a new device");
    }
}
