//! `process_*`: CPU, memory, threads and file descriptors of the agent, the
//! families Prometheus's client libraries export. A scrape reads them with
//! one `pread` of a kept-open `/proc/self/stat`, one `fstat` of
//! `/proc/self/fd` (from Linux 6.2 on) and `getrlimit`: 3 system calls.
//! Before 6.2 the descriptors can only be listed, which costs a dentry
//! lookup per descriptor (`proc_readfd_common()`), and the agent holds about
//! 200 of them: a thread of the collector's own lists them every
//! [`OPEN_FDS_RECOUNT`] instead, and a scrape exports its last count.
//! The prometheus crate's collector also opened `/proc/PID` and read and
//! parsed `/proc/PID/limits` each time, and counted CPU time in whole
//! seconds.

use std::{
    fs::{self, File},
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::fs::FileExt,
    },
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use super::Registrar;
use crate::export::{
    exposition::{self, Kind, Value},
    registry::{Collector, Desc},
};

pub fn register(r: &mut Registrar) {
    r.try_register(Box::new(ProcessCollector::new()))
        .expect("unique metric");
}

const CPU: (&str, &str) = (
    "process_cpu_seconds_total",
    "Total user and system CPU time spent in seconds.",
);
const OPEN_FDS: (&str, &str) = ("process_open_fds", "Number of open file descriptors.");
const MAX_FDS: (&str, &str) = (
    "process_max_fds",
    "Maximum number of open file descriptors.",
);
const VSIZE: (&str, &str) = (
    "process_virtual_memory_bytes",
    "Virtual memory size in bytes.",
);
const RSS: (&str, &str) = (
    "process_resident_memory_bytes",
    "Resident memory size in bytes.",
);
const START_TIME: (&str, &str) = (
    "process_start_time_seconds",
    "Start time of the process since unix epoch in seconds.",
);
const THREADS: (&str, &str) = ("process_threads", "Number of OS threads in the process.");

const FAMILIES: [(&str, &str); 7] = [CPU, OPEN_FDS, MAX_FDS, VSIZE, RSS, START_TIME, THREADS];

/// The fields of `/proc/self/stat` that are exported (proc(5)).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    /// utime + stime, in clock ticks
    cpu_ticks: u64,
    threads: u64,
    /// since boot, in clock ticks
    start_ticks: u64,
    vsize_bytes: u64,
    rss_pages: u64,
}

