//! Running as a service: configuration, the daemon loop, systemd, install,
//! logging.

pub mod config;
pub mod daemon;
pub mod install;
pub mod logging;
pub mod systemd;
