//! When a served certificate stops being valid: the `notAfter` of its
//! X.509 validity (RFC 5280, 4.1.2.5), read from the DER without a parser
//! crate. Only the path to that one field is walked:
//!
//! ```text
//! Certificate ::= SEQUENCE { tbsCertificate SEQUENCE {
//!     version [0] EXPLICIT OPTIONAL, serialNumber INTEGER,
//!     signature SEQUENCE, issuer SEQUENCE,
//!     validity SEQUENCE { notBefore Time, notAfter Time }, ... } ... }
//! Time ::= UTCTime "YYMMDDHHMMSSZ" | GeneralizedTime "YYYYMMDDHHMMSSZ"
//! ```

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("certificate validity not readable: {0}")]
pub struct CertExpiryError(&'static str);

const TRUNCATED: CertExpiryError = CertExpiryError("truncated");

const SEQUENCE: u8 = 0x30;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// `notAfter` of a DER certificate, in seconds since the Unix epoch.
pub fn not_after_unix(der: &[u8]) -> Result<i64, CertExpiryError> {
    let (tag, certificate, _) = tlv(der)?;
    expect(tag, SEQUENCE, "not a SEQUENCE")?;
    let (tag, mut tbs, _) = tlv(certificate)?;
    expect(tag, SEQUENCE, "no tbsCertificate")?;
    let (tag, _, rest) = tlv(tbs)?;
    if tag == VERSION {
        tbs = rest;
    }
    // serialNumber, signature, issuer
    for _ in 0..3 {
        tbs = tlv(tbs)?.2;
    }
    let (tag, validity, _) = tlv(tbs)?;
    expect(tag, SEQUENCE, "no validity")?;
    let (_, _, rest) = tlv(validity)?;
    let (tag, not_after, _) = tlv(rest)?;
    let text = std::str::from_utf8(not_after).map_err(|_| CertExpiryError("notAfter not text"))?;
    match tag {
        UTC_TIME => {
            // RFC 5280: YY >= 50 is 19YY, otherwise 20YY
            let yy: i64 = digits(text, 0, 2)?;
            let year = if yy >= 50 { 1900 + yy } else { 2000 + yy };
            time(year, &text[2..])
        }
        GENERALIZED_TIME => time(digits(text, 0, 4)?, &text[4..]),
        _ => Err(CertExpiryError("notAfter is not a time")),
    }
}

fn expect(tag: u8, want: u8, what: &'static str) -> Result<(), CertExpiryError> {
    if tag == want {
        Ok(())
    } else {
        Err(CertExpiryError(what))
    }
}

/// One DER element: its tag, its contents and what follows it.
fn tlv(der: &[u8]) -> Result<(u8, &[u8], &[u8]), CertExpiryError> {
    let (&tag, rest) = der.split_first().ok_or(TRUNCATED)?;
    let (&first, mut rest) = rest.split_first().ok_or(TRUNCATED)?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let octets = usize::from(first & 0x7f);
        if octets == 0 || octets > 4 || rest.len() < octets {
            return Err(CertExpiryError("bad length"));
        }
        let (bytes, after) = rest.split_at(octets);
        rest = after;
        bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b))
    };
    if rest.len() < len {
        return Err(TRUNCATED);
    }
    let (contents, after) = rest.split_at(len);
    Ok((tag, contents, after))
}

fn digits(text: &str, from: usize, len: usize) -> Result<i64, CertExpiryError> {
    text.get(from..from + len)
        .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse().ok())
        .ok_or(CertExpiryError("bad time"))
}

