//! serde helpers: durations are serialized as integer nanoseconds, QP
//! states as their labels.

use std::collections::BTreeMap;
use std::time::Duration;

use qpwatch_common::vocab::QpState;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::Serializer;

fn ns(d: &Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

pub fn duration_ns<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(ns(d))
}

pub fn opt_duration_ns<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&ns(d)),
        None => s.serialize_none(),
    }
}

pub fn durations_ns<S: Serializer>(v: &[Duration], s: S) -> Result<S::Ok, S::Error> {
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for d in v {
        seq.serialize_element(&ns(d))?;
    }
    seq.end()
}

pub fn duration_map_ns<K: serde::Serialize, S: Serializer>(
    m: &BTreeMap<K, Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(Some(m.len()))?;
    for (k, d) in m {
        map.serialize_entry(k, &ns(d))?;
    }
    map.end()
}

pub fn opt_qp_state<S: Serializer>(state: &Option<QpState>, s: S) -> Result<S::Ok, S::Error> {
    match state {
        Some(state) => s.serialize_some(state.label()),
        None => s.serialize_none(),
    }
}
