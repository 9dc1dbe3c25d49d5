//! Bearer tokens: the auth file (`--auth-file`), the tokens it lists, and the lookup of a
//! presented secret.
//!
//! The file names each token by the SHA-256 of its secret, never the secret itself:
//!
//! ```toml
//! [[tokens]]
//! name = "billing-workers"
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! prefixes = ["billing:", "report:"]   # "" = every resource
//! permissions = ["lock", "read"]
//! max_leases = 1000                    # optional
//! ```
//!
//! A presented secret is hashed and compared with every token's digest in constant time, so
//! neither the answer's timing nor the log tells how close a guess came. Secrets are never
//! kept, logged or shown; a token is known to logs by its `name`.
//!
//! [`Auth`] holds the tokens in force; [`Auth::reload`] (on `SIGHUP`) swaps in a fresh copy
//! of the file, and keeps the old tokens when the new file is bad.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::Context as _;
use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use fencelock::domain::ResourceName;

/// Longest token name: it is logged with every lease event.
const MAX_NAME_LEN: usize = 64;
/// Random bytes in a secret made by `fencelock token new`.
const SECRET_BYTES: usize = 32;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// Acquire, renew and release.
    Lock,
    /// Inspect (and list, history, watch).
    Read,
}

impl Permission {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Read => "read",
        }
    }
}

/// One token of the auth file, validated.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    name: String,
    digest: [u8; 32],
    prefixes: Vec<String>,
    permissions: Vec<Permission>,
    max_leases: Option<u32>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("prefixes", &self.prefixes)
            .field("permissions", &self.permissions)
            .field("max_leases", &self.max_leases)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// The token's name, for logs; never the secret.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Most live leases this token may hold at once; `None`: no limit.
    pub fn max_leases(&self) -> Option<u32> {
        self.max_leases
    }

    pub fn has(&self, permission: Permission) -> bool {
        self.permissions.contains(&permission)
    }

    /// The resource prefixes the token may touch (`""`: all), as the file lists them.
    pub fn prefixes(&self) -> &[String] {
        &self.prefixes
    }

    /// Whether `resource` lies inside one of the token's prefixes (`""` covers all).
    pub fn covers(&self, resource: &ResourceName) -> bool {
        self.prefixes
            .iter()
            .any(|prefix| resource.as_str().starts_with(prefix.as_str()))
    }
}

/// The tokens of one auth file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tokens(Vec<Arc<Token>>);

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    tokens: Vec<FileToken>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToken {
    name: String,
    sha256: String,
    prefixes: Vec<String>,
    permissions: Vec<Permission>,
    max_leases: Option<u32>,
}

impl Tokens {
    /// Parses and validates the text of an auth file. The error names the first problem, in
    /// one line.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let doc: FileDoc = toml::from_str(text).map_err(|e| {
            // toml's message spans several lines (it quotes the offending line).
            anyhow::anyhow!(
                "{}",
                e.to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        })?;
        let mut tokens: Vec<Arc<Token>> = Vec::with_capacity(doc.tokens.len());
        for (index, raw) in doc.tokens.into_iter().enumerate() {
            let at = format!("token {} ({:?})", index + 1, raw.name);
            check_name(&raw.name).with_context(|| at.clone())?;
            let digest = parse_digest(&raw.sha256).with_context(|| at.clone())?;
            if raw.prefixes.is_empty() {
                anyhow::bail!("{at}: prefixes is empty; use [\"\"] for every resource");
            }
            for prefix in &raw.prefixes {
                check_prefix(prefix).with_context(|| at.clone())?;
            }
            if raw.permissions.is_empty() {
                anyhow::bail!("{at}: permissions is empty; give \"lock\", \"read\" or both");
            }
            if raw.max_leases == Some(0) {
                anyhow::bail!("{at}: max_leases must be at least 1");
            }
            if tokens.iter().any(|t| t.name == raw.name) {
                anyhow::bail!("{at}: the name is used by another token");
            }
            if tokens.iter().any(|t| t.digest == digest) {
                anyhow::bail!("{at}: the sha256 is that of another token");
            }
            tokens.push(Arc::new(Token {
                name: raw.name,
                digest,
                prefixes: raw.prefixes,
                permissions: raw.permissions,
                max_leases: raw.max_leases,
            }));
        }
        Ok(Self(tokens))
    }

    /// Reads and parses an auth file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the auth file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("the auth file {}", path.display()))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The token whose secret this is, if any. Every token's digest is compared, each in
    /// constant time, so the time taken does not depend on which token (if any) matched.
    pub fn lookup(&self, secret: &str) -> Option<Arc<Token>> {
        let digest = sha256(secret.as_bytes());
        let mut found = None;
        for token in &self.0 {
            if bool::from(token.digest.ct_eq(&digest)) {
                found = Some(token.clone());
            }
        }
        found
    }
}

/// The tokens in force, replaced as a whole on reload.
#[derive(Debug)]
pub struct Auth {
    path: PathBuf,
    tokens: RwLock<Arc<Tokens>>,
}

