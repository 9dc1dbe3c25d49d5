//! The fence sequence, checked before the store serves (docs/design/0006).
//!
//! Every fence comes from `nextval('lease_fence')`, and "a new fence is greater than every
//! fence issued before" holds only while that sequence is logged (an unlogged sequence is
//! reset by a crash), has `CACHE 1` (a cache gives each session a range of its own, so fences
//! stop increasing in the order they are issued), counts up without cycling to at most
//! 2^53 - 1 (the largest fence a JSON client reads exactly), and is ahead
//! of every fence already in `leases` (a restore, a `setval`, or a dump loaded without its
//! sequences can put it behind). None of that is enforced by PostgreSQL, and one `ALTER
//! SEQUENCE` by an operator breaks it silently, so the server checks it when it first
//! reaches the schema (start-up, or the first request after the database came up) and
//! `fencelock check` does too. Each refusal is one line naming the cause and the statement
//! that fixes it.
//!
//! The look for a fence at or above the sequence's next value is a range of the BRIN index
//! on `leases (fence)` (in the schema): fences are issued in the order rows are appended, so
//! the index's block summaries rule out almost the whole table, and the check costs well
//! under a millisecond however long the history is; a maximum over the table would be a
//! scan of all of it (17 ms at 100,000 rows, growing with the history), and a B-tree
//! would cost every acquisition one more index write.

use tokio_postgres::Client;

use super::classify;
use crate::store::StoreError;
use fencelock::domain::MAX_FENCE;

/// The sequence and what it must be, as the catalog and the sequence itself say.
const SEQUENCE: &str = "
SELECT c.relpersistence = 'p', s.seqcache, s.seqincrement, s.seqcycle, f.last_value, f.is_called,
       s.seqmax
FROM pg_class c JOIN pg_sequence s ON s.seqrelid = c.oid, lease_fence f
WHERE c.oid = 'lease_fence'::regclass";

/// The highest fence at or above `$1`, if any: a range of the fence index only.
const FENCE_AT_OR_ABOVE: &str = "SELECT max(fence) FROM leases WHERE fence >= $1";

/// The fence sequence cannot keep fences increasing; start-up stops on it.
#[derive(Debug, thiserror::Error)]
#[error("the fence sequence lease_fence {0}")]
pub(crate) struct UnsafeSequence(String);

/// Whether `error` is the fence sequence found unsafe.
pub(crate) fn is_unsafe(error: &StoreError) -> bool {
    matches!(error, StoreError::Misconfigured(cause) if cause.downcast_ref::<UnsafeSequence>().is_some())
}

/// What the catalog says of the sequence.
struct Found {
    logged: bool,
    cache: i64,
    increment: i64,
    cycles: bool,
    /// `MAXVALUE`: a fence above [`MAX_FENCE`] would be committed and then refused on
    /// every read of its lease.
    max: i64,
    /// The value the next `nextval()` returns, saturated at `i64::MAX` (an exhausted
    /// sequence refuses `nextval()` by itself).
    next: i64,
}

impl Found {
    /// Why the sequence's own settings cannot keep fences increasing, if they cannot.
    fn refusal(&self) -> Option<String> {
        if !self.logged {
            return Some(
                "is unlogged: a crash resets it and fences are issued again; run `ALTER SEQUENCE lease_fence SET LOGGED`"
                    .to_owned(),
            );
        }
        if self.cache != 1 {
            return Some(format!(
                "has CACHE {}: each session takes a range of fences of its own, and fences stop increasing in the order they are issued; run `ALTER SEQUENCE lease_fence CACHE 1`",
                self.cache
            ));
        }
        if self.increment <= 0 {
            return Some(format!(
                "counts down (INCREMENT BY {}); run `ALTER SEQUENCE lease_fence INCREMENT BY 1`",
                self.increment
            ));
        }
        if self.max > MAX_FENCE {
            return Some(format!(
                "has MAXVALUE {}: fences above 2^53 - 1 are not exact in JSON and are refused; run `ALTER SEQUENCE lease_fence MAXVALUE {MAX_FENCE}`",
                self.max
            ));
        }
        if self.cycles {
            return Some(
                "is CYCLE: at its end it would start again at 1; run `ALTER SEQUENCE lease_fence NO CYCLE`"
                    .to_owned(),
            );
        }
        None
    }
}

