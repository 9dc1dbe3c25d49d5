use std::fmt;

/// A fencing token: a positive integer below 2^53, so that every JSON client (JavaScript
/// included) reads it exactly. Fences from one store only ever increase.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Fence(i64);

/// 2^53 - 1, the largest integer an IEEE double holds exactly. The PostgreSQL sequence is
/// created with this as its MAXVALUE.
pub const MAX_FENCE: i64 = (1 << 53) - 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    #[error("must be a positive integer, got {0}")]
    NotPositive(i64),
    #[error("must be below 2^53, got {0}")]
    TooLarge(i64),
}

impl Fence {
    pub fn new(value: i64) -> Result<Self, FenceError> {
        match value {
            ..=0 => Err(FenceError::NotPositive(value)),
            1..=MAX_FENCE => Ok(Self(value)),
            _ => Err(FenceError::TooLarge(value)),
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

/// A fence written in canonical decimal, as [`Fence`]'s `Display` writes it: ASCII digits
/// only (no sign, no space) and no leading zero, in `1..2^53`.
///
/// Canonical because a signature covers the fence's canonical text: were `01` read as `1`,
/// the token `01.<signature of 1>` would pass for a token the server never issued, and one
/// fence would have many spellings (in logs, in a service's own records of who wrote).
#[cfg(feature = "fence-token")]
pub(crate) fn parse_decimal(text: &str) -> Option<Fence> {
    if text.is_empty() || text.starts_with('0') || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<i64>().ok().and_then(|n| Fence::new(n).ok())
}

impl TryFrom<i64> for Fence {
    type Error = FenceError;

    fn try_from(value: i64) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl serde::Serialize for Fence {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_i64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_1_to_2_pow_53_minus_1() {
        assert_eq!(Fence::new(1).unwrap().get(), 1);
        assert_eq!(Fence::new(MAX_FENCE).unwrap().get(), 9_007_199_254_740_991);
    }

    #[test]
    fn rejects_zero_negative_and_2_pow_53() {
        assert_eq!(Fence::new(0), Err(FenceError::NotPositive(0)));
        assert_eq!(Fence::new(-1), Err(FenceError::NotPositive(-1)));
        assert_eq!(Fence::new(1 << 53), Err(FenceError::TooLarge(1 << 53)));
        assert_eq!(Fence::new(i64::MAX), Err(FenceError::TooLarge(i64::MAX)));
    }

    #[cfg(feature = "fence-token")]
    #[test]
    fn only_the_canonical_decimal_is_a_fence() {
        assert_eq!(parse_decimal("1"), Some(Fence(1)));
        assert_eq!(parse_decimal("9007199254740991"), Some(Fence(MAX_FENCE)));
        for bad in [
            "",
            "0",
            "00",
            "01",
            "007",
            "+1",
            "-1",
            " 1",
            "1 ",
            "1_0",
            "１",
            "9007199254740992",
        ] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
    }
}
