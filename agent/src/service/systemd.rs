//! sd_notify(3) without libsystemd: READY/STOPPING/STATUS and the watchdog,
//! sent as datagrams to `$NOTIFY_SOCKET`. A no-op outside systemd.

use std::{os::unix::net::UnixDatagram, time::Duration};

use tracing::debug;

pub struct Notifier {
    socket: Option<(UnixDatagram, String)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET` and `$WATCHDOG_USEC` (honouring `$WATCHDOG_PID`).
    pub fn from_env() -> Self {
        let socket = std::env::var("NOTIFY_SOCKET").ok().and_then(|path| {
            let socket = UnixDatagram::unbound().ok()?;
            Some((socket, path))
        });
        let ours = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|pid| pid == std::process::id());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|_| ours)
            .map(Duration::from_micros);
        Self { socket, watchdog }
    }

    /// How often to send WATCHDOG=1 (half the configured timeout), if at all.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }

    /// `RELOADING=1` with the `MONOTONIC_USEC` sd_notify(3) asks for beside
    /// it: systemd 253 and later match the reload to it, and a reload
    /// without it can run into the unit's timeout.
    pub fn reloading(&self) {
        let now_us = crate::model::events::clock_ns(libc::CLOCK_MONOTONIC) / 1_000;
        self.notify(&format!("RELOADING=1\nMONOTONIC_USEC={now_us}"));
    }

    pub fn notify(&self, state: &str) {
        let Some((socket, path)) = &self.socket else {
            return;
        };
        let sent = if let Some(name) = path.strip_prefix('@') {
            send_abstract(socket, name, state)
        } else {
            socket.send_to(state.as_bytes(), path).map(|_| ())
        };
        if let Err(error) = sent {
            debug!(%error, state, "sd_notify failed");
        }
    }
}

fn send_abstract(socket: &UnixDatagram, name: &str, state: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    socket.send_to_addr(state.as_bytes(), &addr).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            socket: Some((UnixDatagram::unbound().unwrap(), path.display().to_string())),
            watchdog: Some(Duration::from_secs(30)),
        };
        n.notify("READY=1");
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(15)));
        let before = crate::model::events::clock_ns(libc::CLOCK_MONOTONIC) / 1_000;
        n.reloading();
        let after = crate::model::events::clock_ns(libc::CLOCK_MONOTONIC) / 1_000;
        let len = server.recv(&mut buf).unwrap();
        let text = std::str::from_utf8(&buf[..len]).unwrap();
        let usec: i128 = text
            .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
            .expect("RELOADING=1 then MONOTONIC_USEC")
            .parse()
            .unwrap();
        assert!(
            (before..=after).contains(&usec),
            "{before} <= {usec} <= {after}"
        );
    }
}
