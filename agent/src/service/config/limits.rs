//! The one table of numeric limits. The file and the flags check a number
//! against the same row, so a value out of range gets the same message
//! whichever way it came in, after the key or the flag that carried it:
//!
//! ```text
//! qpwatch.toml:2:21: hooks.ring_buffer_bytes: 5000 is not a power of two between 4096 and 1073741824
//! command line: --ring-buffer-bytes: 5000 is not a power of two between 4096 and 1073741824
//! ```

use std::time::Duration;

use rdma_probe::{MAX_MESSAGE_SIZE, MESSAGE_HEADER};

/// What values a number may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Range {
    /// A whole number, `min..=max`.
    Integer { min: i64, max: i64 },
    /// A power of two, `min..=max`.
    PowerOfTwo { min: i64, max: i64 },
    /// A number of seconds, above 0, at least `min` and at most `max`.
    Seconds { min: f64, max: f64 },
    /// A fraction, `0 <= v < 1`.
    Fraction,
}

/// A bounded number: where it is set and what it may be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    /// The file's section: `hooks`, `limits`, `mesh`, `http`, `sysfs_counters`, or `targets` (a key of each
    /// `[[targets]]`, named `targets[N].key` in errors).
    pub section: &'static str,
    /// The key in that section.
    pub key: &'static str,
    /// The flag that sets it, if one does (for a target's key: the value
    /// for every `--target`).
    pub flag: Option<&'static str>,
    pub range: Range,
    /// What is counted.
    pub unit: &'static str,
}

/// The longest interval or timeout: a day.
const DAY: f64 = 86_400.0;

pub const RING_BUFFER_BYTES: Limit = Limit {
    section: "hooks",
    key: "ring_buffer_bytes",
    flag: Some("--ring-buffer-bytes"),
    // a page at least; the kernel wants a power-of-two number of pages
    range: Range::PowerOfTwo {
        min: 4096,
        max: 1 << 30,
    },
    unit: "bytes",
};

pub const MODULE_POLL_INTERVAL: Limit = Limit {
    section: "hooks",
    key: "module_poll_interval_seconds",
    flag: Some("--module-poll-interval"),
    range: Range::Seconds { min: 0.0, max: DAY },
    unit: "seconds",
};

pub const SYSFS_COUNTERS_INTERVAL: Limit = Limit {
    section: "sysfs_counters",
    key: "interval_seconds",
    flag: Some("--sysfs-counters-interval"),
    range: Range::Seconds { min: 1.0, max: DAY },
    unit: "seconds",
};

pub const MAX_TRACKED_QPS: Limit = Limit {
    section: "limits",
    key: "max_tracked_qps",
    flag: Some("--max-tracked-qps"),
    range: Range::Integer {
        min: 1,
        max: 1 << 24,
    },
    unit: "QPs",
};

pub const MAX_DEVICE_LABELS: Limit = Limit {
    section: "limits",
    key: "max_device_labels",
    flag: Some("--max-device-labels"),
    range: Range::Integer { min: 1, max: 4096 },
    unit: "label values",
};

pub const MAX_PROCESS_LABELS: Limit = Limit {
    section: "limits",
    key: "max_process_labels",
    flag: Some("--max-process-labels"),
    range: Range::Integer { min: 1, max: 4096 },
    unit: "label values",
};

pub const MAX_CGROUP_LABELS: Limit = Limit {
    section: "limits",
    key: "max_cgroup_labels",
    flag: Some("--max-cgroup-labels"),
    range: Range::Integer { min: 1, max: 4096 },
    unit: "label values",
};

pub const MAX_PEER_LABELS: Limit = Limit {
    section: "limits",
    key: "max_peer_labels",
    flag: Some("--max-peer-labels"),
    range: Range::Integer { min: 1, max: 4096 },
    unit: "label values",
};

pub const TARGET_INTERVAL: Limit = Limit {
    section: "targets",
    key: "interval_seconds",
    flag: Some("--probe-interval"),
    range: Range::Seconds { min: 0.0, max: DAY },
    unit: "seconds",
};

pub const TARGET_JITTER: Limit = Limit {
    section: "targets",
    key: "jitter",
    flag: None,
    range: Range::Fraction,
    unit: "of the interval",
};

pub const TARGET_PINGS: Limit = Limit {
    section: "targets",
    key: "pings",
    flag: Some("--probe-pings"),
    range: Range::Integer {
        min: 1,
        max: 100_000,
    },
    unit: "ping-pongs",
};

