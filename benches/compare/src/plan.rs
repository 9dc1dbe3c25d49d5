//! What is measured, in which order. The plan is fixed: every full run of the benchmark
//! makes the same runs in the same order, so that two runs (before and after a change) can
//! be read side by side.
//!
//! Each row compares sides under one load; its sides alternate, round after round
//! (`A B A B ...`, or `A B C A B C ...`), so that a slow spell of the machine falls on every
//! side alike.

use crate::load::Pattern;

/// A store the lease server runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreKey {
    Postgres,
    /// PostgreSQL, with a million live leases loaded before the runs.
    PostgresLoaded,
    Sqlite,
    /// SQLite, with a million live leases loaded before the runs.
    SqliteLoaded,
}

impl StoreKey {
    pub fn store_name(self) -> &'static str {
        match self {
            Self::Postgres | Self::PostgresLoaded => "PostgreSQL",
            Self::Sqlite | Self::SqliteLoaded => "SQLite",
        }
    }

    pub fn describe(self, live_leases: u64) -> String {
        match self {
            Self::Postgres => "fencelock, PostgreSQL store".to_owned(),
            Self::PostgresLoaded => {
                format!(
                    "fencelock, PostgreSQL store, {} live leases",
                    count(live_leases)
                )
            }
            Self::Sqlite => "fencelock, SQLite store".to_owned(),
            Self::SqliteLoaded => {
                format!(
                    "fencelock, SQLite store, {} live leases",
                    count(live_leases)
                )
            }
        }
    }
}

/// `1000000` as `10^6`, other counts as they are.
pub fn count(n: u64) -> String {
    if n >= 10 && 10u64.pow(n.ilog10()) == n {
        format!("10^{}", n.ilog10())
    } else {
        n.to_string()
    }
}

/// One side of a comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Fencelock(StoreKey),
    /// The build given with `--baseline-bin`, on a store of its own.
    Baseline(StoreKey),
    /// pgbench with the reference script of the row's pattern.
    Pgbench,
    /// Redis with `appendfsync always`.
    Redis,
    /// pgbench running a bound: fencelock's writes, straight to the database.
    Bound(Bound),
}

impl Side {
    pub fn describe(self, pattern: Pattern, live_leases: u64) -> String {
        match (self, pattern) {
            (Self::Fencelock(store), _) => store.describe(live_leases),
            (Self::Baseline(store), _) => {
                format!("baseline build, {} store", store.store_name())
            }
            (Self::Pgbench, Pattern::Cycles) => "pgbench, script A".to_owned(),
            (Self::Pgbench, Pattern::Hot) => "pgbench, script B".to_owned(),
            (Self::Redis, _) => "Redis, appendfsync always".to_owned(),
            (Self::Bound(bound), _) => format!("pgbench, bounds/{}", bound.file()),
        }
    }
}

/// The two groups of rows: each store with its reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Block {
    Postgres,
    Sqlite,
}

/// Sides compared under one load.
#[derive(Clone, Debug)]
pub struct Row {
    pub block: Block,
    pub pattern: Pattern,
    pub connections: usize,
    pub sides: Vec<Side>,
}

impl Row {
    pub fn describe(&self) -> String {
        let store = match self.block {
            Block::Postgres => "PostgreSQL",
            Block::Sqlite => "SQLite",
        };
        let load = match self.pattern {
            Pattern::Cycles => "cycles",
            Pattern::Hot => "hot 10",
        };
        format!("{store} {load} x{}", self.connections)
    }
}

/// A script of `benches/reference/bounds/`: fencelock's writes, sent by pgbench straight to
/// the database, one acquire and one release per transaction over 10,000 resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bound {
    /// `rows_1.sql`: the lease row appended and ended by plain statements, nothing else.
    Rows,
    /// `apply_1.sql`: each request one call of `fencelock_apply`, as a batch of one.
    Apply,
}

impl Bound {
    pub fn file(self) -> &'static str {
        match self {
            Self::Rows => "rows_1.sql",
            Self::Apply => "apply_1.sql",
        }
    }
}

/// What the database alone does with fencelock's writes, run beside the PostgreSQL store and
/// script A at every connection count: the rows alone, and `fencelock_apply` alone.
pub const BOUNDS: [Side; 2] = [Side::Bound(Bound::Rows), Side::Bound(Bound::Apply)];

