use std::fmt;

/// The name of a locked resource: 1–255 characters from `A-Z a-z 0-9 . _ - : @ + = ~`.
///
/// The set leaves out `/` and `%` on purpose: a name always stands for itself in a URL path,
/// so `/locks/{resource}` never needs escaping and never aliases another path. For the same
/// reason `.` and `..` are refused: HTTP clients treat them as dot segments and rewrite
/// `/locks/./renew` to `/locks/renew`, which would act on another resource.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ResourceName(String);

/// Longest name, in characters (all allowed characters are one byte).
pub const MAX_RESOURCE_LEN: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceNameError {
    #[error("must not be empty")]
    Empty,
    #[error("must be at most {MAX_RESOURCE_LEN} characters, got {0}")]
    TooLong(usize),
    #[error(
        "character {ch:?} at position {position} is not allowed (use A-Z a-z 0-9 . _ - : @ + = ~)"
    )]
    InvalidChar { ch: char, position: usize },
    #[error("must not be {0:?}: HTTP clients rewrite such a path segment")]
    DotSegment(&'static str),
}

impl ResourceName {
    pub fn parse(raw: &str) -> Result<Self, ResourceNameError> {
        if raw.is_empty() {
            return Err(ResourceNameError::Empty);
        }
        check_chars_and_length(raw)?;
        if let Some(dots) = [".", ".."].into_iter().find(|d| *d == raw) {
            return Err(ResourceNameError::DotSegment(dots));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `c` may appear in a resource name (and so in a prefix of one).
pub(super) fn is_allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '@' | '+' | '=' | '~')
}

impl AsRef<str> for ResourceName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The rules a name shares with a prefix of names: only allowed characters (the first other
/// one is named), at most [`MAX_RESOURCE_LEN`] of them.
pub(super) fn check_chars_and_length(raw: &str) -> Result<(), ResourceNameError> {
    if let Some((position, ch)) = raw.chars().enumerate().find(|(_, c)| !is_allowed(*c)) {
        return Err(ResourceNameError::InvalidChar { ch, position });
    }
    // Only ASCII is allowed, so bytes and characters agree here.
    if raw.len() > MAX_RESOURCE_LEN {
        return Err(ResourceNameError::TooLong(raw.len()));
    }
    Ok(())
}

/// Asserts that `parse` refuses each of `bad` for a character outside the set.
#[cfg(test)]
pub(super) fn assert_refuses_chars<T: fmt::Debug>(
    parse: impl Fn(&str) -> Result<T, ResourceNameError>,
    bad: &[&str],
) {
    for bad in bad {
        let parsed = parse(bad);
        assert!(
            matches!(parsed, Err(ResourceNameError::InvalidChar { .. })),
            "{bad:?} should be refused, not {parsed:?}"
        );
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_every_allowed_character() {
        let all = "ABCXYZabcxyz0189._-:@+=~";
        assert_eq!(ResourceName::parse(all).unwrap().as_str(), all);
        assert!(ResourceName::parse("job:42").is_ok());
        assert!(ResourceName::parse("report:monthly-2026-05").is_ok());
    }

    #[test]
    fn length_bounds_are_1_to_255() {
        assert_eq!(ResourceName::parse(""), Err(ResourceNameError::Empty));
        assert!(ResourceName::parse(&"a".repeat(255)).is_ok());
        assert_eq!(
            ResourceName::parse(&"a".repeat(256)),
            Err(ResourceNameError::TooLong(256))
        );
    }

    #[test]
    fn rejects_everything_outside_the_set() {
        assert_refuses_chars(
            ResourceName::parse,
            &[
                "a/b", "a%2Fb", "a b", "a\"b", "a'b", "é", "a;b", "a\0b", "a\nb", "a?b", "a#b",
            ],
        );
    }

    #[test]
    fn dot_segments_are_refused_but_dotted_names_are_not() {
        assert_eq!(
            ResourceName::parse("."),
            Err(ResourceNameError::DotSegment("."))
        );
        assert_eq!(
            ResourceName::parse(".."),
            Err(ResourceNameError::DotSegment(".."))
        );
        for fine in ["...", ".a", "a.", "..a", "a..b"] {
            assert!(
                ResourceName::parse(fine).is_ok(),
                "{fine:?} should be accepted"
            );
        }
    }

    #[test]
    fn reports_the_first_offending_character() {
        assert_eq!(
            ResourceName::parse("ok/no"),
            Err(ResourceNameError::InvalidChar {
                ch: '/',
                position: 2
            })
        );
    }
}
