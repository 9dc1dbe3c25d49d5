use std::fmt;
use std::time::Duration;

/// A lease duration in whole seconds, at least 1 and at most the configured maximum.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct Ttl(u32);

/// The largest maximum an operator may configure: ten years. It keeps `now + ttl` far inside
/// every timestamp range the stores use, so adding a TTL can never overflow.
pub const TTL_CEILING_SECONDS: u32 = 10 * 365 * 24 * 3600;

/// The default maximum TTL: one day.
pub const DEFAULT_MAX_TTL_SECONDS: u32 = 86_400;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TtlError {
    #[error("must be at least 1 second, got {0}")]
    TooShort(i64),
    #[error("must be at most {max} seconds, got {got}")]
    TooLong { got: i64, max: u32 },
}

impl Ttl {
    /// Checks a requested TTL against the bounds `1..=max`.
    pub fn new(seconds: i64, max: Ttl) -> Result<Self, TtlError> {
        if seconds < 1 {
            return Err(TtlError::TooShort(seconds));
        }
        match u32::try_from(seconds) {
            Ok(s) if s <= max.0 => Ok(Self(s)),
            _ => Err(TtlError::TooLong {
                got: seconds,
                max: max.0,
            }),
        }
    }

    /// A maximum for [`Ttl::new`]; `None` when outside `1..=TTL_CEILING_SECONDS`.
    pub fn max(seconds: u32) -> Option<Self> {
        (1..=TTL_CEILING_SECONDS)
            .contains(&seconds)
            .then_some(Self(seconds))
    }

    pub fn seconds(self) -> u32 {
        self.0
    }

    pub fn millis(self) -> i64 {
        i64::from(self.0) * 1000
    }

    pub fn as_duration(self) -> Duration {
        Duration::from_secs(u64::from(self.0))
    }
}

impl fmt::Display for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}s", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day() -> Ttl {
        Ttl::max(86_400).unwrap()
    }

    #[test]
    fn bounds_are_inclusive() {
        assert_eq!(Ttl::new(1, day()).unwrap().seconds(), 1);
        assert_eq!(Ttl::new(86_400, day()).unwrap().seconds(), 86_400);
    }

    #[test]
    fn rejects_zero_negative_and_too_large_without_overflow() {
        assert_eq!(Ttl::new(0, day()), Err(TtlError::TooShort(0)));
        assert_eq!(Ttl::new(-5, day()), Err(TtlError::TooShort(-5)));
        assert_eq!(Ttl::new(i64::MIN, day()), Err(TtlError::TooShort(i64::MIN)));
        assert!(matches!(
            Ttl::new(86_401, day()),
            Err(TtlError::TooLong { .. })
        ));
        assert!(matches!(
            Ttl::new(i64::MAX, day()),
            Err(TtlError::TooLong { .. })
        ));
    }

    #[test]
    fn configured_maximum_is_bounded() {
        assert!(Ttl::max(0).is_none());
        assert!(Ttl::max(TTL_CEILING_SECONDS + 1).is_none());
        assert!(Ttl::max(TTL_CEILING_SECONDS).is_some());
    }
}
