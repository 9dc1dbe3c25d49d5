//! Listing live leases (`GET /locks?prefix=&limit=&after=`): what a list may show (a scope of
//! name prefixes), one page's request, and the page the store answers with.
//!
//! Pages are keyed by resource name in byte order, which both stores keep on their primary
//! key: a page is one index range scan per prefix, starting after the previous page's last
//! name, however many leases there are.

use chrono::{DateTime, Utc};

use super::resource_name::{ResourceNameError, check_chars_and_length};
use super::{Fence, ResourceName};

/// The start of resource names: 0–255 characters of the resource name set (`""` starts
/// every name). Unlike a name it may be `.` or `..`: it never stands alone in a path.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct ResourcePrefix(String);

/// Every allowed character sorts below this one (DEL, 0x7F), so `prefix + END` is greater
/// than every name that starts with `prefix` and smaller than every later name that does
/// not: the exclusive upper bound of the prefix's range, in byte order.
const END: char = '\u{7f}';

/// The allowed character that sorts first. A name greater than `after` either extends it
/// (by at least this character) or differs from it at a greater character, so the names
/// after `after` are exactly those from `after + FIRST` on: every bound of a range can be
/// inclusive below and exclusive above, one index range per prefix.
const FIRST: char = '+';

impl ResourcePrefix {
    pub fn parse(raw: &str) -> Result<Self, ResourceNameError> {
        check_chars_and_length(raw)?;
        Ok(Self(raw.to_owned()))
    }

