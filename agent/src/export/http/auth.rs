//! Basic auth against the web configuration's bcrypt hashes. A bcrypt check
//! costs tens of milliseconds at cost 10: successful ones are remembered (an
//! HMAC of user, hash and password under a key made at start, never the
//! password), so that a scraper pays once; and one check runs at a time, so
//! that wrong passwords cannot take every CPU. An unknown user is checked
//! against a hash of its own, so that timing does not tell which users exist.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Mutex, OnceLock},
};

use axum::http::HeaderValue;
use base64::Engine;
use ring::{hmac, rand::SystemRandom};

/// Successful checks remembered at most (then forgotten all at once).
const MAX_REMEMBERED: usize = 256;

pub struct BasicAuth {
    /// User → bcrypt hash.
    users: BTreeMap<String, String>,
    remembered: Mutex<HashSet<[u8; 32]>>,
    key: hmac::Key,
    one_at_a_time: tokio::sync::Mutex<()>,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization: Basic` header.
    Missing,
    /// Malformed, an unknown user or a wrong password.
    Invalid,
}

impl AuthFailure {
    pub const ALL: [AuthFailure; 2] = [AuthFailure::Missing, AuthFailure::Invalid];

    pub fn label(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::Invalid => "invalid",
        }
    }
}

/// The hash an unknown user's password is checked against (cost 10, as
/// hashes usually are).
fn unknown_user_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| bcrypt::hash("not a user of qpwatch", 10).expect("bcrypt at cost 10"))
}

/// The user and the password of an `Authorization: Basic` header.
fn credentials(header: Option<&HeaderValue>) -> Result<(String, Vec<u8>), AuthFailure> {
    let header = header.ok_or(AuthFailure::Missing)?.as_bytes();
    let (scheme, encoded) = header
        .iter()
        .position(|&b| b == b' ')
        .map(|i| header.split_at(i))
        .ok_or(AuthFailure::Missing)?;
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return Err(AuthFailure::Missing);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim_ascii())
        .map_err(|_| AuthFailure::Invalid)?;
    let colon = decoded
        .iter()
        .position(|&b| b == b':')
        .ok_or(AuthFailure::Invalid)?;
    let user = String::from_utf8(decoded[..colon].to_vec()).map_err(|_| AuthFailure::Invalid)?;
    Ok((user, decoded[colon + 1..].to_vec()))
}

impl BasicAuth {
    pub fn new(users: BTreeMap<String, String>) -> Self {
        Self {
            users,
            remembered: Mutex::new(HashSet::new()),
            key: hmac::Key::generate(hmac::HMAC_SHA256, &SystemRandom::new())
                .expect("the system's random numbers"),
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    }

    pub fn users(&self) -> usize {
        self.users.len()
    }

    fn tag(&self, user: &str, hash: &str, password: &[u8]) -> [u8; 32] {
        let mut cx = hmac::Context::with_key(&self.key);
        for part in [user.as_bytes(), hash.as_bytes(), password] {
            cx.update(&(part.len() as u64).to_le_bytes());
            cx.update(part);
        }
        cx.sign().as_ref().try_into().expect("SHA-256")
    }

    /// Whether the request's `Authorization` header names a user and its password.
    pub async fn check(&self, header: Option<&HeaderValue>) -> Result<(), AuthFailure> {
        let (user, password) = credentials(header)?;
        let hash = self.users.get(&user).cloned();
        if let Some(hash) = &hash {
            let tag = self.tag(&user, hash, &password);
            if self.remembered.lock().expect("not poisoned").contains(&tag) {
                return Ok(());
            }
        }
        let _one = self.one_at_a_time.lock().await;
        let checked = hash.clone();
        let good = tokio::task::spawn_blocking(move || {
            let hash = checked.as_deref().unwrap_or_else(|| unknown_user_hash());
            bcrypt::verify(&password, hash)
                .unwrap_or(false)
                .then_some(password)
        })
        .await
        .ok()
        .flatten();
        match (hash, good) {
            (Some(hash), Some(password)) => {
                let tag = self.tag(&user, &hash, &password);
                let mut remembered = self.remembered.lock().expect("not poisoned");
                if remembered.len() >= MAX_REMEMBERED {
                    remembered.clear();
                }
                remembered.insert(tag);
                Ok(())
            }
            _ => Err(AuthFailure::Invalid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, password: &str) -> HeaderValue {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        HeaderValue::from_str(&format!("Basic {encoded}")).unwrap()
    }

    #[tokio::test]
    async fn checks_user_and_password_and_remembers_successes() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let auth = BasicAuth::new([("prometheus".to_owned(), hash)].into());
        assert_eq!(auth.check(None).await, Err(AuthFailure::Missing));
        let bearer = HeaderValue::from_static("Bearer abc");
        assert_eq!(auth.check(Some(&bearer)).await, Err(AuthFailure::Missing));
        let garbage = HeaderValue::from_static("Basic !!!");
        assert_eq!(auth.check(Some(&garbage)).await, Err(AuthFailure::Invalid));
        let wrong = header("prometheus", "guess");
        assert_eq!(auth.check(Some(&wrong)).await, Err(AuthFailure::Invalid));
        let unknown = header("root", "s3cret");
        assert_eq!(auth.check(Some(&unknown)).await, Err(AuthFailure::Invalid));
        assert!(
            auth.remembered.lock().unwrap().is_empty(),
            "failures are not remembered"
        );
        let right = header("prometheus", "s3cret");
        assert_eq!(auth.check(Some(&right)).await, Ok(()));
        assert_eq!(auth.remembered.lock().unwrap().len(), 1);
        let lower =
            HeaderValue::from_str(&right.to_str().unwrap().replace("Basic", "basic")).unwrap();
        assert_eq!(auth.check(Some(&lower)).await, Ok(()));
        assert_eq!(
            auth.remembered.lock().unwrap().len(),
            1,
            "the same credentials"
        );
        let colon = header("prometheus", "s3cret:");
        assert_eq!(auth.check(Some(&colon)).await, Err(AuthFailure::Invalid));
    }
}
