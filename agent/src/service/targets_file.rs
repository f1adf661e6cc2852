//! The mesh's targets file: Prometheus' file_sd format, JSON (`.json`) or
//! YAML (`.yml`, `.yaml`), a list of `{targets: [IP[:PORT], ...], labels:
//! {...}}`. It is read whole, at most [`MAX_TARGETS_FILE_BYTES`], and
//! watched by its identity (device, inode, size, mtime): writing a new file
//! and renaming it into place, as file_sd writers do, is one change.
//!
//! A bad or missing file is an error that the caller reports; the caller
//! keeps the last good list.

use std::{
    collections::{BTreeMap, HashSet},
    fs,
    io::Read,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::file_id::FileId;

/// The most that is read of a targets file: 100,000 targets of 40 bytes
/// each with their labels fit; `/dev/zero` does not.
pub const MAX_TARGETS_FILE_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

impl Format {
    /// The format told by the path's extension.
    pub fn of(path: &Path) -> Option<Format> {
        let extension = path.extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "json" => Some(Format::Json),
            "yml" | "yaml" => Some(Format::Yaml),
            _ => None,
        }
    }
}

/// One target of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileTarget {
    /// The entry as written: the `target` label.
    pub name: String,
    /// The peer's UD responder (port 9723 when not written).
    pub address: SocketAddr,
    /// The group's labels, those starting with `__` left out.
    pub labels: BTreeMap<String, String>,
}

/// The file's targets, in the file's order, each address once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetsList {
    pub targets: Vec<FileTarget>,
    /// Entries left out because an earlier one has the same address.
    pub duplicates: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Group {
    targets: Vec<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// Parses a targets file's text (`path` names it in errors).
pub fn parse(path: &Path, format: Format, text: &str) -> Result<TargetsList, String> {
    let at = path.display();
    if text.trim().is_empty() {
        return Err(format!(
            "{at}: empty (an empty list is `[]`; kept the last good list)"
        ));
    }
    let groups: Vec<Group> = match format {
        Format::Json => serde_json::from_str(text).map_err(|e| {
            format!(
                "{at}:{}:{}: {} (expected a list of {{\"targets\": [...], \"labels\": {{...}}}})",
                e.line(),
                e.column().max(1),
                strip_position(&e.to_string())
            )
        })?,
        Format::Yaml => serde_yaml::from_str(text).map_err(|e| {
            let position = e
                .location()
                .map_or_else(String::new, |l| format!(":{}:{}", l.line(), l.column()));
            format!(
                "{at}{position}: {} (expected a list of {{targets: [...], labels: {{...}}}})",
                strip_position(&e.to_string())
            )
        })?,
    };
    let mut list = TargetsList::default();
    let mut addresses = HashSet::new();
    for (g, group) in groups.iter().enumerate() {
        let labels: BTreeMap<String, String> = group
            .labels
            .iter()
            .filter(|(name, _)| !name.starts_with("__"))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        for (t, entry) in group.targets.iter().enumerate() {
            let address = rdma_probe::parse_target(entry)
                .map_err(|e| format!("{at}: [{g}].targets[{t}]: {e}"))?;
            if !addresses.insert(address) {
                list.duplicates.push(entry.clone());
                continue;
            }
            list.targets.push(FileTarget {
                name: entry.clone(),
                address,
                labels: labels.clone(),
            });
        }
    }
    Ok(list)
}

/// serde_json and serde_yaml end their messages with the position, which
/// the caller puts first.
fn strip_position(message: &str) -> &str {
    message
        .rsplit_once(" at line ")
        .map_or(message, |(message, _)| message)
}

/// What a check of the file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// Same file as at the last check.
    Unchanged,
    Loaded(TargetsList),
    /// `repeated`: the same error as the last one (log it once).
    Failed {
        error: String,
        repeated: bool,
    },
}

/// Re-reads the file when its identity changes.
#[derive(Debug)]
pub struct TargetsFileWatcher {
    path: PathBuf,
    format: Format,
    /// The file (or the error) seen at the last check.
    seen: Option<Result<FileId, String>>,
    last_error: Option<String>,
}