/// Parses a `/proc/PID/stat` line. The command name (field 2) is in
/// parentheses and may hold spaces and parentheses itself: the fields
/// counted from the last `)`.
fn parse_stat(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // fields[0] is field 3 (state)
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        cpu_ticks: field(14)? + field(15)?,
        threads: field(20)?,
        start_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

/// `btime` of `/proc/stat`: the boot time, in seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

struct ProcessCollector {
    stat: Option<File>,
    open_fds: Option<OpenFds>,
    ticks_per_second: f64,
    page_bytes: f64,
    start_time: Option<f64>,
    descs: Vec<Desc>,
}

impl ProcessCollector {
    fn new() -> Self {
        // SAFETY: sysconf only reads a configuration value.
        let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        // SAFETY: as above.
        let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64;
        let stat = File::open("/proc/self/stat").ok();
        let start_time = stat.as_ref().and_then(read_stat).and_then(|s| {
            let boot = boot_time(&fs::read_to_string("/proc/stat").ok()?)?;
            Some(boot as f64 + s.start_ticks as f64 / ticks_per_second)
        });
        let descs = FAMILIES
            .iter()
            .map(|&(name, help)| {
                let kind = if name == CPU.0 {
                    Kind::Counter
                } else {
                    Kind::Gauge
                };
                Desc::new(name, help, kind, &[]).expect("valid metric")
            })
            .collect();
        Self {
            stat,
            open_fds: OpenFds::new(),
            ticks_per_second,
            page_bytes,
            start_time,
            descs,
        }
    }
}

fn read_stat(file: &File) -> Option<Stat> {
    let mut buf = [0u8; 1024];
    let len = file.read_at(&mut buf, 0).ok()?;
    parse_stat(std::str::from_utf8(&buf[..len]).ok()?)
}

/// How often the open descriptors are listed where the kernel gives no count
/// (before Linux 6.2): `process_open_fds` is at most this old there.
pub const OPEN_FDS_RECOUNT: Duration = Duration::from_secs(5);

/// `process_open_fds`: the size of `/proc/self/fd` at each scrape, or where
/// the kernel reports none, the last count of a thread listing it.
enum OpenFds {
    /// Read at each scrape: the size (Linux 6.2 on), or a listing where the
    /// listing thread could not be started.
    Scraped(Arc<FdDir>),
    /// The listing thread's last count (`f64` bits; NaN: the listing failed).
    Listed(Arc<AtomicU64>),
}

impl OpenFds {
    fn new() -> Option<Self> {
        let dir = Arc::new(FdDir::open()?);
        if dir.size().is_some() {
            return Some(Self::Scraped(dir));
        }
        Some(Self::listed_every(dir, OPEN_FDS_RECOUNT))
    }

    /// Counts listed by a thread every `interval`, until `self` is dropped.
    fn listed_every(dir: Arc<FdDir>, interval: Duration) -> Self {
        let listed = Arc::new(AtomicU64::new(count_bits(dir.list())));
        let (until_dropped, lister) = (Arc::downgrade(&listed), Arc::clone(&dir));
        let spawned = thread::Builder::new()
            .name("open-fds".to_owned())
            .spawn(move || loop {
                thread::sleep(interval);
                let Some(listed) = until_dropped.upgrade() else {
                    return;
                };
                listed.store(count_bits(lister.list()), Ordering::Relaxed);
            });
        match spawned {
            Ok(_) => Self::Listed(listed),
            // without its thread, each scrape lists the directory itself
            Err(_) => Self::Scraped(dir),
        }
    }

    fn count(&self) -> Option<f64> {
        match self {
            Self::Scraped(dir) => dir.count(),
            Self::Listed(listed) => {
                Some(f64::from_bits(listed.load(Ordering::Relaxed))).filter(|n| !n.is_nan())
            }
        }
    }
}

fn count_bits(count: Option<f64>) -> u64 {
    count.unwrap_or(f64::NAN).to_bits()
}

/// `/proc/self/fd`, kept open. Its own descriptor is counted, as it was when
/// opened per scrape.
struct FdDir(Mutex<OwnedFd>);

impl FdDir {
    fn open() -> Option<Self> {
        let dir = File::open("/proc/self/fd").ok()?;
        Some(Self(Mutex::new(dir.into())))
    }

    /// The directory's size, which from Linux 6.2 on is the number of open
    /// descriptors (`proc_fd_getattr()` in fs/proc/fd.c); before, it is 0.
    fn size(&self) -> Option<f64> {
        let dir = self.0.lock().ok()?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat writes a `struct stat` into the buffer it is given.
        if unsafe { libc::fstat(dir.as_raw_fd(), st.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: fstat succeeded, so it filled the struct.
        let size = unsafe { st.assume_init() }.st_size;
        (size > 0).then_some(size as f64)
    }

    fn count(&self) -> Option<f64> {
        self.size().or_else(|| self.list())
    }

    /// Counts the entries of the directory, read from its start.
    fn list(&self) -> Option<f64> {
        let dir = self.0.lock().ok()?;
        let fd = dir.as_raw_fd();
        // SAFETY: lseek on an open descriptor the caller holds.
        if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } != 0 {
            return None;
        }
        let mut buf = [0u8; 4096];
        let mut entries = 0usize;
        loop {
            // SAFETY: getdents64 writes at most `buf.len()` bytes into `buf`.
            let len =
                unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
            if len < 0 {
                return None;
            }
            if len == 0 {
                break;
            }
            entries += dirent_names(&buf[..len as usize]);
        }
        Some(entries as f64)
    }
}

/// The entries of a `getdents64` buffer but `.` and `..`: `struct
/// linux_dirent64` is d_ino (8 bytes), d_off (8), d_reclen (2), d_type (1),
/// then the NUL-terminated name.
fn dirent_names(buf: &[u8]) -> usize {
    const NAME: usize = 19;
    let mut at = 0;
    let mut names = 0;
    while at + NAME < buf.len() {
        let reclen = usize::from(u16::from_ne_bytes([buf[at + 16], buf[at + 17]]));
        if reclen == 0 {
            break;
        }
        let name = &buf[at + NAME..(at + reclen).min(buf.len())];
        if !name.starts_with(b".\0") && !name.starts_with(b"..\0") {
            names += 1;
        }
        at += reclen;
    }
    names
}

fn max_fds() -> Option<f64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0)
        .then_some(limit.rlim_cur as f64)
}