/// Checks the fence sequence on `client` (a session of its own: the check sets a
/// transaction-local planner setting): logged, `CACHE 1`, counting up to at most 2^53 - 1, no cycle, and its
/// next value above every fence in `leases`. Refusals are [`UnsafeSequence`], as
/// [`StoreError::Misconfigured`]; a failure to read is classified as any other.
pub(super) async fn check(client: &mut Client) -> Result<(), StoreError> {
    let transaction = client.transaction().await.map_err(classify)?;
    let row = transaction
        .query_one(SEQUENCE, &[])
        .await
        .map_err(classify)?;
    let found = Found {
        logged: row.get(0),
        cache: row.get(1),
        increment: row.get(2),
        cycles: row.get(3),
        max: row.get(6),
        next: next_value(&row),
    };
    if let Some(refusal) = found.refusal() {
        return Err(unsafe_sequence(refusal));
    }
    // The index serves the range whatever the planner thinks of the table's statistics (a
    // restored table may have none yet); a scan would find the same answer, only slower.
    transaction
        .batch_execute("SET LOCAL enable_seqscan = off")
        .await
        .map_err(classify)?;
    let issued: Option<i64> = transaction
        .query_one(FENCE_AT_OR_ABOVE, &[&found.next])
        .await
        .map_err(classify)?
        .get(0);
    transaction.commit().await.map_err(classify)?;
    let Some(highest) = issued else {
        return Ok(());
    };
    // Other instances go on drawing fences while this one starts, and one drawn after the
    // sequence was read above may be among the leases now. Each fence is drawn before it is
    // committed, so a sequence read after the leases is past every fence they hold, unless
    // it was put back.
    let row = client.query_one(SEQUENCE, &[]).await.map_err(classify)?;
    let next = next_value(&row);
    if next > highest {
        return Ok(());
    }
    Err(unsafe_sequence(format!(
        "is behind the leases: its next value is {next}, but fence {highest} was issued already (a restore that put the sequence back?); raise it with `SELECT setval('lease_fence', {highest})`, or further after a restore (docs/operations.md, Backups and restores)"
    )))
}

/// The value the sequence's next `nextval` returns, from a row of [`SEQUENCE`].
fn next_value(row: &tokio_postgres::Row) -> i64 {
    let (last_value, is_called, increment): (i64, bool, i64) = (row.get(4), row.get(5), row.get(2));
    if is_called {
        last_value.saturating_add(increment)
    } else {
        last_value
    }
}

fn unsafe_sequence(refusal: String) -> StoreError {
    StoreError::Misconfigured(anyhow::Error::new(UnsafeSequence(refusal)))
}

#[cfg(test)]
mod tests {
    use super::Found;

    fn safe() -> Found {
        Found {
            logged: true,
            cache: 1,
            increment: 1,
            cycles: false,
            max: super::MAX_FENCE,
            next: 1,
        }
    }

    #[test]
    fn only_a_logged_uncached_ascending_sequence_passes() {
        assert_eq!(safe().refusal(), None);
        let cases: [(Found, &str); 5] = [
            (
                Found {
                    logged: false,
                    ..safe()
                },
                "SET LOGGED",
            ),
            (
                Found {
                    cache: 20,
                    ..safe()
                },
                "CACHE 1`",
            ),
            (
                Found {
                    increment: -1,
                    ..safe()
                },
                "INCREMENT BY 1",
            ),
            (
                Found {
                    cycles: true,
                    ..safe()
                },
                "NO CYCLE",
            ),
            (
                Found {
                    max: i64::MAX,
                    ..safe()
                },
                "MAXVALUE 9007199254740991`",
            ),
        ];
        for (found, fix) in cases {
            let refusal = found.refusal().expect("refused");
            assert!(refusal.contains(fix), "{refusal}");
            assert!(!refusal.contains('\n'), "{refusal}");
        }
    }
}