impl Auth {
    /// Loads the auth file; a bad file is an error naming the problem.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            tokens: RwLock::new(Arc::new(Tokens::load(path)?)),
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tokens in force now.
    pub fn tokens(&self) -> Arc<Tokens> {
        self.tokens
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn lookup(&self, secret: &str) -> Option<Arc<Token>> {
        self.tokens().lookup(secret)
    }

    /// Reads the file again. A good file replaces the tokens and returns how many there are
    /// now; a bad one leaves the tokens in force as they were.
    pub fn reload(&self) -> anyhow::Result<usize> {
        let fresh = Tokens::load(&self.path)?;
        let count = fresh.len();
        *self
            .tokens
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(fresh);
        Ok(count)
    }

    /// [`Self::reload`], logged: the new token count at INFO, a bad file at ERROR.
    pub fn reload_logged(&self) {
        match self.reload() {
            Ok(0) => warn_no_tokens(&self.path),
            Ok(tokens) => tracing::info!(tokens, path = %self.path.display(), "auth file reloaded"),
            Err(e) => tracing::error!(
                error = %format!("{e:#}"),
                "auth file not reloaded; the tokens in force stay"
            ),
        }
    }
}

/// An auth file without tokens is valid (emptying it and sending `SIGHUP` revokes every
/// token at once), but it is not what an operator usually means: said at WARN, at start and
/// on every reload that finds it so.
pub(crate) fn warn_no_tokens(path: &Path) {
    tracing::warn!(
        path = %path.display(),
        "the auth file lists no tokens: every lock request will be refused (401)"
    );
}

/// A fresh secret and the auth file block for it, as `fencelock token new NAME` prints them.
pub(crate) struct NewToken {
    pub secret: String,
    pub block: String,
}

/// Makes a fresh secret (256 bits from the OS, URL-safe base64) and the `[[tokens]]` block
/// that lets it in: every resource, both permissions, no quota; the operator narrows it.
pub(crate) fn new_token(name: &str) -> anyhow::Result<NewToken> {
    check_name(name)?;
    let mut bytes = [0_u8; SECRET_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("the OS random source failed: {e}"))?;
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let block = format!(
        "[[tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nprefixes = [\"\"]\npermissions = [\"lock\", \"read\"]\n# max_leases = 1000\n",
        hex(&sha256(secret.as_bytes()))
    );
    Ok(NewToken { secret, block })
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Lowercase hex, as the auth file writes digests.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut text, b| {
        let _ = write!(text, "{b:02x}");
        text
    })
}

/// Names are logged, so they keep to a short, plain alphabet.
fn check_name(name: &str) -> anyhow::Result<()> {
    let fine = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:@".contains(&b));
    anyhow::ensure!(
        fine,
        "the name {name:?} is not 1-{MAX_NAME_LEN} characters of A-Z a-z 0-9 . _ - : @"
    );
    Ok(())
}

fn parse_digest(text: &str) -> anyhow::Result<[u8; 32]> {
    let text = text.trim();
    anyhow::ensure!(
        text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()),
        "sha256 is not 64 hex digits (the SHA-256 of the secret; `fencelock token new` prints it)"
    );
    let mut digest = [0_u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex digits");
    }
    Ok(digest)
}

/// A prefix is the start of some resource name: the same characters, no longer.
fn check_prefix(prefix: &str) -> anyhow::Result<()> {
    let fine = prefix.len() <= 255
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:@+=~-".contains(&b));
    anyhow::ensure!(
        fine,
        "the prefix {prefix:?} holds a character no resource name can (A-Z a-z 0-9 . _ : @ + = ~ -)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn file(extra: &str) -> String {
        format!(
            "[[tokens]]\nname = \"billing\"\nsha256 = \"{TEST_DIGEST}\"\nprefixes = [\"billing:\"]\npermissions = [\"lock\", \"read\"]\n{extra}"
        )
    }

    #[test]
    fn the_contract_example_parses_and_finds_its_secret() {
        let tokens = Tokens::parse(&file("max_leases = 2\n")).unwrap();
        // 9f86... is the SHA-256 of "test".
        let token = tokens.lookup("test").unwrap();
        assert_eq!(token.name(), "billing");
        assert_eq!(token.max_leases(), Some(2));
        assert!(token.has(Permission::Lock) && token.has(Permission::Read));
        assert!(token.covers(&ResourceName::parse("billing:x").unwrap()));
        assert!(!token.covers(&ResourceName::parse("report:x").unwrap()));
        assert!(tokens.lookup("tesT").is_none());
        assert!(tokens.lookup("").is_none());
    }

    #[test]
    fn bad_files_are_refused_with_one_line() {
        let cases = [
            (file("colour = \"red\"\n"), "colour"),
            (file("max_leases = 0\n"), "max_leases"),
            (file("").replace("\"lock\", ", "\"write\", "), "write"),
            (file("").replace(TEST_DIGEST, "abc"), "64 hex"),
            (file("").replace("[\"billing:\"]", "[]"), "prefixes"),
            (file("").replace("[\"billing:\"]", "[\"a/b\"]"), "prefix"),
            (file("").replace("\"billing\"", "\"bad name\""), "name"),
            (
                format!("{}{}", file(""), file("").replace("billing\"", "other\"")),
                "sha256",
            ),
            ("tokens = 3".to_owned(), "tokens"),
        ];
        for (text, word) in cases {
            let refusal = format!("{:#}", Tokens::parse(&text).unwrap_err());
            assert!(refusal.contains(word), "{word}: {refusal}");
            assert!(!refusal.contains('\n'), "{refusal}");
        }
    }

    #[test]
    fn a_new_token_block_parses_and_lets_its_secret_in() {
        let new = new_token("ci").unwrap();
        assert!(new.secret.len() >= 22, "at least 128 bits: {}", new.secret);
        assert!(
            new.secret
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        let tokens = Tokens::parse(&new.block).unwrap();
        assert_eq!(tokens.lookup(&new.secret).unwrap().name(), "ci");
        assert_ne!(new_token("ci").unwrap().secret, new.secret);
        assert!(new_token("not ok").is_err());
    }
}
