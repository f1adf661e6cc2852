//! Man pages and shell completions, generated from the command line's clap
//! definitions: what `--help` says is what the package's pages say.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::Context;
use clap::CommandFactory;

use super::config::Cli;

/// Section 8: system administration commands and daemons.
const SECTION: &str = "8";

/// Writes `qpwatch.8` and `qpwatch-SUBCOMMAND.8` for every subcommand into
/// `dir`; returns the files written.
pub fn write_manpages(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut command = Cli::command().disable_help_subcommand(true);
    command.build();
    let mut pages = vec![command.clone()];
    pages.extend(
        command
            .get_subcommands()
            .filter(|sub| !sub.is_hide_set())
            .cloned(),
    );
    let mut written = Vec::new();
    for page in pages {
        let man = clap_mangen::Man::new(page)
            .section(SECTION)
            .manual("qpwatch")
            .source(format!("qpwatch {}", env!("CARGO_PKG_VERSION")));
        let path = dir.join(man.get_filename());
        let mut text = Vec::new();
        man.render(&mut text)?;
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Writes the completion script of `shell` for `qpwatch`.
pub fn write_completions(shell: clap_complete::Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut Cli::command(), "qpwatch", out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_per_visible_subcommand_with_every_flag() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_manpages(dir.path()).unwrap();
        let mut names: Vec<_> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "qpwatch-check-config.8",
                "qpwatch-completions.8",
                "qpwatch-events.8",
                "qpwatch-hash-password.8",
                "qpwatch-install.8",
                "qpwatch-manpages.8",
                "qpwatch-probe.8",
                "qpwatch-responder.8",
                "qpwatch-run.8",
                "qpwatch.8",
            ]
        );
        let main_page = fs::read_to_string(dir.path().join("qpwatch.8")).unwrap();
        assert!(main_page.contains(".TH qpwatch 8 "), "{main_page}");
        for arg in Cli::command().get_arguments() {
            if let Some(long) = arg.get_long() {
                assert!(
                    main_page.contains(&format!("\\-\\-{}", long.replace('-', "\\-"))),
                    "--{long} missing from qpwatch.8"
                );
            }
        }
    }

    #[test]
    fn completions_name_the_subcommands() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut out = Vec::new();
            write_completions(shell, &mut out);
            let script = String::from_utf8(out).unwrap();
            for sub in Cli::command().get_subcommands() {
                let name = sub.get_name();
                assert!(script.contains(name), "{shell:?} completion lacks {name}");
            }
        }
    }
}
