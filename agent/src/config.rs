//! Command line and settings of the daemon.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use thiserror::Error;

use crate::{correlator::Limits, offsets::DEFAULT_BTF_DIR, probes::Group};

fn parse_group(s: &str) -> Result<Group, String> {
    Group::from_name(s).ok_or_else(|| format!("unknown probe group {s:?} (qp, cm, kernel-ulp)"))
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:9435";
pub const DEFAULT_RING_BUFFER_BYTES: u32 = 1 << 20;
const PAGE_SIZE: u32 = 4096;

#[derive(Debug, Parser)]
#[command(
    name = "qpwatch",
    version,
    about = "eBPF observability for RDMA queue pair lifecycles"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: attach the probes and serve /metrics (the default).
    Run(RunArgs),
    /// Stream the decoded lifecycle events to stdout as JSON lines (no HTTP).
    Events(RunArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Address of the HTTP endpoint serving /metrics, /healthz and /readyz.
    #[arg(long, default_value = DEFAULT_LISTEN, value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Size of the kernel→agent ring buffer in bytes (a power of two, at least 4096).
    #[arg(long, default_value_t = DEFAULT_RING_BUFFER_BYTES, value_name = "BYTES")]
    pub ring_buffer_bytes: u32,
    /// Directory with the running kernel's BTF (vmlinux and per-module files).
    #[arg(long, default_value = DEFAULT_BTF_DIR, value_name = "DIR")]
    pub btf_dir: PathBuf,
    /// QPs tracked at once; beyond it the oldest tracked QP is evicted.
    #[arg(long, default_value_t = Limits::default().max_tracked_qps, value_name = "N")]
    pub max_tracked_qps: usize,
    /// Distinct `device` label values; further devices are reported as "other".
    #[arg(long, default_value_t = Limits::default().max_device_labels, value_name = "N")]
    pub max_device_labels: usize,
    /// Distinct `comm` values of qpwatch_qp_created_by_process_total; the rest are "other".
    #[arg(long, default_value_t = Limits::default().max_process_labels, value_name = "N")]
    pub max_process_labels: usize,
    /// Probe groups to attach: qp, cm, kernel-ulp (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "qp,cm,kernel-ulp", value_parser = parse_group)]
    pub groups: Vec<Group>,
    /// Exit if any hook of an enabled group does not attach.
    #[arg(long)]
    pub strict: bool,
    /// Do not adopt QPs and CM ids that exist at start-up (RDMA netlink).
    #[arg(long)]
    pub no_reconcile: bool,
    /// Seconds between checks for kernel modules that appeared or went away.
    #[arg(long, default_value_t = 2.0, value_name = "SECONDS")]
    pub module_poll_interval: f64,
    /// Log level: error, warn, info, debug or trace (or a tracing filter directive).
    #[arg(long, default_value = "info", value_name = "LEVEL")]
    pub log_level: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("ring_buffer_bytes: {0} is not a power of two of at least {PAGE_SIZE}")]
    RingBufferSize(u32),
    #[error("{key}: must be at least 1")]
    Zero { key: &'static str },
    #[error("module_poll_interval: {0} is not a positive number of seconds")]
    PollInterval(f64),
}

impl RunArgs {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let rb = self.ring_buffer_bytes;
        if rb < PAGE_SIZE || !rb.is_power_of_two() {
            return Err(ConfigError::RingBufferSize(rb));
        }
        if self.max_tracked_qps == 0 {
            return Err(ConfigError::Zero {
                key: "max_tracked_qps",
            });
        }
        if self.max_device_labels == 0 {
            return Err(ConfigError::Zero {
                key: "max_device_labels",
            });
        }
        if self.max_process_labels == 0 {
            return Err(ConfigError::Zero {
                key: "max_process_labels",
            });
        }
        if !(self.module_poll_interval.is_finite() && self.module_poll_interval > 0.0) {
            return Err(ConfigError::PollInterval(self.module_poll_interval));
        }
        Ok(())
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_tracked_qps: self.max_tracked_qps,
            max_device_labels: self.max_device_labels,
            max_process_labels: self.max_process_labels,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("qpwatch").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() {
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.run.listen, DEFAULT_LISTEN.parse().unwrap());
        assert_eq!(cli.run.ring_buffer_bytes, 1 << 20);
        cli.run.validate().unwrap();
    }

    #[test]
    fn rejects_bad_values() {
        assert!(parse(&["--listen", "nonsense"]).is_err());
        assert!(parse(&["--ring-buffer-bytes", "-1"]).is_err());
        let cli = parse(&["--ring-buffer-bytes", "5000"]).unwrap();
        assert_eq!(cli.run.validate(), Err(ConfigError::RingBufferSize(5000)));
        let cli = parse(&["--max-tracked-qps", "0"]).unwrap();
        assert_eq!(
            cli.run.validate(),
            Err(ConfigError::Zero {
                key: "max_tracked_qps"
            })
        );
    }
}
