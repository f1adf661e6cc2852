//! Reading counters from sysfs, for the collectors that export the kernel's
//! own RDMA counters (ib_cm's, the devices' and ports'). A [`Refresher`]
//! reads them on its own thread every `[sysfs_counters] interval_seconds`;
//! a scrape exports the last values read and does no file I/O, so its time
//! does not grow with the number of counter files (a read of each runs the
//! attribute's `show` in the kernel: about 130 µs apiece under emulation).

use std::{
    collections::BTreeMap,
    fs::{self, File},
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError, Weak},
    thread,
    time::{Duration, Instant, SystemTime},
};

use super::{family::samples, sysfs_reads::SysfsReadMetrics};
use crate::export::exposition::Value;
use crate::model::qp::OTHER;

/// The names in `dir`, none if it cannot be read.
pub(super) fn entries(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The counters of every device under `dir` that has any, in name order,
/// each with its `device` label: its name for the first `max_devices`,
/// `"other"` after them (a device without counters takes no name).
fn labelled_devices<T>(
    dir: &Path,
    max_devices: usize,
    counters: impl Fn(&Path) -> Vec<T>,
) -> Vec<(String, Vec<T>)> {
    let mut devices = entries(dir);
    devices.sort();
    let mut named = 0;
    let mut out = Vec::new();
    for device in devices {
        let found = counters(&dir.join(&device));
        if found.is_empty() {
            continue;
        }
        let label = if named < max_devices {
            named += 1;
            device
        } else {
            OTHER.to_owned()
        };
        out.push((label, found));
    }
    out
}

/// The counter files of every device under a directory, kept open from one
/// scrape to the next and read again in place: a read at offset 0 of an open
/// sysfs attribute runs its `show` again (fs/kernfs/file.c,
/// `kernfs_seq_start`), so a scrape costs one `pread` per counter instead of
/// a path walk, `open`, `statx`, two `read`s and `close`. The files are found
/// again when the listing of the directories that hold them changes (a
/// device or port comes or goes, ib_cm loads) or a read fails (a device
/// re-registered under the same name).
pub(super) struct CounterFiles<K> {
    dir: PathBuf,
    max_devices: usize,
    /// One device's counter files, each with the key of its series.
    find: fn(&Path) -> Vec<(K, PathBuf)>,
    /// The directories of one device whose listing decides what `find` finds.
    watch: fn(&Path) -> Vec<PathBuf>,
    open: Mutex<Option<OpenFiles<K>>>,
    /// What the last [`CounterFiles::refresh`] read.
    values: Mutex<Vec<(String, K, u64)>>,
}

struct OpenFiles<K> {
    listing: Vec<String>,
    /// (device label, key, file)
    files: Vec<(String, K, File)>,
}

impl<K: Clone + Ord> CounterFiles<K> {
    pub fn new(
        dir: impl Into<PathBuf>,
        max_devices: usize,
        find: fn(&Path) -> Vec<(K, PathBuf)>,
        watch: fn(&Path) -> Vec<PathBuf>,
    ) -> Self {
        Self {
            dir: dir.into(),
            max_devices,
            find,
            watch,
            open: Mutex::new(None),
            values: Mutex::new(Vec::new()),
        }
    }

    /// The values the last [`CounterFiles::refresh`] read: summed by device
    /// label and key, in order.
    pub fn values(&self) -> Vec<(String, K, u64)> {
        self.values
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads every counter's value now and keeps it for [`CounterFiles::values`].
    pub fn refresh(&self) {
        let values = self.read();
        *self.values.lock().unwrap_or_else(PoisonError::into_inner) = values;
    }

    /// Every counter's value now, summed by device label and key, in order.
    fn read(&self) -> Vec<(String, K, u64)> {
        let listing = self.listing();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.as_ref().is_none_or(|o| o.listing != listing) {
            *open = Some(self.open_files(listing.clone()));
        }
        let (mut values, complete) = read_all(&open.as_ref().expect("opened above").files);
        if !complete {
            let again = self.open_files(listing);
            values = read_all(&again.files).0;
            *open = Some(again);
        }
        let mut sums: BTreeMap<(String, K), u64> = BTreeMap::new();
        for (label, key, value) in values {
            *sums.entry((label, key)).or_default() += value;
        }
        sums.into_iter()
            .map(|((label, key), value)| (label, key, value))
            .collect()
    }

    fn listing(&self) -> Vec<String> {
        let mut devices = entries(&self.dir);
        devices.sort();
        let mut listing = Vec::new();
        for device in devices {
            let device_dir = self.dir.join(&device);
            listing.push(device);
            for dir in (self.watch)(&device_dir) {
                let mut names = entries(&dir);
                names.sort();
                listing.push(format!("{}:{}", dir.display(), names.join(",")));
            }
        }
        listing
    }

    fn open_files(&self, listing: Vec<String>) -> OpenFiles<K> {
        let files = labelled_devices(&self.dir, self.max_devices, |device| {
            (self.find)(device)
                .into_iter()
                .filter_map(|(key, path)| {
                    let file = File::open(path).ok()?;
                    read_at_start(&file)?;
                    Some((key, file))
                })
                .collect()
        })
        .into_iter()
        .flat_map(|(label, files)| {
            files
                .into_iter()
                .map(move |(key, file)| (label.clone(), key, file))
        })
        .collect();
        OpenFiles { listing, files }
    }
}

/// A set of counter files that can be read again.
pub(super) trait Refresh: Send + Sync {
    fn refresh(&self);
}

impl<K: Clone + Ord + Send + Sync> Refresh for CounterFiles<K> {
    fn refresh(&self) {
        CounterFiles::refresh(self);
    }
}

/// Reads the collectors' counter files on a timer, and counts its reads.
pub(super) struct Refresher {
    sources: Vec<Weak<dyn Refresh>>,
    metrics: SysfsReadMetrics,
}

impl Refresher {
    pub fn new(sources: Vec<Weak<dyn Refresh>>, metrics: SysfsReadMetrics) -> Self {
        Self { sources, metrics }
    }

    /// Reads every source still registered; `false` once none is.
    pub fn refresh(&self) -> bool {
        let started = SystemTime::now();
        let clock = Instant::now();
        let sources: Vec<Arc<dyn Refresh>> =
            self.sources.iter().filter_map(Weak::upgrade).collect();
        if sources.is_empty() {
            return false;
        }
        for source in &sources {
            source.refresh();
        }
        self.metrics.read(started, clock.elapsed());
        true
    }

    /// Reads at once, then every `interval`, on a thread of its own until
    /// the collectors are dropped. The caller does not wait for the first
    /// read: a read that hangs (a driver waiting on its device) must not
    /// hold up the agent's start.
    pub fn start(self, interval: Duration) -> std::io::Result<()> {
        thread::Builder::new()
            .name("sysfs-counters".to_owned())
            .spawn(move || {
                while self.refresh() {
                    thread::sleep(interval);
                }
            })
            .map(drop)
    }
}

/// The value of every file that can be read; `false` if one cannot any more.
fn read_all<K: Clone>(files: &[(String, K, File)]) -> (Vec<(String, K, u64)>, bool) {
    let mut complete = true;
    let values = files
        .iter()
        .filter_map(|(label, key, file)| {
            let value = read_at_start(file);
            complete &= value.is_some();
            Some((label.clone(), key.clone(), value?))
        })
        .collect();
    (values, complete)
}

/// The unsigned integer an open file holds, read from its start.
fn read_at_start(file: &File) -> Option<u64> {
    let mut buf = [0u8; 32];
    let len = file.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..len]).ok()?.trim().parse().ok()
}

