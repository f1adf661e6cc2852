//! Histogram bucket layouts: the defaults and the configurable set.

/// Kernel call latencies (create, modify): 1 µs to 10 s in 1-2.5-5 steps.
pub const CALL_LATENCY_BUCKETS: &[f64] = &[
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Time spent in a state and time to RTS: 10 µs to 1 h.
pub const DWELL_BUCKETS: &[f64] = &[
    1e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// QP lifetime: 1 ms to 7 days.
pub const LIFETIME_BUCKETS: &[f64] = &[
    1e-3, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
    604800.0,
];

/// Probe round-trip times: 500 ns to 100 ms (soft-RoCE RTTs are tens of µs,
/// hardware RTTs a few µs).
pub const PROBE_RTT_BUCKETS: &[f64] = &[
    5e-7, 1e-6, 2e-6, 3e-6, 5e-6, 7.5e-6, 1e-5, 1.5e-5, 2e-5, 3e-5, 5e-5, 7.5e-5, 1e-4, 2e-4, 5e-4,
    1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1,
];

/// Host delays of a mesh probe (responder: probe polled to answer posted;
/// prober: probe posted to its send completion polled): 100 ns to 1 s, a
/// few µs on hardware, tens of µs on soft-RoCE, up to the probe timeout on a
/// starved host. Not configurable.
pub const PROBE_DELAY_BUCKETS: &[f64] = &[
    1e-7, 2.5e-7, 5e-7, 1e-6, 2e-6, 3e-6, 5e-6, 7.5e-6, 1e-5, 1.5e-5, 2e-5, 3e-5, 5e-5, 7.5e-5,
    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Userspace minus kernel duration of a probe QP's verb call: the syscall and
/// library overhead around the kernel function, normally a few µs. Not
/// configurable.
pub const PROBE_SKEW_BUCKETS: &[f64] = &[
    -1e-4, -1e-5, 0.0, 1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 1e-2,
];

/// Histogram bucket layouts, overridable from the config file.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    pub call_latency: Vec<f64>,
    pub dwell: Vec<f64>,
    pub lifetime: Vec<f64>,
    pub probe_rtt: Vec<f64>,
}

impl Default for Buckets {
    fn default() -> Self {
        Self {
            call_latency: CALL_LATENCY_BUCKETS.to_vec(),
            dwell: DWELL_BUCKETS.to_vec(),
            lifetime: LIFETIME_BUCKETS.to_vec(),
            probe_rtt: PROBE_RTT_BUCKETS.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_sorted_and_span_microseconds_to_seconds() {
        for b in [
            CALL_LATENCY_BUCKETS,
            DWELL_BUCKETS,
            LIFETIME_BUCKETS,
            PROBE_RTT_BUCKETS,
            PROBE_DELAY_BUCKETS,
            PROBE_SKEW_BUCKETS,
        ] {
            assert!(b.windows(2).all(|w| w[0] < w[1]));
        }
        assert_eq!(CALL_LATENCY_BUCKETS[0], 1e-6);
        assert_eq!(*CALL_LATENCY_BUCKETS.last().unwrap(), 10.0);
    }
}
