//! A family of series by label values.

use std::{
    collections::{hash_map, HashMap},
    hash::{BuildHasherDefault, Hasher},
    sync::{Arc, PoisonError, RwLock},
};

use fnv::FnvHasher;

use super::{
    metric::{Counter, Histogram, HistogramBounds, IntCounter, IntGauge},
    Collector, Desc, Error,
};
use crate::export::exposition::Kind;

/// One series of a family.
pub trait Series: Clone + Send + Sync + 'static {
    /// What every series of a family is made with (a histogram's bounds).
    type Options: Send + Sync + 'static;
    const KIND: Kind;
    fn create(options: &Self::Options) -> Self;
    /// Appends the series' lines; `labels` as
    /// [`crate::export::exposition::label_text`] writes them.
    fn write(&self, name: &str, labels: &str, out: &mut String);
}

pub type IntCounterVec = MetricVec<IntCounter>;
pub type CounterVec = MetricVec<Counter>;
pub type IntGaugeVec = MetricVec<IntGauge>;
pub type HistogramVec = MetricVec<Histogram>;

/// Series of one family by their label values, made on first use.
pub struct MetricVec<S: Series>(Arc<Family<S>>);

impl<S: Series> Clone for MetricVec<S> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

struct Family<S: Series> {
    desc: Desc,
    options: S::Options,
    /// The indexes of the labels in the order of their names, the order in
    /// which a line carries them and series are sorted.
    by_name: Box<[usize]>,
    series: RwLock<Table<S>>,
}

/// The series by the hash of their label values; the rare series whose
/// hash another one has beside them.
struct Table<S> {
    by_hash: HashMap<u64, Entry<S>, BuildHasherDefault<HashIsKey>>,
    collided: Vec<(u64, Entry<S>)>,
}

impl<S> Default for Table<S> {
    fn default() -> Self {
        Self {
            by_hash: HashMap::default(),
            collided: Vec::new(),
        }
    }
}

impl<S> Table<S> {
    fn find<V: AsRef<str>>(&self, hash: u64, values: &[V]) -> Option<&Entry<S>> {
        match self.by_hash.get(&hash) {
            Some(entry) if entry.is(values) => Some(entry),
            Some(_) => self
                .collided
                .iter()
                .find(|(h, e)| *h == hash && e.is(values))
                .map(|(_, e)| e),
            None => None,
        }
    }

    fn insert(&mut self, hash: u64, entry: Entry<S>) {
        match self.by_hash.entry(hash) {
            hash_map::Entry::Vacant(slot) => {
                slot.insert(entry);
            }
            hash_map::Entry::Occupied(_) => self.collided.push((hash, entry)),
        }
    }

    fn remove<V: AsRef<str>>(&mut self, hash: u64, values: &[V]) -> bool {
        match self.by_hash.get(&hash) {
            Some(entry) if entry.is(values) => {
                self.by_hash.remove(&hash);
                if let Some(at) = self.collided.iter().position(|(h, _)| *h == hash) {
                    let (_, moved) = self.collided.swap_remove(at);
                    self.by_hash.insert(hash, moved);
                }
                true
            }
            Some(_) => {
                let before = self.collided.len();
                self.collided.retain(|(h, e)| !(*h == hash && e.is(values)));
                self.collided.len() < before
            }
            None => false,
        }
    }

    fn entries(&self) -> impl Iterator<Item = &Entry<S>> {
        self.by_hash
            .values()
            .chain(self.collided.iter().map(|(_, e)| e))
    }
}

/// The keys are already hashes (FNV-1a of the label values).
#[derive(Default)]
struct HashIsKey(u64);

impl Hasher for HashIsKey {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

struct Entry<S> {
    /// The label values in the order of the family's labels, each as its
    /// length (4 bytes) and its bytes: one buffer to compare on a lookup.
    key: Box<[u8]>,
    /// The label values in the order of the labels' names, to sort by.
    by_name: Box<[Box<str>]>,
    /// `a="x",b="y"`
    text: Box<str>,
    series: S,
}

impl<S: Series<Options = ()>> MetricVec<S> {
    pub fn new(name: &str, help: &str, labels: &[&str]) -> Result<Self, Error> {
        Self::with_options(name, help, labels, ())
    }
}

impl MetricVec<Histogram> {
    pub fn histogram(
        name: &str,
        help: &str,
        labels: &[&str],
        bounds: &[f64],
    ) -> Result<Self, Error> {
        Self::with_options(name, help, labels, HistogramBounds::new(name, bounds)?)
    }
}

impl<S: Series> MetricVec<S> {
    pub fn with_options(
        name: &str,
        help: &str,
        labels: &[&str],
        options: S::Options,
    ) -> Result<Self, Error> {
        let desc = Desc::new(name, help, S::KIND, labels)?;
        let mut by_name: Vec<usize> = (0..labels.len()).collect();
        by_name.sort_by_key(|&i| labels[i]);
        Ok(Self(Arc::new(Family {
            desc,
            options,
            by_name: by_name.into(),
            series: RwLock::default(),
        })))
    }