pub const TARGET_TIMEOUT: Limit = Limit {
    section: "targets",
    key: "timeout_seconds",
    flag: Some("--probe-timeout"),
    range: Range::Seconds { min: 0.0, max: DAY },
    unit: "seconds",
};

pub const TARGET_MESSAGE_SIZE: Limit = Limit {
    section: "targets",
    key: "message_size",
    flag: None,
    // the probe's header up to what the responder posts receives for
    range: Range::Integer {
        min: MESSAGE_HEADER as i64,
        max: MAX_MESSAGE_SIZE as i64,
    },
    unit: "bytes",
};

/// The longest mesh interval or check period: an hour.
const HOUR: f64 = 3_600.0;

pub const MESH_INTERVAL: Limit = Limit {
    section: "mesh",
    key: "interval_seconds",
    flag: Some("--mesh-interval"),
    // 100 probes/s per target at most
    range: Range::Seconds {
        min: 0.01,
        max: HOUR,
    },
    unit: "seconds",
};

pub const MESH_TIMEOUT: Limit = Limit {
    section: "mesh",
    key: "timeout_seconds",
    flag: Some("--mesh-timeout"),
    range: Range::Seconds {
        min: 0.001,
        max: 60.0,
    },
    unit: "seconds",
};

pub const MESH_TARGETS_FILE_CHECK: Limit = Limit {
    section: "mesh",
    key: "targets_file_check_seconds",
    flag: Some("--mesh-targets-file-check"),
    range: Range::Seconds {
        min: 0.1,
        max: HOUR,
    },
    unit: "seconds",
};

pub const MESH_DISCOVER_EXPIRY: Limit = Limit {
    section: "mesh",
    key: "discover_expiry_seconds",
    flag: Some("--mesh-discover-expiry"),
    range: Range::Seconds { min: 1.0, max: DAY },
    unit: "seconds",
};

pub const MESH_DISCOVER_MAX_TARGETS: Limit = Limit {
    section: "mesh",
    key: "discover_max_targets",
    flag: Some("--mesh-discover-max-targets"),
    range: Range::Integer {
        min: 1,
        max: 100_000,
    },
    unit: "targets",
};

pub const MESH_MAX_TARGETS: Limit = Limit {
    section: "mesh",
    key: "max_targets",
    flag: Some("--mesh-max-targets"),
    range: Range::Integer {
        min: 1,
        max: 100_000,
    },
    unit: "targets",
};

pub const HTTP_MAX_CONNECTIONS: Limit = Limit {
    section: "http",
    key: "max_connections",
    flag: Some("--http-max-connections"),
    range: Range::Integer {
        min: 1,
        max: 65_536,
    },
    unit: "connections",
};

pub const HTTP_MAX_CONNECTIONS_PER_SOURCE: Limit = Limit {
    section: "http",
    key: "max_connections_per_source",
    flag: Some("--http-max-connections-per-source"),
    range: Range::Integer {
        min: 1,
        max: 65_536,
    },
    unit: "connections",
};

pub const HTTP_HEADER_TIMEOUT: Limit = Limit {
    section: "http",
    key: "header_timeout_seconds",
    flag: Some("--http-header-timeout"),
    range: Range::Seconds {
        min: 0.1,
        max: HOUR,
    },
    unit: "seconds",
};

pub const HTTP_IDLE_TIMEOUT: Limit = Limit {
    section: "http",
    key: "idle_timeout_seconds",
    flag: Some("--http-idle-timeout"),
    range: Range::Seconds { min: 0.1, max: DAY },
    unit: "seconds",
};

pub const HTTP_TLS_HANDSHAKE_TIMEOUT: Limit = Limit {
    section: "http",
    key: "tls_handshake_timeout_seconds",
    flag: Some("--http-tls-handshake-timeout"),
    range: Range::Seconds {
        min: 0.1,
        max: HOUR,
    },
    unit: "seconds",
};

pub const HTTP_MAX_HEADER_BYTES: Limit = Limit {
    section: "http",
    key: "max_header_bytes",
    flag: Some("--http-max-header-bytes"),
    // hyper's smallest read buffer
    range: Range::Integer {
        min: 8192,
        max: 1 << 20,
    },
    unit: "bytes",
};

pub const RESPONDER_MAX_CONNECTIONS: Limit = Limit {
    section: "responder",
    key: "max_connections",
    flag: Some("--responder-max-connections"),
    range: Range::Integer {
        min: 1,
        max: 65_536,
    },
    unit: "connections",
};

pub const RESPONDER_MAX_PER_SOURCE: Limit = Limit {
    section: "responder",
    key: "max_connections_per_source",
    flag: Some("--responder-max-connections-per-source"),
    range: Range::Integer {
        min: 1,
        max: 65_536,
    },
    unit: "connections",
};

