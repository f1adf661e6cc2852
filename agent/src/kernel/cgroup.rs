//! Cgroup v2 paths for the ids the QP create hooks record
//! (`bpf_get_current_cgroup_id()`: the cgroup's kernfs node id, which is its
//! directory's inode number on 64-bit kernels, `kernfs_id_ino()` in
//! include/linux/kernfs.h). Linux has no id-to-path call short of
//! `open_by_handle_at` (CAP_DAC_READ_SEARCH), so the hierarchy is walked on
//! an unknown id, at most every [`MIN_WALK_INTERVAL`].

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use fnv::FnvHashMap;

use crate::model::cgroups::CgroupNames;

/// Walks of the hierarchy are at least this far apart: an id the last walk
/// did not find (a cgroup gone before its QP's event was read) does not
/// cost a walk per QP.
pub const MIN_WALK_INTERVAL: Duration = Duration::from_secs(1);

/// Cgroups a walk records at most (a bound on memory and walk time).
const MAX_CGROUPS: usize = 65_536;

pub struct CgroupPaths {
    root: Option<PathBuf>,
    paths: FnvHashMap<u64, Arc<str>>,
    last_walk: Option<Instant>,
}

impl CgroupPaths {
    /// The cgroup v2 hierarchy this process sees (the first `cgroup2` mount
    /// in /proc/self/mountinfo: /sys/fs/cgroup, or /sys/fs/cgroup/unified on
    /// hybrid hosts); without one no id is named.
    pub fn from_mounts() -> Self {
        let root = fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|info| cgroup2_mount(&info));
        Self::at(root)
    }

    pub fn at(root: Option<PathBuf>) -> Self {
        Self {
            root,
            paths: FnvHashMap::default(),
            last_walk: None,
        }
    }

    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    fn walk(&mut self) {
        self.last_walk = Some(Instant::now());
        self.paths.clear();
        let Some(root) = self.root.clone() else {
            return;
        };
        let mut stack = vec![(root, String::from("/"))];
        while let Some((dir, path)) = stack.pop() {
            let Ok(meta) = fs::metadata(&dir) else {
                continue;
            };
            self.paths.insert(meta.ino(), Arc::from(path.as_str()));
            if self.paths.len() >= MAX_CGROUPS {
                return;
            }
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.filter_map(Result::ok) {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                let child = if path == "/" {
                    format!("/{name}")
                } else {
                    format!("{path}/{name}")
                };
                stack.push((entry.path(), child));
            }
        }
    }
}

impl CgroupNames for CgroupPaths {
    fn path(&mut self, id: u64) -> Option<Arc<str>> {
        if let Some(path) = self.paths.get(&id) {
            return Some(Arc::clone(path));
        }
        if self
            .last_walk
            .is_some_and(|at| at.elapsed() < MIN_WALK_INTERVAL)
        {
            return None;
        }
        self.walk();
        self.paths.get(&id).cloned()
    }
}

/// The mount point of the first cgroup2 file system in a mountinfo text
/// (proc(5): the fifth field is the mount point, the file system type follows
/// the ` - ` separator).
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount() {
        let info = "\
22 27 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
25 22 0:23 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw
27 25 0:25 / /sys/fs/cgroup/systemd rw shared:11 - cgroup cgroup rw,name=systemd
";
        assert_eq!(
            cgroup2_mount(info),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(cgroup2_mount("30 1 0:26 / /proc rw - proc proc rw\n"), None);
    }

    #[test]
    fn names_directories_by_inode_and_walks_again_for_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("system.slice/a.service")).unwrap();
        fs::write(root.join("cgroup.procs"), "").unwrap();
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        let mut paths = CgroupPaths::at(Some(root.to_path_buf()));
        assert_eq!(paths.path(ino(root)).as_deref(), Some("/"));
        assert_eq!(
            paths
                .path(ino(&root.join("system.slice/a.service")))
                .as_deref(),
            Some("/system.slice/a.service")
        );
        // files are not cgroups
        assert_eq!(paths.path(ino(&root.join("cgroup.procs"))), None);
        // a new cgroup: found once the walk interval is over
        fs::create_dir(root.join("b")).unwrap();
        paths.last_walk = Some(Instant::now() - MIN_WALK_INTERVAL);
        assert_eq!(paths.path(ino(&root.join("b"))).as_deref(), Some("/b"));
        assert_eq!(CgroupPaths::at(None).path(1), None);
    }
}