/// A label value from a file name: lowercase letters, digits and `_`.
pub(super) fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Appends the lines of a counter family's `(labels, value)` samples;
/// labels in name order.
pub(super) fn counter_samples(
    out: &mut String,
    name: &str,
    counters: impl IntoIterator<Item = (Vec<(&'static str, String)>, u64)>,
) {
    samples(
        out,
        name,
        counters
            .into_iter()
            .map(|(labels, value)| (labels, Value::Unsigned(value))),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::metrics::{device_counters::DeviceCounters, render, Registrar};

    #[test]
    fn the_refresher_reads_on_its_timer_counts_its_reads_and_stops_with_the_collectors() {
        let dir = tempfile::tempdir().unwrap();
        let hw = dir.path().join("rxe0/ports/1/hw_counters");
        fs::create_dir_all(&hw).unwrap();
        fs::write(hw.join("sent_pkts"), "1\n").unwrap();
        let registry = crate::export::registry::Registry::new();
        let mut r = Registrar::new(&registry);
        let collector = DeviceCounters::new(dir.path(), 64);
        let source = collector.source();
        r.try_register(Box::new(collector)).unwrap();
        let reads = SysfsReadMetrics::new(&mut r);
        let before = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        Refresher::new(vec![source.clone()], reads)
            .start(Duration::from_millis(20))
            .unwrap();
        let sample = |text: &str, name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{name} in {text}"))
        };
        let sent = r#"qpwatch_port_hw_stats_total{counter="sent_pkts",device="rxe0",port="1"}"#;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !render(&registry).contains(sent) {
            assert!(Instant::now() < deadline, "not read at start");
            thread::sleep(Duration::from_millis(5));
        }
        let text = render(&registry);
        assert_eq!(sample(&text, sent), 1.0, "read at start: {text}");
        assert!(sample(&text, "qpwatch_sysfs_reads_total") >= 1.0);
        assert!(sample(&text, "qpwatch_sysfs_last_read_timestamp_seconds") >= before);
        fs::write(hw.join("sent_pkts"), "2\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while sample(&render(&registry), sent) != 2.0 {
            assert!(Instant::now() < deadline, "not read again");
            thread::sleep(Duration::from_millis(5));
        }
        let text = render(&registry);
        assert!(sample(&text, "qpwatch_sysfs_reads_total") >= 2.0);
        drop(registry);
        assert!(
            source.upgrade().is_none(),
            "the collector went with the registry"
        );
    }
}