pub const RESPONDER_IDLE_TIMEOUT: Limit = Limit {
    section: "responder",
    key: "idle_timeout_seconds",
    flag: Some("--responder-idle-timeout"),
    range: Range::Seconds { min: 1.0, max: DAY },
    unit: "seconds",
};

pub const MESH_ANSWER_RATE: Limit = Limit {
    section: "mesh",
    key: "answer_rate_per_source",
    flag: Some("--mesh-answer-rate-per-source"),
    range: Range::Integer {
        min: 1,
        max: 1_000_000,
    },
    unit: "answers per second",
};

/// Every bounded number of the configuration.
pub const LIMITS: [Limit; 29] = [
    RING_BUFFER_BYTES,
    MODULE_POLL_INTERVAL,
    SYSFS_COUNTERS_INTERVAL,
    MAX_TRACKED_QPS,
    MAX_DEVICE_LABELS,
    MAX_PROCESS_LABELS,
    MAX_CGROUP_LABELS,
    MAX_PEER_LABELS,
    TARGET_INTERVAL,
    TARGET_JITTER,
    TARGET_PINGS,
    TARGET_TIMEOUT,
    TARGET_MESSAGE_SIZE,
    MESH_INTERVAL,
    MESH_TIMEOUT,
    MESH_TARGETS_FILE_CHECK,
    MESH_MAX_TARGETS,
    MESH_DISCOVER_EXPIRY,
    MESH_DISCOVER_MAX_TARGETS,
    HTTP_MAX_CONNECTIONS,
    HTTP_MAX_CONNECTIONS_PER_SOURCE,
    HTTP_HEADER_TIMEOUT,
    HTTP_IDLE_TIMEOUT,
    HTTP_TLS_HANDSHAKE_TIMEOUT,
    HTTP_MAX_HEADER_BYTES,
    RESPONDER_MAX_CONNECTIONS,
    RESPONDER_MAX_PER_SOURCE,
    RESPONDER_IDLE_TIMEOUT,
    MESH_ANSWER_RATE,
];

impl Limit {
    /// The file's key, `section.key` (for a target's key, of target `N`).
    pub fn file_key(&self, target: Option<usize>) -> String {
        match target {
            Some(i) => format!("{}[{i}].{}", self.section, self.key),
            None => format!("{}.{}", self.section, self.key),
        }
    }

    /// A whole number within an [`Range::Integer`] or [`Range::PowerOfTwo`] row.
    pub fn integer(&self, value: i64) -> Result<i64, String> {
        match self.range {
            Range::Integer { min, max } if (min..=max).contains(&value) => Ok(value),
            Range::Integer { min, max } => Err(format!("{value} is not between {min} and {max}")),
            Range::PowerOfTwo { min, max }
                if (min..=max).contains(&value) && value.count_ones() == 1 =>
            {
                Ok(value)
            }
            Range::PowerOfTwo { min, max } => Err(format!(
                "{value} is not a power of two between {min} and {max}"
            )),
            Range::Seconds { .. } | Range::Fraction => {
                unreachable!("{} is not a whole number", self.key)
            }
        }
    }

    /// A duration within a [`Range::Seconds`] row.
    pub fn seconds(&self, value: f64) -> Result<Duration, String> {
        let Range::Seconds { min, max } = self.range else {
            unreachable!("{} is not in seconds", self.key)
        };
        if value.is_finite() && value > 0.0 && value >= min && value <= max {
            Ok(Duration::from_secs_f64(value))
        } else if min > 0.0 {
            Err(format!(
                "{value} is not a number of seconds between {min} and {max}"
            ))
        } else {
            Err(format!(
                "{value} is not a positive number of seconds (at most {max})"
            ))
        }
    }

