//! Structured logs through `tracing`; `log` records (aya-log's eBPF output
//! among them) are bridged in.

use std::io::IsTerminal;

use tracing_subscriber::{filter::Targets, fmt, layer::SubscriberExt, util::SubscriberInitExt};

use crate::service::config::LogFormat;

/// `log_level` as a filter: a level, or `target=level` directives (config
/// checks it with `check_log_level`).
pub fn filter(level: &str) -> anyhow::Result<Targets> {
    level
        .parse()
        .map_err(|e| anyhow::anyhow!("log_level: invalid filter {level:?}: {e}"))
}

pub fn init(level: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = filter(level)?;
    let layer = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Text => registry.with(layer).try_init(),
        LogFormat::Json => registry.with(layer.json().flatten_event(true)).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("initialising logging: {e}"))
}
