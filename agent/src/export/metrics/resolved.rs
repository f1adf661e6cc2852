//! Series of a family looked up once, then used directly: `with_label_values`
//! hashes every label value and takes the family's lock at each call.

use std::sync::OnceLock;

/// One series per slot, made on first use: a family shows only the label
/// values observed, as with `with_label_values`. For families that never
/// drop a series.
pub(super) struct Resolved<T, const N: usize>([OnceLock<T>; N]);

impl<T, const N: usize> Resolved<T, N> {
    pub(super) fn new() -> Self {
        Self(std::array::from_fn(|_| OnceLock::new()))
    }

    pub(super) fn get(&self, slot: usize, make: impl FnOnce() -> T) -> &T {
        self.0[slot].get_or_init(make)
    }
}