    /// A fraction within a [`Range::Fraction`] row.
    pub fn fraction(&self, value: f64) -> Result<f64, String> {
        let Range::Fraction = self.range else {
            unreachable!("{} is not a fraction", self.key)
        };
        if (0.0..1.0).contains(&value) {
            Ok(value)
        } else {
            Err(format!("{value} is not in [0, 1)"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::config::{
        settings::{MeshSettings, Target},
        Settings,
    };

    #[test]
    fn rows_are_well_formed() {
        for limit in LIMITS {
            match limit.range {
                Range::Integer { min, max } => assert!(min <= max, "{limit:?}"),
                Range::PowerOfTwo { min, max } => {
                    assert!(min <= max && min.count_ones() == 1 && max.count_ones() == 1)
                }
                Range::Seconds { min, max } => assert!(0.0 <= min && min < max, "{limit:?}"),
                Range::Fraction => {}
            }
            if let Some(flag) = limit.flag {
                assert!(flag.starts_with("--"), "{limit:?}");
            }
        }
        let keys: std::collections::HashSet<_> = LIMITS.iter().map(|l| l.file_key(None)).collect();
        assert_eq!(keys.len(), LIMITS.len(), "one row per key");
    }

    /// The defaults are within their own limits.
    #[test]
    fn defaults_are_within_the_limits() {
        let s = Settings::default();
        let t = Target::defaults(String::new(), s.listen);
        let m = MeshSettings::default();
        for (limit, value) in [
            (RING_BUFFER_BYTES, i64::from(s.ring_buffer_bytes)),
            (MAX_TRACKED_QPS, s.limits.max_tracked_qps as i64),
            (MAX_DEVICE_LABELS, s.limits.max_device_labels as i64),
            (MAX_PROCESS_LABELS, s.limits.max_process_labels as i64),
            (MAX_PEER_LABELS, s.limits.max_peer_labels as i64),
            (MAX_CGROUP_LABELS, s.limits.max_cgroup_labels as i64),
            (TARGET_PINGS, i64::from(t.pings)),
            (TARGET_MESSAGE_SIZE, t.message_size as i64),
            (MESH_MAX_TARGETS, m.max_targets as i64),
            (MESH_DISCOVER_MAX_TARGETS, m.discover_max_targets as i64),
            (HTTP_MAX_CONNECTIONS, s.http.max_connections as i64),
            (
                HTTP_MAX_CONNECTIONS_PER_SOURCE,
                s.http.max_connections_per_source as i64,
            ),
            (HTTP_MAX_HEADER_BYTES, s.http.max_header_bytes as i64),
            (
                RESPONDER_MAX_CONNECTIONS,
                s.responder.max_connections as i64,
            ),
            (RESPONDER_MAX_PER_SOURCE, s.responder.max_per_source as i64),
            (MESH_ANSWER_RATE, m.answer_rate_per_source as i64),
        ] {
            assert_eq!(limit.integer(value), Ok(value), "{limit:?}");
        }
        for (limit, value) in [
            (MODULE_POLL_INTERVAL, s.module_poll_interval),
            (SYSFS_COUNTERS_INTERVAL, s.sysfs_counters_interval),
            (TARGET_INTERVAL, t.interval),
            (TARGET_TIMEOUT, t.timeout),
            (MESH_INTERVAL, m.interval),
            (MESH_DISCOVER_EXPIRY, m.discover_expiry),
            (MESH_TIMEOUT, m.timeout),
            (MESH_TARGETS_FILE_CHECK, m.targets_file_check),
            (HTTP_HEADER_TIMEOUT, s.http.header_timeout),
            (HTTP_IDLE_TIMEOUT, s.http.idle_timeout),
            (HTTP_TLS_HANDSHAKE_TIMEOUT, s.http.tls_handshake_timeout),
            (RESPONDER_IDLE_TIMEOUT, s.responder.idle_timeout),
        ] {
            assert_eq!(limit.seconds(value.as_secs_f64()), Ok(value), "{limit:?}");
        }
        assert_eq!(TARGET_JITTER.fraction(t.jitter), Ok(t.jitter));
    }

    #[test]
    fn messages_name_the_value_and_the_range() {
        assert_eq!(
            RING_BUFFER_BYTES.integer(5000),
            Err("5000 is not a power of two between 4096 and 1073741824".into())
        );
        assert_eq!(
            RING_BUFFER_BYTES.integer(-4096),
            Err("-4096 is not a power of two between 4096 and 1073741824".into())
        );
        assert_eq!(RING_BUFFER_BYTES.integer(1 << 30), Ok(1 << 30));
        assert_eq!(
            MAX_TRACKED_QPS.integer(0),
            Err("0 is not between 1 and 16777216".into())
        );
        assert_eq!(
            TARGET_MESSAGE_SIZE.integer(8),
            Err("8 is not between 16 and 4096".into())
        );
        assert_eq!(
            TARGET_INTERVAL.seconds(f64::NAN),
            Err("NaN is not a positive number of seconds (at most 86400)".into())
        );
        assert_eq!(
            MESH_INTERVAL.seconds(0.001),
            Err("0.001 is not a number of seconds between 0.01 and 3600".into())
        );
        assert!(MESH_INTERVAL.seconds(0.1).is_ok());
        assert_eq!(
            TARGET_JITTER.fraction(1.0),
            Err("1 is not in [0, 1)".into())
        );
    }
}
