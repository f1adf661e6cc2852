//! Configuration errors: one line naming where (file position or the
//! command line), the key or flag, and what is wrong.

use std::{fmt, path::PathBuf};

use thiserror::Error;

/// Where an error is: a file position or a flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    File {
        path: PathBuf,
        line: usize,
        column: usize,
    },
    FileOnly(PathBuf),
    Flag,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, line, column } => write!(f, "{}:{line}:{column}", path.display()),
            Origin::FileOnly(path) => write!(f, "{}", path.display()),
            Origin::Flag => f.write_str("command line"),
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{origin}: {key}: {message}")]
pub struct ConfigError {
    pub origin: Origin,
    /// The key, e.g. `targets[1].interval_seconds`, or `--flag`.
    pub key: String,
    pub message: String,
}
