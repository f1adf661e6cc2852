//! Structured logs through `tracing`; `log` records (aya-log's eBPF output
//! among them) are bridged in.

use std::io::IsTerminal;

use tracing_subscriber::{fmt, EnvFilter};

use crate::service::config::LogFormat;

pub fn init(level: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(level)
        .map_err(|e| anyhow::anyhow!("log_level: invalid filter {level:?}: {e}"))?;
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("initialising logging: {e}"))
}
