//! The check, shared by both stores, that a database's applied migrations are exactly this
//! build's.

/// The schema version a database is at, if it is exactly the one this build's migrations
/// (`known`) end at; otherwise why not, in one line. A migration the database applied with
/// another text than this build's (a database made before the schema was folded into one
/// migration, or a migration edited after it shipped) is named first: no `migrate` mends it.
pub(crate) fn schema_version(
    known: &[refinery::Migration],
    applied: &[refinery::Migration],
) -> anyhow::Result<refinery::SchemaVersion> {
    let changed = applied.iter().find_map(|was| {
        known
            .iter()
            .find(|is| is.version() == was.version() && is.checksum() != was.checksum())
            .map(|is| (was, is))
    });
    if let Some((was, is)) = changed {
        anyhow::bail!(
            "the database applied migration {was} where this build has {is}, another text: it was made by a build with another schema; give this build a new database"
        );
    }
    let latest = known.iter().map(|m| m.version()).max().unwrap_or_default();
    match applied.iter().map(|m| m.version()).max() {
        None => anyhow::bail!(
            "the database has no fencelock schema (no migration applied): start the server once or run `fencelock migrate`"
        ),
        Some(at) if at < latest => anyhow::bail!(
            "the schema is at version {at}, this build needs {latest}; run `fencelock migrate`"
        ),
        Some(at) if at > latest => Err(newer_schema(at, latest)),
        Some(at) => Ok(at),
    }
}

/// A database at schema version `at`, which a newer build than this one (whose latest is
/// `latest`) migrated.
pub(crate) fn newer_schema(
    at: refinery::SchemaVersion,
    latest: refinery::SchemaVersion,
) -> anyhow::Error {
    anyhow::anyhow!(
        "the schema is at version {at}, newer than this build knows ({latest}); run a newer fencelock"
    )
}