impl TargetsFileWatcher {
    /// `None` when the path's extension names no format (the configuration
    /// refuses those).
    pub fn new(path: PathBuf) -> Option<Self> {
        Some(Self {
            format: Format::of(&path)?,
            path,
            seen: None,
            last_error: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file if it changed since the last check.
    pub fn check(&mut self) -> Reload {
        let now = fs::metadata(&self.path)
            .map(|m| FileId::of(&m))
            .map_err(|e| format!("{}: cannot read: {e}", self.path.display()));
        if self.seen.as_ref() == Some(&now) {
            return Reload::Unchanged;
        }
        let read = now.and_then(|_| self.read());
        let (id, result) = match read {
            Ok((id, text)) => (Ok(id), parse(&self.path, self.format, &text)),
            Err(error) => (Err(error.clone()), Err(error)),
        };
        self.seen = Some(id);
        match result {
            Ok(list) => {
                self.last_error = None;
                Reload::Loaded(list)
            }
            Err(error) => {
                let repeated = self.last_error.as_ref() == Some(&error);
                self.last_error = Some(error.clone());
                Reload::Failed { error, repeated }
            }
        }
    }

    /// The file's text, and the identity of what was read.
    fn read(&self) -> Result<(FileId, String), String> {
        let error = |e: String| format!("{}: {e}", self.path.display());
        let file = fs::File::open(&self.path).map_err(|e| error(format!("cannot read: {e}")))?;
        let id = FileId::of(
            &file
                .metadata()
                .map_err(|e| error(format!("cannot read: {e}")))?,
        );
        let mut bytes = Vec::new();
        file.take(MAX_TARGETS_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| error(format!("cannot read: {e}")))?;
        if bytes.len() as u64 > MAX_TARGETS_FILE_BYTES {
            return Err(error(format!(
                "larger than {} MiB",
                MAX_TARGETS_FILE_BYTES >> 20
            )));
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            error(format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        Ok((id, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Result<TargetsList, String> {
        parse(Path::new("/t.json"), Format::Json, text)
    }

    fn yaml(text: &str) -> Result<TargetsList, String> {
        parse(Path::new("/t.yml"), Format::Yaml, text)
    }

    fn names(list: &TargetsList) -> Vec<&str> {
        list.targets.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn json_groups_with_labels() {
        let list = json(
            r#"[
              {"targets": ["198.18.0.2", "198.18.0.3:7000"], "labels": {"rack": "r1", "__meta_x": "y"}},
              {"targets": ["[fe80::1]:9723"]}
            ]"#,
        )
        .unwrap();
        assert_eq!(
            names(&list),
            ["198.18.0.2", "198.18.0.3:7000", "[fe80::1]:9723"]
        );
        assert_eq!(list.targets[0].address, "198.18.0.2:9723".parse().unwrap());
        assert_eq!(list.targets[1].address, "198.18.0.3:7000".parse().unwrap());
        assert_eq!(
            list.targets[0].labels,
            BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
            "__ labels are left out"
        );
        assert!(list.targets[2].labels.is_empty());
    }

    #[test]
    fn yaml_is_the_same_list() {
        let list = yaml(
            "- targets: ['198.18.0.2', 198.18.0.3:7000]\n  labels:\n    rack: r1\n- targets:\n  - '[fe80::1]:9723'\n",
        )
        .unwrap();
        let from_json = json(
            r#"[{"targets": ["198.18.0.2", "198.18.0.3:7000"], "labels": {"rack": "r1"}},
                {"targets": ["[fe80::1]:9723"]}]"#,
        )
        .unwrap();
        assert_eq!(list, from_json);
    }

    #[test]
    fn duplicates_keep_the_first() {
        let list = json(
            r#"[{"targets": ["198.18.0.2", "198.18.0.2:9723"], "labels": {"rack": "a"}},
                {"targets": ["198.18.0.2"], "labels": {"rack": "b"}}]"#,
        )
        .unwrap();
        assert_eq!(names(&list), ["198.18.0.2"]);
        assert_eq!(list.targets[0].labels["rack"], "a");
        assert_eq!(list.duplicates, ["198.18.0.2:9723", "198.18.0.2"]);
    }

    #[test]
    fn empty_list_is_no_targets_empty_file_is_an_error() {
        assert_eq!(json("[]").unwrap(), TargetsList::default());
        assert_eq!(yaml("[]").unwrap(), TargetsList::default());
        assert!(json("").unwrap_err().contains("empty"));
        assert!(yaml("\n").unwrap_err().contains("empty"));
    }

    #[test]
    fn errors_name_the_file_and_the_entry() {
        for (result, expected) in [
            (
                json(r#"[{"targets": ["198.18.0.2"]}, {"targets": ["node1:9723"]}]"#),
                "/t.json: [1].targets[0]: invalid address \"node1:9723\": not an IP address (host names are not resolved)",
            ),
            (
                yaml("- targets: [198.18.0.2:0]"),
                "/t.yml: [0].targets[0]: invalid address \"198.18.0.2:0\": port 0 is not a destination",
            ),
            (
                json(r#"{"targets": ["198.18.0.2"]}"#),
                "/t.json:1:1: invalid type: map, expected a sequence",
            ),
            (yaml("targets: [198.18.0.2]"), "/t.yml:1:1: invalid type: map, expected a sequence"),
            (json(r#"[{"labels": {}}]"#), "/t.json:1:15: missing field `targets`"),
            (
                json(r#"[{"targets": ["198.18.0.2"], "labels": {"rack": 1}}]"#),
                "/t.json:1:49: invalid type: integer `1`, expected a string",
            ),
            (json("[{"), "/t.json:1:2: EOF while parsing"),
        ] {
            let error = result.unwrap_err();
            assert!(error.starts_with(expected), "got {error}\nexpected {expected}…");
            assert!(!error.contains('\n'), "{error:?}");
        }
    }

    #[test]
    fn watcher_reloads_on_change_and_reports_errors_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("targets.json");
        let mut watcher = TargetsFileWatcher::new(path.clone()).unwrap();
        let Reload::Failed { error, repeated } = watcher.check() else {
            panic!("missing file")
        };
        assert!(error.contains("cannot read"), "{error}");
        assert!(!repeated);
        assert_eq!(watcher.check(), Reload::Unchanged, "still missing");

        // written elsewhere and renamed into place
        let write = |text: &str| {
            let tmp = dir.path().join("tmp");
            fs::write(&tmp, text).unwrap();
            fs::rename(&tmp, &path).unwrap();
        };
        write(r#"[{"targets": ["198.18.0.2"]}]"#);
        let Reload::Loaded(list) = watcher.check() else {
            panic!("loaded")
        };
        assert_eq!(names(&list), ["198.18.0.2"]);
        assert_eq!(watcher.check(), Reload::Unchanged);

        write("[{");
        assert!(matches!(
            watcher.check(),
            Reload::Failed {
                repeated: false,
                ..
            }
        ));
        write("[{ ");
        assert!(
            matches!(
                watcher.check(),
                Reload::Failed {
                    repeated: false,
                    ..
                }
            ),
            "another position, another error"
        );
        write("[{ ");
        assert!(matches!(
            watcher.check(),
            Reload::Failed { repeated: true, .. }
        ));

        write(r#"[{"targets": ["198.18.0.3"]}]"#);
        assert!(matches!(watcher.check(), Reload::Loaded(l) if names(&l) == ["198.18.0.3"]));
    }

    #[test]
    fn reads_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.json");
        let file = fs::File::create(&path).unwrap();
        file.set_len(MAX_TARGETS_FILE_BYTES + 1).unwrap();
        let mut watcher = TargetsFileWatcher::new(path).unwrap();
        assert!(
            matches!(watcher.check(), Reload::Failed { error, .. } if error.ends_with("larger than 16 MiB"))
        );
    }

    #[test]
    fn formats_by_extension() {
        assert_eq!(Format::of(Path::new("a.json")), Some(Format::Json));
        assert_eq!(Format::of(Path::new("a.YML")), Some(Format::Yaml));
        assert_eq!(Format::of(Path::new("a.yaml")), Some(Format::Yaml));
        assert_eq!(Format::of(Path::new("a.toml")), None);
        assert_eq!(Format::of(Path::new("json")), None);
    }
}