    /// `""`: every resource.
    pub fn everything() -> Self {
        Self(String::new())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` starts with this prefix.
    pub fn covers(&self, name: &str) -> bool {
        name.starts_with(&self.0)
    }

    /// The exclusive upper bound of the names this prefix starts, in byte order.
    pub fn end(&self) -> String {
        let mut end = String::with_capacity(self.0.len() + 1);
        end.push_str(&self.0);
        end.push(END);
        end
    }

    /// The names both prefixes start: those of the longer one if it extends the shorter,
    /// else none.
    fn overlap(&self, other: &Self) -> Option<Self> {
        if other.covers(&self.0) {
            Some(self.clone())
        } else if self.covers(&other.0) {
            Some(other.clone())
        } else {
            None
        }
    }
}

impl std::fmt::Display for ResourcePrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The names a list may show: prefixes that never overlap, in name order, so that reading
/// their ranges one after the other reads names in order.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ListScope(Vec<ResourcePrefix>);

impl ListScope {
    /// Every name that starts with `prefix`.
    pub fn whole(prefix: ResourcePrefix) -> Self {
        Self(vec![prefix])
    }

    /// The names that start with `requested` and with one of `allowed` (a bearer token's
    /// prefixes); `None` when no name can be both.
    pub fn within(requested: &ResourcePrefix, allowed: &[ResourcePrefix]) -> Option<Self> {
        let mut parts: Vec<ResourcePrefix> = allowed
            .iter()
            .filter_map(|prefix| requested.overlap(prefix))
            .collect();
        // In name order a prefix comes right before the prefixes that extend it, whose names
        // are all among its own: keep only the shortest of such a run.
        parts.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut scope: Vec<ResourcePrefix> = Vec::with_capacity(parts.len());
        for part in parts {
            if !scope.last().is_some_and(|kept| kept.covers(&part.0)) {
                scope.push(part);
            }
        }
        (!scope.is_empty()).then_some(Self(scope))
    }

    pub fn prefixes(&self) -> &[ResourcePrefix] {
        &self.0
    }
}

/// How many items one answer lists at most: 1 to [`Limit::MAX`], `DEFAULT` unless asked
/// otherwise. One type for every listing endpoint, each with its own default.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Limit<const DEFAULT: u16>(u16);

impl<const DEFAULT: u16> Limit<DEFAULT> {
    pub const MAX: u16 = 1000;
    pub const DEFAULT: Self = Self(DEFAULT);

    /// `None` outside `1..=MAX`.
    pub fn new(limit: u64) -> Option<Self> {
        u16::try_from(limit)
            .ok()
            .filter(|n| (1..=Self::MAX).contains(n))
            .map(Self)
    }

    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}

impl<const DEFAULT: u16> Default for Limit<DEFAULT> {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Most leases on one page of the list: 1–1000, 100 unless asked otherwise.
pub type PageLimit = Limit<100>;

/// One page of a list: the live leases in `scope` whose names come after `after`, in name
/// order, at most `limit` of them.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ListRequest {
    pub scope: ListScope,
    /// The last name of the previous page (its `next`); `None`: from the start.
    pub after: Option<ResourceName>,
    pub limit: PageLimit,
}

/// Names from `start` (inclusive) to `end` (exclusive), in byte order.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NameRange {
    pub start: String,
    pub end: String,
}

impl ListRequest {
    /// The ranges to read, in order: one per prefix of the scope, each starting after
    /// `after`; those that end at or before it are left out (a later page does not look at
    /// them again).
    pub fn ranges(&self) -> impl Iterator<Item = NameRange> + '_ {
        let after = self.after.as_ref().map(|after| format!("{after}{FIRST}"));
        self.scope
            .prefixes()
            .iter()
            .map(move |prefix| NameRange {
                start: match &after {
                    Some(after) if after.as_str() > prefix.as_str() => after.clone(),
                    _ => prefix.as_str().to_owned(),
                },
                end: prefix.end(),
            })
            .filter(|range| range.start < range.end)
    }
}

/// A live lease as a list shows it: no owner (the holder's secret), and no signed fence token
/// (a right to write that the holder gets from acquire and renew).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ListedLease {
    pub resource: ResourceName,
    pub fence: Fence,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The store's clock when it read this lease.
    pub observed_at: DateTime<Utc>,
}

/// One page of live leases and the `after` of the next page, `None` on the last.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LeasePage {
    pub leases: Vec<ListedLease>,
    pub next: Option<ResourceName>,
}

impl LeasePage {
    /// The page from up to `limit + 1` leases read in name order: the one beyond the limit,
    /// if read, shows that there is a next page, so the last page never points to an empty
    /// one.
    pub fn from_rows(mut leases: Vec<ListedLease>, limit: PageLimit) -> Self {
        let more = leases.len() > limit.get();
        leases.truncate(limit.get());
        let next = more
            .then(|| leases.last().map(|lease| lease.resource.clone()))
            .flatten();
        Self { leases, next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::resource_name::{assert_refuses_chars, is_allowed};
    use crate::domain::time_left_ms;

    fn prefix(raw: &str) -> ResourcePrefix {
        ResourcePrefix::parse(raw).unwrap()
    }

    fn scope(requested: &str, allowed: &[&str]) -> Option<Vec<String>> {
        let allowed: Vec<_> = allowed.iter().map(|p| prefix(p)).collect();
        ListScope::within(&prefix(requested), &allowed)
            .map(|s| s.prefixes().iter().map(|p| p.as_str().to_owned()).collect())
    }

    #[test]
    fn prefixes_take_the_name_set_from_empty_to_255() {
        for fine in ["", ".", "..", "job:", "a~", &"a".repeat(255)] {
            assert!(ResourcePrefix::parse(fine).is_ok(), "{fine:?}");
        }
        assert_eq!(
            ResourcePrefix::parse(&"a".repeat(256)),
            Err(ResourceNameError::TooLong(256))
        );
        assert_refuses_chars(ResourcePrefix::parse, &["a/b", "a b", "é", "a%", "a\u{7f}"]);
    }

    #[test]
    fn a_prefix_range_holds_exactly_its_names() {
        // Every allowed character, as the last one of a name and of a prefix.
        let all: Vec<char> = ('\0'..='\u{7f}').filter(|c| is_allowed(*c)).collect();
        for &p in &all {
            let range = prefix(&format!("k{p}"));
            for &c in &all {
                for name in [format!("k{c}"), format!("k{c}{c}"), format!("k{c}~~")] {
                    let inside = name.as_str() >= range.as_str() && name < range.end();
                    assert_eq!(inside, range.covers(&name), "{name:?} in {range:?}");
                }
            }
        }
        assert_eq!(prefix("").end(), "\u{7f}");
    }

    #[test]
    fn a_token_narrows_the_requested_prefix() {
        assert_eq!(scope("", &[""]), Some(vec![String::new()]));
        assert_eq!(scope("", &["billing:"]), Some(vec!["billing:".into()]));
        assert_eq!(scope("bill", &["billing:"]), Some(vec!["billing:".into()]));
        assert_eq!(
            scope("billing:x", &["billing:"]),
            Some(vec!["billing:x".into()])
        );
        assert_eq!(scope("report:", &["billing:"]), None);
        assert_eq!(scope("billing:", &["bill:"]), None);
        // Sorted, and a prefix inside another counted once.
        assert_eq!(
            scope("", &["report:", "billing:", "billing:eu:", "a"]),
            Some(vec!["a".into(), "billing:".into(), "report:".into()])
        );
        assert_eq!(
            scope("b", &["billing:eu:", "b", "c"]),
            Some(vec!["b".into()])
        );
    }

    fn request(prefixes: &[&str], after: Option<&str>) -> ListRequest {
        ListRequest {
            scope: ListScope(prefixes.iter().map(|p| prefix(p)).collect()),
            after: after.map(|a| ResourceName::parse(a).unwrap()),
            limit: PageLimit::DEFAULT,
        }
    }

    #[test]
    fn ranges_start_after_after_and_those_before_it_are_skipped() {
        let starts = |r: &ListRequest| r.ranges().map(|r| r.start).collect::<Vec<_>>();
        assert_eq!(starts(&request(&["a:", "c:"], None)), ["a:", "c:"]);
        assert_eq!(
            starts(&request(&["a:", "c:"], Some("a:zz"))),
            ["a:zz+", "c:"]
        );
        assert_eq!(starts(&request(&["a:", "c:"], Some("b"))), ["c:"]);
        assert_eq!(starts(&request(&["a:", "c:"], Some("c:~~~"))), ["c:~~~+"]);
        assert!(starts(&request(&["a:", "c:"], Some("d"))).is_empty());
        assert!(starts(&request(&["a:"], Some("a:~~"))).len() == 1);
        assert_eq!(
            request(&[""], None).ranges().collect::<Vec<_>>(),
            [NameRange {
                start: String::new(),
                end: "\u{7f}".into()
            }]
        );
    }

    #[test]
    fn a_range_after_a_name_holds_exactly_the_names_after_it() {
        let all: Vec<char> = ('\0'..='\u{7f}').filter(|c| is_allowed(*c)).collect();
        assert_eq!(all.first(), Some(&FIRST));
        assert!(all.iter().all(|c| *c < END));
        let names: Vec<String> = all
            .iter()
            .flat_map(|a| all.iter().map(move |b| format!("{a}{b}")))
            .chain(all.iter().map(|c| c.to_string()))
            .collect();
        for after in ["k", "k+", "k~", "~", "+", "0", "kk"] {
            let req = request(&[""], Some(after));
            let range = req.ranges().next().unwrap();
            for name in &names {
                let inside = name.as_str() >= range.start.as_str() && *name < range.end;
                assert_eq!(inside, name.as_str() > after, "{name:?} after {after:?}");
            }
        }
    }

    #[test]
    fn limits_are_1_to_1000() {
        assert_eq!(PageLimit::new(0), None);
        assert_eq!(PageLimit::new(1).map(PageLimit::get), Some(1));
        assert_eq!(PageLimit::new(1000).map(PageLimit::get), Some(1000));
        assert_eq!(PageLimit::new(1001), None);
        assert_eq!(PageLimit::new(u64::MAX), None);
        assert_eq!(PageLimit::default().get(), 100);
    }

    fn leases(names: &[&str]) -> Vec<ListedLease> {
        let at = DateTime::from_timestamp_millis(1_000).unwrap();
        names
            .iter()
            .enumerate()
            .map(|(i, name)| ListedLease {
                resource: ResourceName::parse(name).unwrap(),
                fence: Fence::new(i64::try_from(i).unwrap() + 1).unwrap(),
                acquired_at: at,
                expires_at: at + chrono::Duration::seconds(5),
                observed_at: at + chrono::Duration::seconds(1),
            })
            .collect()
    }

    #[test]
    fn next_is_set_only_when_a_row_beyond_the_page_was_read() {
        let limit = PageLimit::new(2).unwrap();
        let full = LeasePage::from_rows(leases(&["a", "b", "c"]), limit);
        assert_eq!(full.leases.len(), 2);
        assert_eq!(full.next.as_ref().map(ResourceName::as_str), Some("b"));
        let last = LeasePage::from_rows(leases(&["a", "b"]), limit);
        assert_eq!((last.leases.len(), last.next), (2, None));
        let empty = LeasePage::from_rows(Vec::new(), limit);
        assert_eq!((empty.leases.len(), empty.next), (0, None));
        let first = &full.leases[0];
        assert_eq!(time_left_ms(first.expires_at, first.observed_at), 4_000);
    }
}