/// `MMDDHHMMSSZ` of `year`, as Unix seconds (DER times are UTC, with seconds).
fn time(year: i64, rest: &str) -> Result<i64, CertExpiryError> {
    if rest.len() != 11 || !rest.ends_with('Z') {
        return Err(CertExpiryError("bad time"));
    }
    let [month, day, hour, minute, second] = [0, 2, 4, 6, 8].map(|i| digits(rest, i, 2));
    let (month, day, hour, minute, second) = (month?, day?, hour?, minute?, second?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(CertExpiryError("bad time"));
    }
    Ok(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2049, 12, 31), 29_219);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
    }

    /// A certificate's skeleton: version, serial, signature, issuer, then
    /// the validity with the given notAfter element.
    fn skeleton(not_after: &[u8]) -> Vec<u8> {
        fn element(tag: u8, contents: &[u8]) -> Vec<u8> {
            let mut out = vec![tag];
            if contents.len() < 0x80 {
                out.push(contents.len() as u8);
            } else {
                out.extend([0x82, (contents.len() >> 8) as u8, contents.len() as u8]);
            }
            out.extend_from_slice(contents);
            out
        }
        let not_before = element(UTC_TIME, b"240101000000Z");
        let validity = element(SEQUENCE, &[not_before, not_after.to_vec()].concat());
        let tbs = [
            element(VERSION, &element(0x02, &[2])),
            element(0x02, &[1, 2, 3]),
            element(SEQUENCE, &[0x06, 0x01, 0x2a]),
            element(SEQUENCE, &[0u8; 200]),
            validity,
        ]
        .concat();
        element(SEQUENCE, &element(SEQUENCE, &tbs))
    }

    #[test]
    fn utc_and_generalized_times() {
        // 2034-05-06 07:08:09 UTC
        let want = 2_030_512_089;
        assert_eq!(
            not_after_unix(&skeleton(&[&[UTC_TIME, 13][..], b"340506070809Z"].concat())),
            Ok(want)
        );
        assert_eq!(
            not_after_unix(&skeleton(
                &[&[GENERALIZED_TIME, 15][..], b"20340506070809Z"].concat()
            )),
            Ok(want)
        );
        // UTCTime's 50 to 99 are 1950 to 1999
        assert_eq!(
            not_after_unix(&skeleton(&[&[UTC_TIME, 13][..], b"991231235959Z"].concat())),
            Ok(946_684_799)
        );
    }

    /// openssl's `-checkend N` says whether the certificate expires within N
    /// seconds: valid 5 s before the notAfter read here, expired 5 s after.
    #[test]
    fn agrees_with_openssl_on_a_real_certificate() {
        use std::{
            process::Command,
            time::{SystemTime, UNIX_EPOCH},
        };

        use rustls::pki_types::{pem::PemObject, CertificateDer};

        for name in ["server.crt", "ca.crt"] {
            let path = super::super::test_certs::certs().path(name);
            let der = CertificateDer::from_pem_file(&path).unwrap();
            let not_after = not_after_unix(&der).unwrap();
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            let valid_for = |seconds: i64| {
                Command::new("openssl")
                    .args(["x509", "-noout", "-in"])
                    .arg(&path)
                    .args(["-checkend", &seconds.to_string()])
                    .output()
                    .unwrap()
                    .status
                    .success()
            };
            assert!(
                valid_for(not_after - now - 5),
                "{name}: notAfter {not_after}"
            );
            assert!(
                !valid_for(not_after - now + 5),
                "{name}: notAfter {not_after}"
            );
        }
    }

    #[test]
    fn refuses_what_is_not_a_certificate() {
        assert!(not_after_unix(&[]).is_err());
        assert!(not_after_unix(b"not DER at all").is_err());
        let mut cert = skeleton(&[&[UTC_TIME, 13][..], b"340506070809Z"].concat());
        cert.truncate(cert.len() - 3);
        assert!(not_after_unix(&cert).is_err());
        assert!(
            not_after_unix(&skeleton(&[&[UTC_TIME, 13][..], b"341306070809Z"].concat())).is_err()
        );
        assert!(not_after_unix(&skeleton(&[&[0x04, 13][..], b"340506070809Z"].concat())).is_err());
    }
}
