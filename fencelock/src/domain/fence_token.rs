//! Signed fences: a fence bound to its resource by a secret shared by the lease server and
//! the guards, so that a writer cannot make one up, nor use one issued for another resource.
//!
//! A token is `<fence>.<signature>`, where the signature is
//! `base64url(HMAC-SHA256(key, resource + "\n" + fence))` in the URL-safe alphabet without
//! padding (43 characters), and `fence` is written in decimal as in the lock object. The
//! signature is checked in constant time (`hmac`'s `verify_slice`).

use std::fmt;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;

use super::Fence;

/// The shortest key accepted: the length of an HMAC-SHA256 output.
pub const MIN_KEY_BYTES: usize = 32;

/// A secret that signs fences. Read from a file, its bytes as they are (make one with
/// `head -c 32 /dev/urandom > fence.key`). Its `Debug` shows no byte of it.
#[derive(Clone)]
pub struct FenceKey(Vec<u8>);

#[derive(Debug, thiserror::Error)]
pub enum FenceKeyError {
    // The OS error is part of the message and deliberately not the error's `source`: an
    // error chain printed in full (`{:#}`, as start-up does) would say it twice.
    #[error("fence key file {path}: {cause}")]
    Unreadable { path: String, cause: std::io::Error },
    #[error(
        "fence key file {path}: {len} bytes, at least {MIN_KEY_BYTES} are needed (make one with `head -c 32 /dev/urandom > FILE`)"
    )]
    TooShort { path: String, len: usize },
}

impl FenceKey {
    /// A key of at least [`MIN_KEY_BYTES`] bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Option<Self> {
        (bytes.len() >= MIN_KEY_BYTES).then_some(Self(bytes))
    }

    /// The key in the file at `path`: all its bytes. A missing, unreadable or too short file
    /// is an error naming the file.
    pub fn read(path: &Path) -> Result<Self, FenceKeyError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|cause| FenceKeyError::Unreadable {
            path: shown.clone(),
            cause,
        })?;
        let len = bytes.len();
        Self::from_bytes(bytes).ok_or(FenceKeyError::TooShort { path: shown, len })
    }

    /// The secret's bytes, for the guard's SQL, which installs them into a database.
    #[cfg(feature = "guard")]
    pub(crate) fn secret(&self) -> &[u8] {
        &self.0
    }

    fn mac(&self, resource: &str, fence: Fence) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        mac.update(resource.as_bytes());
        mac.update(b"\n");
        mac.update(fence.to_string().as_bytes());
        mac
    }

    /// The token for `fence` on `resource`: `<fence>.<signature>`.
    pub fn sign(&self, resource: &str, fence: Fence) -> String {
        let signature = self.mac(resource, fence).finalize().into_bytes();
        format!("{fence}.{}", URL_SAFE_NO_PAD.encode(signature))
    }

    /// Whether `token` is a token this key signed for `resource`.
    fn verifies(&self, resource: &str, token: &SignedFence) -> bool {
        self.mac(resource, token.fence)
            .verify_slice(&token.signature)
            .is_ok()
    }
}

impl fmt::Debug for FenceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FenceKey({} bytes, redacted)", self.0.len())
    }
}

/// A token split into its fence and signature, not verified yet.
struct SignedFence {
    fence: Fence,
    signature: Vec<u8>,
}

impl SignedFence {
    /// `<fence>.<signature>`: a fence in `1..2^53` in plain decimal, a dot, and 32 bytes in
    /// unpadded base64url (43 characters, in their one canonical spelling), as the guard's
    /// SQL reads a token.
    fn parse(token: &str) -> Option<Self> {
        let (fence, signature) = token.split_once('.')?;
        let fence = super::fence::parse_decimal(fence)?;
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        (signature.len() == SIGNATURE_BYTES).then_some(Self { fence, signature })
    }
}

