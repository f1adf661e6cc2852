//! `qpwatch install`: the binary, the systemd unit and the example config.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use anyhow::Context;

pub const UNIT: &str = include_str!("../../../packaging/qpwatch.service");
pub const EXAMPLE_CONFIG: &str = include_str!("../../../packaging/qpwatch.toml");

fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// Installs into `root` (`/` normally); an existing config is left alone.
pub fn install(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut done = Vec::new();
    let exe = std::env::current_exe().context("finding the running binary")?;
    let bin = under(root, "/usr/local/bin/qpwatch");
    let unit = under(root, "/etc/systemd/system/qpwatch.service");
    let config = under(root, "/etc/qpwatch/qpwatch.toml");
    for dir in [&bin, &unit, &config] {
        let parent = dir.parent().expect("absolute paths");
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    if exe != bin {
        let tmp = bin.with_extension("new");
        fs::copy(&exe, &tmp).with_context(|| format!("copying to {}", tmp.display()))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        fs::rename(&tmp, &bin).with_context(|| format!("installing {}", bin.display()))?;
        done.push(format!("installed {}", bin.display()));
    }
    fs::write(&unit, UNIT).with_context(|| format!("writing {}", unit.display()))?;
    done.push(format!("installed {}", unit.display()));
    if config.exists() {
        done.push(format!("kept existing {}", config.display()));
    } else {
        fs::write(&config, EXAMPLE_CONFIG)
            .with_context(|| format!("writing {}", config.display()))?;
        done.push(format!("installed example {}", config.display()));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_into_a_root_and_keeps_a_config() {
        let root = tempfile::tempdir().unwrap();
        let done = install(root.path()).unwrap();
        assert!(
            root.path().join("usr/local/bin/qpwatch").exists(),
            "{done:?}"
        );
        assert_eq!(
            fs::read_to_string(root.path().join("etc/systemd/system/qpwatch.service")).unwrap(),
            UNIT
        );
        fs::write(
            root.path().join("etc/qpwatch/qpwatch.toml"),
            "listen = \"127.0.0.1:1\"",
        )
        .unwrap();
        let again = install(root.path()).unwrap();
        assert!(again.iter().any(|l| l.starts_with("kept existing")));
        assert_eq!(
            fs::read_to_string(root.path().join("etc/qpwatch/qpwatch.toml")).unwrap(),
            "listen = \"127.0.0.1:1\""
        );
    }
}
