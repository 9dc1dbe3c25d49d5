use std::{borrow::Cow, cmp, fmt, iter, str};

use super::Quality;
use crate::error::ParseError;

/// Represents an item with a quality value as defined
/// in [RFC 7231 §5.3.1](https://datatracker.ietf.org/doc/html/rfc7231#section-5.3.1).
///
/// # Parsing and Formatting
/// This wrapper be used to parse header value items that have a q-factor annotation as well as
/// serialize items with a their q-factor.
///
/// When parsing, the `q` parameter is recognized at any position outside quoted parameter values.
/// Other parameters are preserved for the wrapped item's parser.
///
/// # Ordering
/// Since this context of use for this type is header value items, ordering is defined for
/// `QualityItem`s but _only_ considers the item's quality. Order of appearance should be used as
/// the secondary sorting parameter; i.e., a stable sort over the quality values will produce a
/// correctly sorted sequence.
///
/// # Examples
/// ```
/// # use actix_http::header::{QualityItem, q};
/// let q_item: QualityItem<String> = "hello;q=0.3".parse().unwrap();
/// assert_eq!(&q_item.item, "hello");
/// assert_eq!(q_item.quality, q(0.3));
///
/// // note that format is normalized compared to parsed item
/// assert_eq!(q_item.to_string(), "hello; q=0.3");
///
/// // item with q=0.3 is greater than item with q=0.1
/// let q_item_fallback: QualityItem<String> = "abc;q=0.1".parse().unwrap();
/// assert!(q_item > q_item_fallback);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QualityItem<T> {
    /// The wrapped contents of the field.
    pub item: T,

    /// The quality (client or server preference) for the value.
    pub quality: Quality,
}

impl<T> QualityItem<T> {
    /// Constructs a new `QualityItem` from an item and a quality value.
    ///
    /// The item can be of any type. The quality should be a value in the range [0, 1].
    pub fn new(item: T, quality: Quality) -> Self {
        QualityItem { item, quality }
    }

    /// Constructs a new `QualityItem` from an item, using the maximum q-value.
    pub fn max(item: T) -> Self {
        Self::new(item, Quality::MAX)
    }

    /// Constructs a new `QualityItem` from an item, using the minimum, non-zero q-value.
    pub fn min(item: T) -> Self {
        Self::new(item, Quality::MIN)
    }

    /// Constructs a new `QualityItem` from an item, using zero q-value of zero.
    pub fn zero(item: T) -> Self {
        Self::new(item, Quality::ZERO)
    }
}

impl<T: PartialEq> PartialOrd for QualityItem<T> {
    fn partial_cmp(&self, other: &QualityItem<T>) -> Option<cmp::Ordering> {
        self.quality.partial_cmp(&other.quality)
    }
}

impl<T: fmt::Display> fmt::Display for QualityItem<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.item, f)?;

        match self.quality {
            // q-factor value is implied for max value
            Quality::MAX => Ok(()),

            // fast path for zero
            Quality::ZERO => f.write_str("; q=0"),

            // quality formatting is already using itoa
            q => write!(f, "; q={}", q),
        }
    }
}

impl<T: str::FromStr> str::FromStr for QualityItem<T> {
    type Err = ParseError;

    fn from_str(q_item_str: &str) -> Result<Self, Self::Err> {
        if !q_item_str.is_ascii() {
            return Err(ParseError::Header);
        }

        let mut parameter_start = None;
        let mut quality_parameter = None;
        let mut quoted = false;
        let mut escaped = false;

        // Only unquoted semicolons delimit parameters; quoted-pairs escape the next byte.
        for (index, byte) in q_item_str.bytes().chain(iter::once(b';')).enumerate() {
            if escaped {
                // skip escaped char
                escaped = false;
                continue;
            }

            match byte {
                b'\\' if quoted => escaped = true,

                b'"' => quoted = !quoted,

                b';' if !quoted => {
                    if let Some(start) = parameter_start {
                        let attribute = q_item_str[start + 1..index].trim();

                        // Retain the existing rejection of a short final attribute.
                        if index == q_item_str.len() && attribute.len() < 2 {
                            return Err(ParseError::Header);
                        }

                        if attribute.starts_with("q=") || attribute.starts_with("Q=") {
                            // Preserve the existing last-quality-parameter behavior.
                            quality_parameter = Some((start, index, &attribute[2..]));
                        }
                    }

                    parameter_start = Some(index);
                }

                _ => {}
            }
        }

        let mut raw_item = Cow::Borrowed(q_item_str);
        let mut quality = Quality::MAX;

        if let Some((start, end, value)) = quality_parameter {
            // Parse decimal digits directly to preserve the specified precision.
            quality = match value.as_bytes() {
                [b'0'] => Quality::ZERO,
                [b'1'] => Quality::MAX,

                [b'0', b'.', digits @ ..]
                    if digits.len() <= 3 && digits.iter().all(u8::is_ascii_digit) =>
                {
                    let mut value = 0;
                    let mut place = 100;

                    for &digit in digits {
                        value += u16::from(digit - b'0') * place;
                        place /= 10;
                    }

                    Quality(value)
                }

                [b'1', b'.', digits @ ..]
                    if digits.len() <= 3 && digits.iter().all(|&digit| digit == b'0') =>
                {
                    Quality::MAX
                }

                _ => return Err(ParseError::Header),
            };

            raw_item = if end == q_item_str.len() {
                Cow::Borrowed(q_item_str[..start].trim())
            } else {
                Cow::Owned([&q_item_str[..start], &q_item_str[end..]].concat())
            };
        }

        let item = raw_item.parse::<T>().map_err(|_| ParseError::Header)?;

        Ok(QualityItem::new(item, quality))
    }
}