impl Collector for ProcessCollector {
    fn descs(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self, out: &mut [String]) {
        let stat = self.stat.as_ref().and_then(read_stat);
        // in the order of FAMILIES
        let values = [
            stat.map(|s| s.cpu_ticks as f64 / self.ticks_per_second),
            self.open_fds.as_ref().and_then(OpenFds::count),
            max_fds(),
            stat.map(|s| s.vsize_bytes as f64),
            stat.map(|s| s.rss_pages as f64 * self.page_bytes),
            self.start_time,
            stat.map(|s| s.threads as f64),
        ];
        for ((lines, (name, _)), value) in out.iter_mut().zip(FAMILIES).zip(values) {
            if let Some(value) = value {
                exposition::sample(lines, name, "", "", Value::Float(value));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_whose_command_has_spaces_and_parentheses() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 5000 0 0 0 250 75 0 0 20 0 7 0 123456 104857600 3000 18446744073709551615 1 1 0 0 0 0 0 4096 17475 0 0 0 17 1 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                cpu_ticks: 325,
                threads: 7,
                start_ticks: 123456,
                vsize_bytes: 104857600,
                rss_pages: 3000,
            })
        );
        assert_eq!(parse_stat("4242 (truncated) S 1 2"), None);
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1796400000\nprocesses 9\n"),
            Some(1796400000)
        );
    }

    #[test]
    fn exports_the_agents_own_figures() {
        let registry = crate::export::registry::Registry::new();
        registry
            .register(Box::new(ProcessCollector::new()))
            .unwrap();
        let text = crate::export::metrics::render(&registry);
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{name} in {text}"))
        };
        let threads = fs::read_dir("/proc/self/task").unwrap().count() as f64;
        assert!(value("process_threads") >= 1.0 && value("process_threads") <= threads + 8.0);
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "{start} vs {now}"
        );
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
    }

    /// Held by the tests that open hundreds of descriptors, which would
    /// upset each other's counts.
    static MANY_FDS: Mutex<()> = Mutex::new(());

    /// Both ways of counting: the directory's size where the kernel gives
    /// it (the host's), and its listing.
    #[test]
    fn counts_open_descriptors_past_one_listing_buffer() {
        let _one_at_a_time = MANY_FDS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = FdDir::open().unwrap();
        let listed = || dir.list().unwrap();
        let counts = || [dir.count().unwrap(), listed()];
        let before = counts();
        assert!(before[1] >= 4.0, "{before:?}");
        // ~24 bytes per entry: 400 more do not fit one 4 KiB getdents64 buffer
        let files: Vec<File> = (0..400)
            .map(|_| File::open("/proc/self/stat").unwrap())
            .collect();
        let during = counts();
        drop(files);
        let after = counts();
        // other tests of this process open and close files meanwhile
        for way in 0..2 {
            assert!(
                (during[way] - before[way] - 400.0).abs() <= 30.0,
                "{before:?} → {during:?}"
            );
            assert!(
                (after[way] - before[way]).abs() <= 30.0,
                "{before:?} → {after:?}"
            );
            assert!((during[way] - during[1 - way]).abs() <= 30.0, "{during:?}");
        }
        assert_eq!(dirent_names(&[]), 0);
    }

    /// The way of kernels before 6.2 (the guest's): a thread's listing,
    /// which follows the descriptors and stops with the collector.
    #[test]
    fn a_listing_thread_counts_until_dropped() {
        let _one_at_a_time = MANY_FDS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = Arc::new(FdDir::open().unwrap());
        let open_fds = OpenFds::listed_every(Arc::clone(&dir), Duration::from_millis(20));
        let near = |a: f64, b: f64| (a - b).abs() <= 30.0;
        let before = open_fds.count().unwrap();
        assert!(near(before, dir.list().unwrap()), "{before}");
        let files: Vec<File> = (0..300)
            .map(|_| File::open("/proc/self/stat").unwrap())
            .collect();
        let waited = (0..250).find(|_| {
            thread::sleep(Duration::from_millis(20));
            near(open_fds.count().unwrap(), before + 300.0)
        });
        assert!(
            waited.is_some(),
            "{} after {before}",
            open_fds.count().unwrap()
        );
        drop(files);
        drop(open_fds);
        let stopped = (0..250).find(|_| {
            thread::sleep(Duration::from_millis(20));
            Arc::strong_count(&dir) == 1
        });
        assert!(
            stopped.is_some(),
            "the listing thread still holds the directory"
        );
    }
}
