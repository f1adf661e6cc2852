//! CLOCK_MONOTONIC timestamps (the clock `bpf_ktime_get_ns` reads, so userspace
//! and kernel timings line up) and step deadlines.

use std::time::Duration;

/// Nanoseconds of CLOCK_MONOTONIC.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Time elapsed between two `monotonic_ns` readings.
pub fn elapsed(start_ns: u64, end_ns: u64) -> Duration {
    Duration::from_nanos(end_ns.saturating_sub(start_ns))
}

/// The calling thread's run-queue wait: how long it has been runnable but
/// not running (`run_delay` of /proc/thread-self/schedstat, CONFIG_SCHED_INFO).
/// Read before and after a wait, it says how late the thread ran after it
/// was woken: CPU starvation (a cgroup CPU limit, busier tasks) that the
/// thread's own timestamps cannot see.
pub struct RunQueueWait {
    file: Option<std::fs::File>,
    buf: [u8; 96],
}

impl RunQueueWait {
    /// For the calling thread; `None` readings where the kernel has no schedstat.
    pub fn of_this_thread() -> RunQueueWait {
        RunQueueWait {
            file: std::fs::File::open("/proc/thread-self/schedstat").ok(),
            buf: [0; 96],
        }
    }

    /// Nanoseconds spent waiting on a run queue so far.
    pub fn total_ns(&mut self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let file = self.file.as_ref()?;
        let n = file.read_at(&mut self.buf, 0).ok()?;
        parse_run_delay(&self.buf[..n])
    }
}

/// "sum_exec_runtime run_delay pcount\n" → run_delay.
fn parse_run_delay(line: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(line).ok()?;
    text.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// The point in time by which a step must be done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    at_ns: u64,
}

impl Deadline {
    pub fn new(start_ns: u64, timeout: Duration) -> Deadline {
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        Deadline {
            at_ns: start_ns.saturating_add(timeout_ns),
        }
    }

    /// A deadline `timeout` from now.
    pub fn after(timeout: Duration) -> Deadline {
        Deadline::new(monotonic_ns(), timeout)
    }

    pub fn at_ns(&self) -> u64 {
        self.at_ns
    }

    pub fn remaining(&self, now_ns: u64) -> Duration {
        Duration::from_nanos(self.at_ns.saturating_sub(now_ns))
    }

    pub fn expired(&self, now_ns: u64) -> bool {
        now_ns >= self.at_ns
    }

    /// `poll(2)` timeout for the time left: rounded up to whole milliseconds so
    /// that a sub-millisecond remainder does not spin with timeout 0.
    pub fn poll_timeout_ms(&self, now_ns: u64) -> i32 {
        let left = self.at_ns.saturating_sub(now_ns);
        let ms = left.div_ceil(1_000_000);
        i32::try_from(ms).unwrap_or(i32::MAX)
    }

    /// The earlier of two deadlines.
    pub fn min(self, other: Deadline) -> Deadline {
        if other.at_ns < self.at_ns {
            other
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_bookkeeping() {
        let d = Deadline::new(1_000, Duration::from_millis(5));
        assert_eq!(d.at_ns(), 5_001_000);
        assert_eq!(d.remaining(1_000), Duration::from_millis(5));
        assert_eq!(d.remaining(10_000_000), Duration::ZERO);
        assert!(!d.expired(5_000_999));
        assert!(d.expired(5_001_000));
        assert_eq!(d.poll_timeout_ms(1_000), 5);
        // 1 ns left still waits a whole millisecond instead of spinning.
        assert_eq!(d.poll_timeout_ms(5_000_999), 1);
        assert_eq!(d.poll_timeout_ms(5_001_000), 0);
        assert_eq!(d.poll_timeout_ms(u64::MAX), 0);
    }

    #[test]
    fn deadline_saturates() {
        let d = Deadline::new(u64::MAX - 1, Duration::from_secs(10));
        assert_eq!(d.at_ns(), u64::MAX);
        assert_eq!(Deadline::new(0, Duration::MAX).poll_timeout_ms(0), i32::MAX);
        let early = Deadline::new(0, Duration::from_millis(1));
        let late = Deadline::new(0, Duration::from_millis(2));
        assert_eq!(late.min(early), early);
        assert_eq!(early.min(late), early);
    }

    #[test]
    fn run_delay_is_the_second_schedstat_field() {
        assert_eq!(parse_run_delay(b"123456 7890 12\n"), Some(7890));
        assert_eq!(parse_run_delay(b"123456\n"), None);
        assert_eq!(parse_run_delay(b""), None);
        let mut wait = RunQueueWait::of_this_thread();
        if let (Some(a), Some(b)) = (wait.total_ns(), wait.total_ns()) {
            assert!(b >= a);
        }
    }

    #[test]
    fn monotonic_clock_advances() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(b >= a);
        assert_eq!(elapsed(b, a), Duration::ZERO);
        assert_eq!(elapsed(10, 25), Duration::from_nanos(15));
    }
}