/// The keys a guard accepts tokens of: the current one first, then earlier ones still
/// honoured while leases signed with them may live (rotation).
#[derive(Debug, Clone, Default)]
pub struct FenceKeys(Vec<FenceKey>);

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// A bare fence: a token form, but not accepted once there are keys (the guard's `403`).
    #[error("a bare fence is not accepted here; send the lease's fence_token")]
    BareFence,
    /// Not a token at all: neither a bare fence nor a well-formed `<fence>.<signature>` (the
    /// guard's `400`, as the SQL guard's `FL400`).
    #[error("not a fence token (<fence>.<signature>)")]
    Malformed,
    /// A well-formed token that no key signed for this resource: forged, another resource's,
    /// tampered (the guard's `403`).
    #[error("the signature does not match {resource}")]
    Forged { resource: String },
}

impl FenceKeys {
    pub fn new(keys: Vec<FenceKey>) -> Self {
        Self(keys)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The keys, current first.
    #[cfg(feature = "guard")]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &FenceKey> {
        self.0.iter()
    }

    /// The fence of `token` if one of the keys signed it for `resource`; else why not: a bare
    /// fence, something that is no token at all, or a token no key signed for `resource`.
    pub fn verify(&self, resource: &str, token: &str) -> Result<Fence, TokenError> {
        if super::fence::parse_decimal(token).is_some() {
            return Err(TokenError::BareFence);
        }
        let signed = SignedFence::parse(token).ok_or(TokenError::Malformed)?;
        // Every key is tried, so the time taken does not tell which one matched.
        let matched = self
            .0
            .iter()
            .fold(false, |found, key| key.verifies(resource, &signed) | found);
        if matched {
            Ok(signed.fence)
        } else {
            Err(TokenError::Forged {
                resource: resource.to_owned(),
            })
        }
    }
}

/// The fence of a bare fence or of a well-formed token, unverified: for a guard without keys,
/// which accepts bare fences and, while keys are being rolled out, the fence of a token.
pub fn unverified_fence(token: &str) -> Option<Fence> {
    if !token.contains('.') {
        return super::fence::parse_decimal(token);
    }
    SignedFence::parse(token).map(|signed| signed.fence)
}

