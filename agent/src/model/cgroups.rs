//! The creating task's cgroup as a bounded label: the first
//! `max_cgroup_labels` cgroup paths keep their path, later ones are
//! `"other"`; an id that cannot be named (the cgroup is gone already, or no
//! cgroup v2 hierarchy is mounted) is `"unknown"`.

use std::sync::Arc;

use fnv::FnvHashMap;

use super::qp::Label;

pub const UNKNOWN: &str = "unknown";

/// Names a cgroup v2 id, as `bpf_get_current_cgroup_id()` gives it (the
/// agent's: `kernel::cgroup::CgroupPaths`).
pub trait CgroupNames: Send {
    /// The cgroup's path from the hierarchy's root (`/` for the root).
    fn path(&mut self, id: u64) -> Option<Arc<str>>;
}

pub struct CgroupLabels {
    names: Option<Box<dyn CgroupNames>>,
    by_path: FnvHashMap<Arc<str>, Label>,
    cap: usize,
    other: Label,
    unknown: Label,
}

impl CgroupLabels {
    pub fn new(cap: usize, other: Label) -> Self {
        Self {
            names: None,
            by_path: FnvHashMap::default(),
            cap,
            other,
            unknown: Arc::from(UNKNOWN),
        }
    }

    pub fn set_names(&mut self, names: Box<dyn CgroupNames>) {
        self.names = Some(names);
    }

    /// The cgroup's full path, if it can be named.
    pub fn path(&mut self, id: u64) -> Option<Arc<str>> {
        self.names.as_mut()?.path(id)
    }

    /// The label for a cgroup id, and whether it was capped to `"other"`.
    pub fn label(&mut self, id: u64) -> (Label, bool) {
        let Some(path) = self.path(id) else {
            return (Arc::clone(&self.unknown), false);
        };
        if let Some(label) = self.by_path.get(&path) {
            return (Arc::clone(label), false);
        }
        if self.by_path.len() >= self.cap {
            return (Arc::clone(&self.other), true);
        }
        self.by_path.insert(Arc::clone(&path), Arc::clone(&path));
        (path, false)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Names from a fixed table.
    pub(crate) struct Table(pub Vec<(u64, &'static str)>);

    impl CgroupNames for Table {
        fn path(&mut self, id: u64) -> Option<Arc<str>> {
            self.0
                .iter()
                .find(|(i, _)| *i == id)
                .map(|(_, p)| Arc::from(*p))
        }
    }

    #[test]
    fn paths_up_to_the_cap_then_other_and_unknown_ids() {
        let mut labels = CgroupLabels::new(2, Arc::from("other"));
        assert_eq!(&*labels.label(7).0, UNKNOWN, "no names at all");
        labels.set_names(Box::new(Table(vec![
            (1, "/"),
            (7, "/system.slice/a.service"),
            (8, "/system.slice/a.service"),
            (9, "/b"),
        ])));
        assert_eq!(labels.label(1), (Arc::from("/"), false));
        assert_eq!(
            labels.label(7),
            (Arc::from("/system.slice/a.service"), false)
        );
        // the same path again (the cgroup made anew: another id) is no new value
        assert_eq!(
            labels.label(8),
            (Arc::from("/system.slice/a.service"), false)
        );
        assert_eq!(labels.label(9), (Arc::from("other"), true));
        assert_eq!(labels.label(1), (Arc::from("/"), false));
        assert_eq!(labels.label(42), (Arc::from(UNKNOWN), false));
        assert_eq!(
            labels.path(9).as_deref(),
            Some("/b"),
            "full paths stay nameable"
        );
    }
}
