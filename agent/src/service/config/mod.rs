//! Configuration: a TOML file (`/etc/qpwatch/qpwatch.toml` by default) and
//! command-line flags for every key; flags win. Every error is one line that
//! names the key and, for the file, `path:line:column`.
//!
//! - `cli`: the command line (clap);
//! - `file`: the TOML file, read up to [`MAX_CONFIG_BYTES`];
//! - `apply`: the one way both become [`Settings`]: each value checked
//!   where it was given, the flags over the file;
//! - [`limits`]: the table of bounded numbers, for keys and flags alike;
//! - `rules`: the other checks of values, for keys and flags alike;
//! - `settings`: what the daemon runs with, and the defaults;
//! - `error`: one-line errors naming the key or flag.

use std::path::Path;

mod apply;
mod cli;
mod error;
mod file;
pub mod limits;
mod rules;
mod settings;

pub use apply::apply_flags;
pub use cli::{
    Cli, Command, InstallArgs, LogFormat, ProbeArgs, ProbeModeSetting, ResponderArgs, RunArgs,
};
pub use error::{ConfigError, Origin};
pub use file::{parse_file, read_file, MAX_CONFIG_BYTES};
pub use rules::{check_buckets, parse_target_address};
pub use settings::{MeshSettings, ResponderSettings, Settings, Target};

pub const DEFAULT_CONFIG: &str = "/etc/qpwatch/qpwatch.toml";
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9721";
pub const DEFAULT_RING_BUFFER_BYTES: u32 = 1 << 20;
pub const DEFAULT_PROBE_PORT: u16 = rdma_probe::DEFAULT_PORT;
/// The RC and UD responders' address in fleet mode, when not configured.
pub const DEFAULT_FLEET_LISTEN: &str = "0.0.0.0:9723";

/// Reads the file named by `--config` (it must exist) or the default one (if
/// it exists), then applies the flags.
pub fn load(args: &RunArgs) -> Result<Settings, ConfigError> {
    let base = match &args.config {
        Some(path) => parse_file(path, &read_file(path)?)?,
        None => {
            let path = Path::new(DEFAULT_CONFIG);
            if path.exists() {
                parse_file(path, &read_file(path)?)?
            } else {
                Settings::default()
            }
        }
    };
    apply_flags(base, args)
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;

    use clap::Parser;

    use super::{parse_file, Cli, ConfigError, Settings};

    pub fn parse(text: &str) -> Result<Settings, ConfigError> {
        parse_file(Path::new("/etc/qpwatch/qpwatch.toml"), text)
    }

    pub fn err(text: &str) -> String {
        parse(text).unwrap_err().to_string()
    }

    pub fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("qpwatch").chain(args.iter().copied()))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::service::config::test_support::cli;

    /// The default ports and why (README, "Ports"): not those of the
    /// exporters likely to run beside qpwatch on an RDMA host (node_exporter,
    /// ebpf_exporter, DCGM, the NVIDIA GPU, InfiniBand and mlx5 exporters,
    /// process, smartctl, IPMI, systemd, ethtool and Intel PCM exporters,
    /// Prometheus itself), and for the responder, an RDMA CM port, not those of
    /// the RDMA CM services on such hosts either.
    #[test]
    fn default_ports_leave_the_neighbours_alone() {
        let tcp_neighbours = [
            9100, 9435, 9400, 9835, 9683, 9315, 9615, 9256, 9633, 9290, 9558, 9417, 9738, 9090,
            9091, 9093,
        ];
        // NVMe-oF, NFS/RDMA, iSER, SMB Direct, rping, ucmatose/rdma_server,
        // perftest -R, qperf, Lustre o2ib
        let rdma_cm_neighbours = [4420, 20049, 3260, 5445, 7174, 7471, 18515, 19765, 987];
        let http = DEFAULT_LISTEN.parse::<SocketAddr>().unwrap().port();
        assert!(!tcp_neighbours.contains(&http));
        assert!(!tcp_neighbours.contains(&DEFAULT_PROBE_PORT));
        assert!(!rdma_cm_neighbours.contains(&DEFAULT_PROBE_PORT));
        assert_ne!(http, DEFAULT_PROBE_PORT, "one TCP port each on iWARP");
    }

    #[test]
    fn missing_explicit_config_is_an_error_default_is_not() {
        let args = cli(&["--config", "/nonexistent/qpwatch.toml"]).unwrap();
        let e = load(&args.run).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/nonexistent/qpwatch.toml: (file): cannot read"),
            "{e}"
        );
    }
}

#[cfg(test)]
mod prop;
#[cfg(test)]
mod same_rules;