    pub fn desc(&self) -> &Desc {
        &self.0.desc
    }

    /// The series of these label values (in the order of the family's
    /// labels). Panics if there are not as many values as labels.
    pub fn with_label_values<V: AsRef<str>>(&self, values: &[V]) -> S {
        let hash = self.hash(values);
        let family = &self.0;
        if let Some(entry) = family
            .series
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .find(hash, values)
        {
            return entry.series.clone();
        }
        let mut table = family
            .series
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = table.find(hash, values) {
            return entry.series.clone();
        }
        let entry = Entry::new(
            family.desc.labels(),
            &family.by_name,
            values,
            S::create(&family.options),
        );
        let made = entry.series.clone();
        table.insert(hash, entry);
        made
    }

    /// Removes the series of these label values; whether there was one.
    /// Panics if there are not as many values as labels.
    pub fn remove_label_values<V: AsRef<str>>(&self, values: &[V]) -> bool {
        let hash = self.hash(values);
        let mut table = self
            .0
            .series
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        table.remove(hash, values)
    }

    fn hash<V: AsRef<str>>(&self, values: &[V]) -> u64 {
        assert_eq!(
            values.len(),
            self.0.desc.labels().len(),
            "label values of {}",
            self.0.desc.name()
        );
        let mut h = FnvHasher::default();
        for v in values {
            h.write(v.as_ref().as_bytes());
            h.write_u8(0xff);
        }
        h.finish()
    }

    /// Appends the lines of every series, in the order of their label
    /// values (the labels taken in name order), as the crate's gather sorts
    /// them.
    pub fn write_samples(&self, out: &mut String) {
        let family = &self.0;
        let series = family.series.read().unwrap_or_else(PoisonError::into_inner);
        let mut entries: Vec<&Entry<S>> = series.entries().collect();
        entries.sort_unstable_by(|a, b| a.by_name.cmp(&b.by_name));
        for entry in entries {
            entry.series.write(family.desc.name(), &entry.text, out);
        }
    }
}

impl<S> Entry<S> {
    fn new<V: AsRef<str>>(labels: &[String], by_name: &[usize], values: &[V], series: S) -> Self {
        Self {
            key: values
                .iter()
                .flat_map(|v| {
                    let v = v.as_ref().as_bytes();
                    let len = u32::try_from(v.len()).expect("a label value under 4 GiB");
                    len.to_le_bytes().into_iter().chain(v.iter().copied())
                })
                .collect(),
            by_name: by_name.iter().map(|&i| values[i].as_ref().into()).collect(),
            text: crate::export::exposition::label_text(
                by_name
                    .iter()
                    .map(|&i| (labels[i].as_str(), values[i].as_ref())),
            ),
            series,
        }
    }

    fn is<V: AsRef<str>>(&self, values: &[V]) -> bool {
        let mut rest = &self.key[..];
        for v in values {
            let v = v.as_ref().as_bytes();
            let Some((len, tail)) = rest.split_first_chunk::<4>() else {
                return false;
            };
            if u32::from_le_bytes(*len) as usize != v.len() || !tail.starts_with(v) {
                return false;
            }
            rest = &tail[v.len()..];
        }
        rest.is_empty()
    }
}

impl<S: Series> Collector for MetricVec<S> {
    fn descs(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self, out: &mut [String]) {
        self.write_samples(&mut out[0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Series whose label values hash alike: each found, removed and
    /// exposed as itself.
    #[test]
    fn series_with_one_hash_stay_apart() {
        let labels = ["a".to_owned(), "b".to_owned()];
        let mut table = Table::default();
        let values = [["x", ""], ["", "x"], ["xy", "z"]];
        for (n, v) in values.iter().enumerate() {
            assert!(table.find(7, v).is_none());
            table.insert(7, Entry::new(&labels, &[0, 1], v, n));
        }
        for (n, v) in values.iter().enumerate() {
            assert_eq!(table.find(7, v).map(|e| e.series), Some(n), "{v:?}");
        }
        assert!(table.find(7, &["x", "y"]).is_none());
        assert!(table.find(8, &["x", ""]).is_none());
        assert_eq!(table.entries().count(), 3);
        assert!(table.remove(7, &["x", ""]));
        assert!(!table.remove(7, &["x", ""]));
        assert_eq!(table.find(7, &["", "x"]).map(|e| e.series), Some(1));
        assert_eq!(table.find(7, &["xy", "z"]).map(|e| e.series), Some(2));
        assert!(table.remove(7, &["xy", "z"]));
        assert_eq!(
            table.find(7, &["", "x"]).map(|e| &*e.text),
            Some(r#"a="",b="x""#)
        );
        assert!(table.remove(7, &["", "x"]));
        assert_eq!(table.entries().count(), 0);
    }
}
