//! Builds the eBPF programs in ../ebpf for bpfel-unknown-none and places the
//! object in OUT_DIR, where kernel/hooks.rs embeds it with `include_bytes_aligned!`.
//!
//! The eBPF crate is compiled by Debian's rustc (`rustc-web`), which ships a
//! prebuilt `core` for the BPF targets, and linked by bpf-linker. Both can be
//! overridden: QPWATCH_BPF_RUSTC, QPWATCH_BPF_LINKER.

use std::{
    env,
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
};

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    git_revision(&manifest_dir);
    let ebpf_dir = manifest_dir.join("../ebpf");
    let common_dir = manifest_dir.join("../common");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets it"));
    for path in [
        ebpf_dir.join("src"),
        ebpf_dir.join("Cargo.toml"),
        ebpf_dir.join("Cargo.lock"),
        ebpf_dir.join("build.rs"),
        common_dir.join("src"),
    ] {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-env-changed=QPWATCH_BPF_RUSTC");
    println!("cargo:rerun-if-env-changed=QPWATCH_BPF_LINKER");

    let rustc = env::var("QPWATCH_BPF_RUSTC").unwrap_or_else(|_| "/usr/bin/rustc".to_owned());
    let linker = env::var("QPWATCH_BPF_LINKER").unwrap_or_else(|_| "bpf-linker".to_owned());
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets it");
    let target_dir = ebpf_target_dir(&out_dir);

    let mut cmd = Command::new(cargo);
    cmd.current_dir(&ebpf_dir)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "bpfel-unknown-none",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // The outer build's compiler, wrappers and flags are for the host.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .env("RUSTC", &rustc)
        // Debian's rustc is a stable compiler; the BPF target needs unstable flags.
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_LINKER", &linker)
        .env("AYA_BPF_TARGET_ARCH", &arch)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            [
                "-Cdebuginfo=2",
                "-Clink-arg=--btf",
                // With LLVM's -bpf-expand-memcpy-in-order, the BPF backend
                // expands no memset inline (MaxStoresPerMemset = 0): every
                // zeroed event became a call to a byte-at-a-time loop.
                "-Clink-arg=--disable-expand-memcpy-in-order",
            ]
            .join("\x1f"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped());

    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!("cannot run cargo for the eBPF crate ({e}); run scripts/setup first")
    });
    let stderr = BufReader::new(child.stderr.take().expect("piped"));
    let mut log = Vec::new();
    for line in stderr.lines().map_while(Result::ok) {
        log.push(line);
    }
    let status = child.wait().expect("waiting for cargo");
    if !status.success() {
        for line in &log {
            println!("cargo:warning={line}");
        }
        panic!(
            "building the eBPF programs failed ({status}); needs {rustc} (apt: rustc-web, \
             libstd-rust-web-dev-bpf) and {linker} (scripts/setup installs both)"
        );
    }
    let object = target_dir.join("bpfel-unknown-none/release/qpwatch");
    std::fs::copy(&object, out_dir.join("qpwatch-ebpf"))
        .unwrap_or_else(|e| panic!("copying {}: {e}", object.display()));
}

/// Where the eBPF crate builds: `ebpf/` in the outer build's target directory
/// (OUT_DIR is TARGET/PROFILE/build/PACKAGE-HASH/out), shared by every
/// profile, so that `cargo clippy` and `cargo build --release` build it once
/// between them; the nested cargo locks it. OUT_DIR itself if it has another
/// shape.
fn ebpf_target_dir(out_dir: &std::path::Path) -> PathBuf {
    let mut up = out_dir.ancestors();
    match (up.nth(2), up.nth(1)) {
        (Some(build), Some(target)) if build.file_name() == Some("build".as_ref()) => {
            target.join("ebpf")
        }
        _ => out_dir.join("ebpf-target"),
    }
}

/// Sets `QPWATCH_GIT_REVISION` (12 hex digits, or `unknown` outside a git
/// checkout), `QPWATCH_GIT_DIRTY` (`true` if tracked or unignored files
/// differ from that revision) and `QPWATCH_LONG_VERSION` for `--version` and
/// `qpwatch_build_info`. A
/// build from a source tarball can set `QPWATCH_GIT_REVISION` itself.
fn git_revision(manifest_dir: &std::path::Path) {
    println!("cargo:rerun-if-env-changed=QPWATCH_GIT_REVISION");
    println!("cargo:rerun-if-env-changed=QPWATCH_GIT_DIRTY");
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(manifest_dir)
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let (revision, dirty) = match env::var("QPWATCH_GIT_REVISION") {
        Ok(revision) => (
            revision,
            env::var("QPWATCH_GIT_DIRTY").unwrap_or_else(|_| "false".to_owned()),
        ),
        Err(_) => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(revision) => {
                let status = git(&["status", "--porcelain"]).unwrap_or_default();
                (revision, (!status.is_empty()).to_string())
            }
            None => ("unknown".to_owned(), "false".to_owned()),
        },
    };
    println!("cargo:rustc-env=QPWATCH_GIT_REVISION={revision}");
    println!("cargo:rustc-env=QPWATCH_GIT_DIRTY={dirty}");
    let changes = if dirty == "true" {
        ", with changes not committed"
    } else {
        ""
    };
    println!(
        "cargo:rustc-env=QPWATCH_LONG_VERSION={} (revision {revision}{changes})",
        env::var("CARGO_PKG_VERSION").expect("cargo sets it")
    );
    // a commit or checkout rewrites HEAD or the index; an edit changes a
    // source file of the workspace
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for file in ["HEAD", "index"] {
            println!("cargo:rerun-if-changed={git_dir}/{file}");
        }
    }
    let root = manifest_dir.join("..");
    for dir in [
        "agent/src",
        "common/src",
        "ebpf/src",
        "rdma-probe/src",
        "packaging",
        "dashboards",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    for path in watched_tests(&root.join("tests")) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// What under `tests` can make the checkout dirty: everything but the VM
/// runs' output (`tests/vm/out`, `tests/vm/explore`, both ignored by git),
/// which every run writes to and which, watched, rebuilt the agent after
/// each run. A file added directly in `tests/vm` is not seen until the
/// next commit (which rewrites the index).
fn watched_tests(tests: &std::path::Path) -> Vec<PathBuf> {
    let entries = |dir: &std::path::Path| -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        paths.sort();
        paths
    };
    let mut watched = Vec::new();
    for path in entries(tests) {
        if path.file_name().is_some_and(|name| name == "vm") {
            watched.extend(entries(&path).into_iter().filter(|p| {
                p.file_name()
                    .is_some_and(|name| name != "out" && name != "explore")
            }));
        } else {
            watched.push(path);
        }
    }
    watched
}
