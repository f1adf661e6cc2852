//! A throwaway CA, a server certificate for 127.0.0.1 and a client
//! certificate, made once per test run with the openssl command.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

pub struct Certs {
    pub dir: PathBuf,
}

impl Certs {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command (Debian package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ec_key(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            name,
        ],
    );
}

/// A certificate for `key` signed by the CA, with these extensions.
fn signed(dir: &Path, name: &str, subject: &str, extensions: &str) {
    let ext = format!("{name}.ext");
    std::fs::write(dir.join(&ext), extensions).unwrap();
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    ec_key(dir, &key);
    openssl(
        dir,
        &["req", "-new", "-key", &key, "-subj", subject, "-out", &csr],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ],
    );
}

pub fn certs() -> &'static Certs {
    static CERTS: OnceLock<Certs> = OnceLock::new();
    CERTS.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("qpwatch-test-certs")
            .tempdir()
            .unwrap()
            .keep();
        ec_key(&dir, "ca.key");
        openssl(
            &dir,
            &[
                "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=qpwatch test CA", "-days",
                "2", "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
                "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.crt",
            ],
        );
        signed(
            &dir,
            "server",
            "/CN=localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
        );
        signed(
            &dir,
            "client",
            "/CN=prometheus",
            "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
        );
        Certs { dir }
    })
}
