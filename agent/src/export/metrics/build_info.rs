//! `qpwatch_build_info`: what is running, always 1.

use super::Registrar;

/// Registers the build info, set once: the version, the git revision it was
/// built from, whether that tree was dirty, and the running kernel.
pub fn register(r: &mut Registrar, kernel: &str) {
    r.gauge_vec(
        "qpwatch_build_info",
        "qpwatch version, the git revision it was built from (dirty: with changes not committed) and the kernel it runs on; always 1.",
        &["version", "revision", "dirty", "kernel"],
    )
    .with_label_values(&[
        env!("CARGO_PKG_VERSION"),
        env!("QPWATCH_GIT_REVISION"),
        env!("QPWATCH_GIT_DIRTY"),
        kernel,
    ])
    .set(1);
}
