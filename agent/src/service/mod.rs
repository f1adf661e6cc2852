//! Running as a service: configuration, the daemon loop, systemd, install,
//! man pages and completions, logging, the mesh's targets file, the host's
//! own addresses.

pub mod config;
pub mod daemon;
pub mod install;
pub mod local_addrs;
pub mod logging;
pub mod manual;
pub mod password;
pub mod systemd;
pub mod targets_file;