/// The length of an HMAC-SHA256 signature.
const SIGNATURE_BYTES: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> FenceKey {
        FenceKey::from_bytes(vec![byte; 32]).unwrap()
    }

    fn fence(n: i64) -> Fence {
        Fence::new(n).unwrap()
    }

    #[test]
    fn the_token_is_the_fence_and_the_hmac_of_resource_newline_fence() {
        let token = key(7).sign("report:2024", fence(42));
        // Computed independently: RFC 2104 HMAC over SHA-256, by hand.
        let expected = {
            use sha2::Digest as _;
            let mut k = [0u8; 64];
            k[..32].copy_from_slice(&[7; 32]);
            let inner: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
            let outer: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
            let h1 = Sha256::new()
                .chain_update(&inner)
                .chain_update(b"report:2024\n42")
                .finalize();
            Sha256::new()
                .chain_update(&outer)
                .chain_update(h1)
                .finalize()
        };
        assert_eq!(token, format!("42.{}", URL_SAFE_NO_PAD.encode(expected)));
        // The known vector, fixed once, so that a change of format is seen.
        assert_eq!(token, "42.aiUUz8qOOQ-xdbI2ghUN65XfxGfXvgwLUXY2UwDDRK0");
        assert_eq!(token.len(), "42.".len() + 43);
    }

    #[test]
    fn a_token_verifies_for_its_resource_with_any_listed_key() {
        let (new, old) = (key(1), key(2));
        let keys = FenceKeys::new(vec![new.clone(), old.clone()]);
        assert_eq!(keys.verify("r", &new.sign("r", fence(5))), Ok(fence(5)));
        assert_eq!(keys.verify("r", &old.sign("r", fence(6))), Ok(fence(6)));
        let only_new = FenceKeys::new(vec![new]);
        assert!(only_new.verify("r", &old.sign("r", fence(6))).is_err());
    }

    #[test]
    fn forged_foreign_bare_and_malformed_tokens_are_refused() {
        let k = key(1);
        let keys = FenceKeys::new(vec![k.clone()]);
        let forged = || {
            Err(TokenError::Forged {
                resource: "r".into(),
            })
        };
        assert_eq!(keys.verify("r", &k.sign("other", fence(5))), forged());
        assert_eq!(keys.verify("r", &key(9).sign("r", fence(5))), forged());
        // The signature of fence 5 does not cover fence 6.
        let token = k.sign("r", fence(5));
        let raised = token.replacen('5', "6", 1);
        assert_eq!(keys.verify("r", &raised), forged());
        assert_eq!(
            keys.verify("r", "9007199254740991"),
            Err(TokenError::BareFence)
        );
        assert_eq!(keys.verify("r", "5"), Err(TokenError::BareFence));
        // A well-formed signature of the right length that is not the key's.
        let signature = token.split_once('.').unwrap().1;
        let flipped = if signature.starts_with('A') { 'B' } else { 'A' };
        let tampered = format!("5.{flipped}{}", &signature[1..]);
        assert_eq!(keys.verify("r", &tampered), forged());
        // Neither a bare fence nor a well-formed `<fence>.<signature>`: not a token at all.
        let long = format!("{token}A");
        let short = &token[..token.len() - 1];
        let uncanonical = format!("{short}1");
        let twice = format!("{token}.{signature}");
        for bad in [
            "",
            ".",
            "5.",
            "x.abc",
            "0.abc",
            "5.abc",
            "5.a=b",
            "-5.abc",
            "5.abc.def",
            "abc",
            "05",
            "9007199254740992",
            "1e3",
            short,
            &long,
            &uncanonical,
            &twice,
        ] {
            assert_eq!(keys.verify("r", bad), Err(TokenError::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn a_fence_is_only_accepted_in_its_canonical_spelling() {
        let k = key(1);
        let keys = FenceKeys::new(vec![k.clone()]);
        let token = k.sign("r", fence(1));
        let signature = token.strip_prefix("1.").unwrap();
        assert_eq!(keys.verify("r", &token), Ok(fence(1)));
        for spelling in ["01", "001", "+1"] {
            let respelled = format!("{spelling}.{signature}");
            assert_eq!(
                keys.verify("r", &respelled),
                Err(TokenError::Malformed),
                "{respelled}"
            );
            assert_eq!(unverified_fence(&respelled), None, "{respelled}");
            assert_eq!(unverified_fence(spelling), None, "{spelling}");
            assert_eq!(
                keys.verify("r", spelling),
                Err(TokenError::Malformed),
                "{spelling}"
            );
        }
    }

    #[test]
    fn keys_are_at_least_32_bytes_and_never_shown() {
        assert!(FenceKey::from_bytes(vec![0; 31]).is_none());
        let k = FenceKey::from_bytes(vec![0xab; 32]).unwrap();
        assert!(!format!("{k:?}").contains("ab"));
    }

    #[test]
    fn reading_a_key_names_the_file_when_it_fails() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.key");
        let err = FenceKey::read(&missing).unwrap_err().to_string();
        assert!(err.contains("missing.key"), "{err}");
        let short = dir.path().join("short.key");
        std::fs::write(&short, [1; 16]).unwrap();
        let err = FenceKey::read(&short).unwrap_err().to_string();
        assert!(err.contains("16 bytes") && err.contains("32"), "{err}");
        let good = dir.path().join("good.key");
        std::fs::write(&good, [1; 32]).unwrap();
        assert!(FenceKey::read(&good).is_ok());
    }

    #[test]
    fn without_keys_the_fence_is_read_bare_or_from_a_token() {
        assert_eq!(unverified_fence("7"), Some(fence(7)));
        let token = key(1).sign("r", fence(7));
        assert_eq!(unverified_fence(&token), Some(fence(7)));
        for bad in ["x", "7.5", "7.", "1e3", &token[..token.len() - 1]] {
            assert_eq!(unverified_fence(bad), None, "{bad:?}");
        }
    }
}
