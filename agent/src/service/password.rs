//! `qpwatch hash-password`: a bcrypt hash for the web configuration's
//! `basic_auth_users`, from a password read on stdin.

use std::io::{self, BufRead, Write};

use anyhow::{bail, Context};

/// Turns the terminal's echo off until dropped (when stdin is a terminal).
struct NoEcho(Option<libc::termios>);

impl NoEcho {
    fn new() -> Self {
        // SAFETY: isatty, tcgetattr and tcsetattr on fd 0 with a termios
        // they initialise.
        unsafe {
            if libc::isatty(0) != 1 {
                return NoEcho(None);
            }
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut saved) != 0 {
                return NoEcho(None);
            }
            let mut quiet = saved;
            quiet.c_lflag &= !libc::ECHO;
            libc::tcsetattr(0, libc::TCSANOW, &quiet);
            NoEcho(Some(saved))
        }
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            // SAFETY: restores the attributes read in new().
            unsafe { libc::tcsetattr(0, libc::TCSANOW, saved) };
            eprintln!();
        }
    }
}

/// Reads one line (the password, without its line end) from stdin and
/// returns its bcrypt hash at `cost`.
pub fn hash_password(cost: u32) -> anyhow::Result<String> {
    if !(4..=31).contains(&cost) {
        bail!("--cost: {cost} is not between 4 and 31");
    }
    let mut line = String::new();
    {
        let echo = NoEcho::new();
        if echo.0.is_some() {
            eprint!("Password: ");
            let _ = io::stderr().flush();
        }
        io::stdin()
            .lock()
            .read_line(&mut line)
            .context("reading the password from stdin")?;
    }
    let password = line.strip_suffix('\n').unwrap_or(&line);
    let password = password.strip_suffix('\r').unwrap_or(password);
    if password.is_empty() {
        bail!("empty password on stdin");
    }
    bcrypt::hash(password, cost).context("bcrypt")
}
