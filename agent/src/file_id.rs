//! What identifies one version of a file, for the watchers that reload a
//! file when it changes (the mesh targets file, the web configuration).

use std::{fs, os::unix::fs::MetadataExt, path::Path};

/// A file's device, inode, size and modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileId {
    pub fn of(meta: &fs::Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }

    /// Follows symbolic links; `None` if the file cannot be read.
    pub fn of_path(path: &Path) -> Option<FileId> {
        fs::metadata(path).ok().map(|m| FileId::of(&m))
    }
}
