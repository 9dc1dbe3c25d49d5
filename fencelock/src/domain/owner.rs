use std::fmt;

/// The holder's secret token for one acquisition attempt.
///
/// Trimmed, 1–255 bytes, no control characters. `Debug` redacts it, so a stray `{:?}` in a log
/// line or a span can never leak the token that renews and releases a lease.
#[derive(Clone, PartialEq, Eq)]
pub struct Owner(String);

pub const MAX_OWNER_BYTES: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnerError {
    #[error("must not be empty or blank")]
    Empty,
    #[error("must be at most {MAX_OWNER_BYTES} bytes after trimming, got {0}")]
    TooLong(usize),
    #[error("must not contain control characters (found one at byte {0})")]
    ControlChar(usize),
}

impl Owner {
    pub fn parse(raw: &str) -> Result<Self, OwnerError> {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Err(OwnerError::Empty);
        }
        if trimmed.len() > MAX_OWNER_BYTES {
            return Err(OwnerError::TooLong(trimmed.len()));
        }
        if let Some((at, _)) = trimmed.char_indices().find(|(_, c)| c.is_control()) {
            return Err(OwnerError::ControlChar(at));
        }
        Ok(Self(trimmed.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Owner(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_surrounding_whitespace() {
        assert_eq!(Owner::parse("  worker-1\t").unwrap().as_str(), "worker-1");
    }

    #[test]
    fn rejects_empty_and_blank() {
        assert_eq!(Owner::parse(""), Err(OwnerError::Empty));
        assert_eq!(Owner::parse(" \t\n "), Err(OwnerError::Empty));
    }

    #[test]
    fn limit_is_255_bytes_not_characters() {
        assert!(Owner::parse(&"a".repeat(255)).is_ok());
        assert_eq!(
            Owner::parse(&"a".repeat(256)),
            Err(OwnerError::TooLong(256))
        );
        // 128 two-byte characters are 256 bytes.
        assert_eq!(
            Owner::parse(&"é".repeat(128)),
            Err(OwnerError::TooLong(256))
        );
        assert!(Owner::parse("ünïcödé-owner").is_ok());
    }

    #[test]
    fn rejects_inner_control_characters() {
        assert_eq!(Owner::parse("a\u{0}b"), Err(OwnerError::ControlChar(1)));
        assert_eq!(Owner::parse("a\nb"), Err(OwnerError::ControlChar(1)));
        assert_eq!(Owner::parse("a\u{7f}b"), Err(OwnerError::ControlChar(1)));
    }

    #[test]
    fn debug_never_shows_the_token() {
        let owner = Owner::parse("secret-token").unwrap();
        assert!(!format!("{owner:?}").contains("secret"));
    }
}
