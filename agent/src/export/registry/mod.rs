//! The agent's metric storage and registry. A scrape writes each family's
//! lines straight into the exposition ([`crate::export::exposition`]): each
//! series keeps its label text formatted once, when it is made. The
//! prometheus crate's `Registry::gather()`, used before, copied every family's
//! name, help text and label pairs into protobuf structures at each scrape
//! and sorted them again: half of a scrape's time in the emulated guest
//! (bench/RESULTS.md, round 19). The output is byte for byte the crate's, in
//! its order: families by name, series by their label values (tests compare
//! the two).

mod metric;
#[cfg(test)]
mod tests;
mod vec;

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc, Mutex, PoisonError, RwLock,
};

pub use metric::{Counter, Gauge, Histogram, HistogramBounds, IntCounter, IntGauge};
pub use vec::{CounterVec, HistogramVec, IntCounterVec, IntGaugeVec, MetricVec, Series};

use crate::export::exposition::{self, Kind};

/// A metric family's name, help text, type and label names, checked.
#[derive(Debug, Clone)]
pub struct Desc {
    name: String,
    help: String,
    kind: Kind,
    labels: Vec<String>,
}

impl Desc {
    pub fn new(name: &str, help: &str, kind: Kind, labels: &[&str]) -> Result<Self, Error> {
        if !valid_name(name, true) {
            return Err(Error::Name(name.to_owned()));
        }
        if help.is_empty() {
            return Err(Error::NoHelp(name.to_owned()));
        }
        for (i, label) in labels.iter().enumerate() {
            let reserved = label.starts_with("__") || (kind == Kind::Histogram && *label == "le");
            if !valid_name(label, false) || reserved || labels[..i].contains(label) {
                return Err(Error::Label {
                    family: name.to_owned(),
                    label: (*label).to_owned(),
                });
            }
        }
        Ok(Self {
            name: name.to_owned(),
            help: help.to_owned(),
            kind,
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn labels(&self) -> &[String] {
        &self.labels
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*` for a metric name, without `:` for a label's.
fn valid_name(name: &str, colons: bool) -> bool {
    let ok = |c: char, first: bool| {
        c.is_ascii_alphabetic()
            || c == '_'
            || (colons && c == ':')
            || (!first && c.is_ascii_digit())
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

/// Why a family could not be made or registered: programming errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid metric name {0:?}")]
    Name(String),
    #[error("metric {0} has no help text")]
    NoHelp(String),
    #[error("metric {family}: invalid or repeated label name {label:?}")]
    Label { family: String, label: String },
    #[error("metric {0}: bucket bounds must increase")]
    Buckets(String),
    #[error("metric {0} is already registered")]
    Duplicate(String),
}

/// What a registry exposes: one or more families.
pub trait Collector: Send + Sync {
    fn descs(&self) -> Vec<&Desc>;
    /// Appends the sample lines of each family of [`Collector::descs`] to
    /// `out[i]` (cleared before): a family left without lines is not
    /// exposed, as the crate leaves out a family without series.
    fn collect(&self, out: &mut [String]);
}

/// The collectors of one exposition. Clones share it; the collectors go with
/// the last clone.
#[derive(Clone, Default)]
pub struct Registry(Arc<Shared>);

#[derive(Default)]
struct Shared {
    /// Read by every render, renders at once included (as the crate's
    /// gather): a render that waits on the blocking pool must not hold up
    /// one on the event loop.
    families: RwLock<Families>,
    /// Each collector's line buffers, kept from one render to the next; a
    /// render that finds them taken uses new ones.
    spare: Mutex<Vec<Vec<String>>>,
    /// The last exposition's length, to size the next one's buffer.
    last_len: AtomicUsize,
}

#[derive(Default)]
struct Families {
    collectors: Vec<Registered>,
    /// (collector, family) in the order of the families' names
    order: Vec<(usize, usize)>,
}

struct Registered {
    collector: Box<dyn Collector>,
    names: Vec<String>,
    /// `# HELP` and `# TYPE` of each family, written once.
    headers: Vec<String>,
}

/// A family's lines whose buffer grew past this are not kept for the next
/// render (a large mesh's): the memory goes back between scrapes.
const KEPT_BUFFER_BYTES: usize = 64 * 1024;

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Fails if one of its families' names is taken.
    pub fn register(&self, collector: Box<dyn Collector>) -> Result<(), Error> {
        let mut families = self
            .0
            .families
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let descs = collector.descs();
        for (i, desc) in descs.iter().enumerate() {
            let taken = families
                .collectors
                .iter()
                .flat_map(|r| &r.names)
                .chain(descs[..i].iter().map(|d| &d.name))
                .any(|name| *name == desc.name);
            if taken {
                return Err(Error::Duplicate(desc.name.clone()));
            }
        }
        let names = descs.iter().map(|d| d.name.clone()).collect();
        let headers = descs
            .iter()
            .map(|d| exposition::header(&d.name, &d.help, d.kind))
            .collect();
        drop(descs);
        families.collectors.push(Registered {
            collector,
            names,
            headers,
        });
        let Families { collectors, order } = &mut *families;
        order.clear();
        for (c, registered) in collectors.iter().enumerate() {
            order.extend((0..registered.names.len()).map(|f| (c, f)));
        }
        order.sort_by(|&(c1, f1), &(c2, f2)| {
            collectors[c1].names[f1].cmp(&collectors[c2].names[f2])
        });
        Ok(())
    }

    /// The names of the registered families, in registration order.
    pub fn names(&self) -> Vec<String> {
        let families = self
            .0
            .families
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        families
            .collectors
            .iter()
            .flat_map(|r| r.names.iter().cloned())
            .collect()
    }

    /// The exposition of every registered family, in the text format.
    pub fn render(&self) -> String {
        let families = self
            .0
            .families
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut lines =
            std::mem::take(&mut *self.0.spare.lock().unwrap_or_else(PoisonError::into_inner));
        lines.resize_with(families.collectors.len(), Vec::new);
        for (registered, lines) in families.collectors.iter().zip(lines.iter_mut()) {
            lines.resize_with(registered.names.len(), String::new);
            lines.iter_mut().for_each(String::clear);
            registered.collector.collect(lines);
        }
        let mut out = String::with_capacity(self.0.last_len.load(Ordering::Relaxed) + 4096);
        for &(c, f) in &families.order {
            if !lines[c][f].is_empty() {
                out.push_str(&families.collectors[c].headers[f]);
                out.push_str(&lines[c][f]);
            }
        }
        drop(families);
        self.0.last_len.store(out.len(), Ordering::Relaxed);
        for buffer in lines.iter_mut().flatten() {
            if buffer.capacity() > KEPT_BUFFER_BYTES {
                *buffer = String::new();
            }
        }
        *self.0.spare.lock().unwrap_or_else(PoisonError::into_inner) = lines;
        out
    }
}
