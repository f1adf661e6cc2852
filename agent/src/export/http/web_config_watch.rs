//! Renewed certificates taken without a SIGHUP: the web configuration file
//! and the PEM files it names are looked at every [`CHECK_INTERVAL`], and a
//! change (modification time, size, inode or device) that has held still
//! for one whole interval reloads them, as SIGHUP does. Waiting for the
//! files to hold still keeps a renewal written file by file (the
//! certificate, then its key) from being read half done; a reload that
//! fails all the same is not tried again until the files change again.

use std::{path::PathBuf, time::Duration};

use crate::file_id::FileId;

/// How often the files are looked at.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// The stamps of a set of files, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamps(Vec<(PathBuf, Option<FileId>)>);

impl FileStamps {
    pub fn of(files: &[PathBuf]) -> Self {
        // symbolic links followed: a directory of links swapped at once (as
        // Kubernetes mounts a secret) shows as the files they point to
        Self(
            files
                .iter()
                .map(|f| (f.clone(), FileId::of_path(f)))
                .collect(),
        )
    }
}

/// Decides when the files in force have changed for good.
#[derive(Debug)]
pub struct WebConfigWatch {
    /// The files as they were when last read (at start-up, a SIGHUP or a
    /// reload of ours), successfully or not.
    read: FileStamps,
    /// A change seen at the last look, waiting to hold still.
    changing: Option<FileStamps>,
}

impl WebConfigWatch {
    /// `files`: those of the configuration just read ([`super::web_config::WebConfig::files`]).
    pub fn new(files: &[PathBuf]) -> Self {
        Self {
            read: FileStamps::of(files),
            changing: None,
        }
    }

    /// The files were read again (SIGHUP, or after [`Self::look`] said so);
    /// `files`: those of the configuration in force afterwards.
    pub fn read_again(&mut self, files: &[PathBuf]) {
        *self = Self::new(files);
    }

    /// One look at `files` (those of the configuration in force): whether
    /// to read them again now.
    pub fn look(&mut self, files: &[PathBuf]) -> bool {
        self.look_at(FileStamps::of(files))
    }

    fn look_at(&mut self, now: FileStamps) -> bool {
        if now == self.read {
            self.changing = None;
            return false;
        }
        if self.changing.as_ref() == Some(&now) {
            return true;
        }
        self.changing = Some(now);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn write(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn a_change_reloads_once_it_has_held_still_for_one_look() {
        let dir = tempfile::tempdir().unwrap();
        let (web, cert) = (dir.path().join("web.yml"), dir.path().join("agent.crt"));
        write(&web, "tls_server_config: {}\n");
        write(&cert, "first");
        let files = vec![web.clone(), cert.clone()];
        let mut watch = WebConfigWatch::new(&files);
        assert!(!watch.look(&files), "nothing changed");
        write(&cert, "renewed, longer");
        assert!(!watch.look(&files), "changed at this look: wait one more");
        assert!(watch.look(&files), "held still since the last look");
        watch.read_again(&files);
        assert!(!watch.look(&files), "read again: nothing new");
    }

    #[test]
    fn a_file_still_being_written_waits() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("agent.crt"), dir.path().join("agent.key"));
        write(&cert, "cert 1");
        write(&key, "key 1");
        let files = vec![cert.clone(), key.clone()];
        let mut watch = WebConfigWatch::new(&files);
        write(&cert, "cert 2, renewed");
        assert!(!watch.look(&files));
        write(&key, "key 2, renewed");
        assert!(!watch.look(&files), "the key changed since the last look");
        assert!(watch.look(&files));
    }

    #[test]
    fn a_file_replaced_by_rename_or_removed_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("agent.crt");
        write(&cert, "same");
        let files = vec![cert.clone()];
        let mut watch = WebConfigWatch::new(&files);
        let next = dir.path().join("agent.crt.new");
        write(&next, "same");
        std::fs::rename(&next, &cert).unwrap();
        assert!(!watch.look(&files));
        assert!(watch.look(&files), "another inode, same size");
        watch.read_again(&files);
        std::fs::remove_file(&cert).unwrap();
        assert!(!watch.look(&files));
        assert!(watch.look(&files), "gone: read again, and fail");
        watch.read_again(&files);
        assert!(!watch.look(&files), "a failed read is not tried again");
        assert!(!watch.look(&files));
    }

    #[test]
    fn a_change_undone_before_the_next_look_is_no_change() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("agent.crt");
        write(&cert, "first");
        let files = vec![cert.clone()];
        let before = FileStamps::of(&files);
        let mut watch = WebConfigWatch::new(&files);
        write(&cert, "other text");
        assert!(!watch.look(&files));
        assert!(!watch.look_at(before), "back as it was read");
        assert!(watch.changing.is_none());
    }
}