/// The connection counts every store is measured at.
pub const CONNECTIONS: [usize; 3] = [1, 16, 64];
/// Where the hot-resource and the many-leases comparisons are made.
pub const BUSY: usize = 16;

/// The rows, in the order they run; `only` keeps one block. With a `baseline` build, each row
/// that runs fencelock on an empty store runs the baseline build there too, as one more side.
pub fn rows(only: Option<Block>, baseline: bool) -> Vec<Row> {
    use StoreKey::{Postgres, PostgresLoaded, Sqlite, SqliteLoaded};
    let mut rows = Vec::new();
    if only.is_none_or(|b| b == Block::Postgres) {
        rows.extend(
            cycle_rows(
                Block::Postgres,
                (Postgres, PostgresLoaded),
                Side::Pgbench,
                baseline,
            )
            .map(|mut row| {
                row.sides.extend(BOUNDS);
                row
            }),
        );
        rows.push(Row {
            block: Block::Postgres,
            pattern: Pattern::Hot,
            connections: BUSY,
            sides: compared(Postgres, Side::Pgbench, baseline),
        });
    }
    if only.is_none_or(|b| b == Block::Sqlite) {
        rows.extend(cycle_rows(
            Block::Sqlite,
            (Sqlite, SqliteLoaded),
            Side::Redis,
            baseline,
        ));
    }
    rows
}

/// The sides every row starts with: fencelock on the `empty` store, its `reference`, and the
/// `baseline` build on that store if there is one (after the reference, so that within a round
/// the reference runs between the two builds).
fn compared(empty: StoreKey, reference: Side, baseline: bool) -> Vec<Side> {
    let mut sides = vec![Side::Fencelock(empty), reference];
    if baseline {
        sides.push(Side::Baseline(empty));
    }
    sides
}

/// A block's cycle rows, one per connection count: the store (empty, then `loaded` with live
/// leases) against its `reference`; the loaded store runs only at `BUSY`, where the
/// many-leases comparison is made.
fn cycle_rows(
    block: Block,
    (empty, loaded): (StoreKey, StoreKey),
    reference: Side,
    baseline: bool,
) -> impl Iterator<Item = Row> {
    CONNECTIONS.into_iter().map(move |connections| {
        let mut sides = compared(empty, reference, baseline);
        if connections == BUSY {
            sides.push(Side::Fencelock(loaded));
        }
        Row {
            block,
            pattern: Pattern::Cycles,
            connections,
            sides,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_plan_compares_every_store_at_every_connection_count() {
        let all = rows(None, false);
        assert_eq!(all.len(), 7);
        for block in [Block::Postgres, Block::Sqlite] {
            for c in CONNECTIONS {
                assert!(all.iter().any(|r| r.block == block
                    && r.connections == c
                    && r.pattern == Pattern::Cycles));
            }
        }
        assert_eq!(rows(Some(Block::Sqlite), false).len(), 3);
        assert!(
            all.iter()
                .flat_map(|r| &r.sides)
                .all(|s| !matches!(s, Side::Baseline(_)))
        );
    }

    #[test]
    fn a_baseline_build_runs_beside_every_empty_store() {
        for row in rows(None, true) {
            let empty = row.sides[0];
            let Side::Fencelock(key) = empty else {
                panic!("{} does not start with fencelock", row.describe());
            };
            // Within a round the reference runs between the two builds.
            assert_eq!(row.sides[2], Side::Baseline(key), "{}", row.describe());
            assert_eq!(
                row.sides
                    .iter()
                    .filter(|s| matches!(s, Side::Baseline(_)))
                    .count(),
                1
            );
        }
    }

    #[test]
    fn the_bounds_run_beside_every_postgresql_cycles_row_only() {
        for row in rows(None, false) {
            let bounds = row.sides.iter().filter(|s| BOUNDS.contains(s)).count();
            let expected = if row.block == Block::Postgres && row.pattern == Pattern::Cycles {
                BOUNDS.len()
            } else {
                0
            };
            assert_eq!(bounds, expected, "{}", row.describe());
        }
    }

    #[test]
    fn powers_of_ten_are_written_as_such() {
        assert_eq!(count(1_000_000), "10^6");
        assert_eq!(count(100_000), "10^5");
        assert_eq!(count(1), "1");
        assert_eq!(count(25_000), "25000");
        assert_eq!(count(11), "11");
    }
}
