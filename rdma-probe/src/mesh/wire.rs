//! The mesh's message: a fixed little-endian header, zero padding up to the
//! configured message size.
//!
//! ```text
//! 0  magic "QPWM"   4  version u8   5  kind u8   6  reserved [u8; 2]
//! 8  seq u64        16 sender_ts_ns u64
//! 24 responder_rx_ns u64            32 responder_tx_ns u64
//! ```

/// Bytes of the header; the smallest valid message.
pub const HEADER_LEN: usize = 40;
pub const MAGIC: [u8; 4] = *b"QPWM";
pub const VERSION: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Probe = 1,
    Answer = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    pub kind: Kind,
    pub seq: u64,
    pub sender_ts_ns: u64,
    pub responder_rx_ns: u64,
    pub responder_tx_ns: u64,
}

/// Why a received message was not understood.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    TooShort(usize),
    BadMagic,
    BadVersion(u8),
    BadKind(u8),
}

impl Message {
    pub fn probe(seq: u64, sender_ts_ns: u64) -> Message {
        Message {
            kind: Kind::Probe,
            seq,
            sender_ts_ns,
            responder_rx_ns: 0,
            responder_tx_ns: 0,
        }
    }

    /// The answer to this probe.
    pub fn answer(&self, responder_rx_ns: u64, responder_tx_ns: u64) -> Message {
        Message {
            kind: Kind::Answer,
            responder_rx_ns,
            responder_tx_ns,
            ..*self
        }
    }

    /// Writes the header into `out[..HEADER_LEN]` and zeroes the rest.
    pub fn encode(&self, out: &mut [u8]) {
        assert!(out.len() >= HEADER_LEN, "message buffer below the header");
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.kind as u8;
        out[6..8].fill(0);
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..24].copy_from_slice(&self.sender_ts_ns.to_le_bytes());
        out[24..32].copy_from_slice(&self.responder_rx_ns.to_le_bytes());
        out[32..40].copy_from_slice(&self.responder_tx_ns.to_le_bytes());
        out[HEADER_LEN..].fill(0);
    }

    pub fn decode(data: &[u8]) -> Result<Message, Malformed> {
        if data.len() < HEADER_LEN {
            return Err(Malformed::TooShort(data.len()));
        }
        if data[0..4] != MAGIC {
            return Err(Malformed::BadMagic);
        }
        if data[4] != VERSION {
            return Err(Malformed::BadVersion(data[4]));
        }
        let kind = match data[5] {
            1 => Kind::Probe,
            2 => Kind::Answer,
            other => return Err(Malformed::BadKind(other)),
        };
        let u64_at = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"));
        Ok(Message {
            kind,
            seq: u64_at(8),
            sender_ts_ns: u64_at(16),
            responder_rx_ns: u64_at(24),
            responder_tx_ns: u64_at(32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_padding() {
        let probe = Message::probe(0x0102_0304_0506_0708, 42);
        let mut buf = [0xffu8; 64];
        probe.encode(&mut buf);
        assert_eq!(&buf[..8], b"QPWM\x01\x01\x00\x00");
        assert_eq!(&buf[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert!(buf[HEADER_LEN..].iter().all(|&b| b == 0));
        assert_eq!(Message::decode(&buf), Ok(probe));

        let answer = probe.answer(100, 250);
        answer.encode(&mut buf);
        assert_eq!(buf[5], 2);
        let decoded = Message::decode(&buf[..HEADER_LEN]).unwrap();
        assert_eq!(decoded, answer);
        assert_eq!(
            (decoded.seq, decoded.sender_ts_ns),
            (probe.seq, probe.sender_ts_ns)
        );
        assert_eq!(
            (decoded.responder_rx_ns, decoded.responder_tx_ns),
            (100, 250)
        );
    }

    #[test]
    fn bad_input_is_rejected() {
        let mut buf = [0u8; HEADER_LEN];
        Message::probe(1, 2).encode(&mut buf);
        assert_eq!(
            Message::decode(&buf[..HEADER_LEN - 1]),
            Err(Malformed::TooShort(39))
        );
        assert_eq!(Message::decode(&[]), Err(Malformed::TooShort(0)));
        let mut bad = buf;
        bad[0] = b'X';
        assert_eq!(Message::decode(&bad), Err(Malformed::BadMagic));
        let mut bad = buf;
        bad[4] = 2;
        assert_eq!(Message::decode(&bad), Err(Malformed::BadVersion(2)));
        for kind in [0, 3, 255] {
            let mut bad = buf;
            bad[5] = kind;
            assert_eq!(Message::decode(&bad), Err(Malformed::BadKind(kind)));
        }
    }
}
