//! The guard's check as SQL, installed into the protected service's own database, so that a
//! service in any language protects a write by one call inside its write transaction.
//!
//! On PostgreSQL (11 or later, no extension) the call is `fencelock_guard.admit(key,
//! token)`; [`postgres::admit`](super::postgres::admit) makes the same call for a Rust
//! service, so that services in several languages share one table and one rule:
//!
//! ```sql
//! BEGIN;
//! SELECT fencelock_guard.admit('invoice:7', '42');
//! UPDATE invoices SET total = 120 WHERE id = 7;
//! COMMIT;
//! ```
//!
//! On MySQL (8.0 or later) or MariaDB (10.5 or later) it is a procedure of the current
//! database:
//!
//! ```sql
//! START TRANSACTION;
//! CALL fencelock_guard_admit('invoice:7', '42');
//! UPDATE invoices SET total = 120 WHERE id = 7;
//! COMMIT;
//! ```
//!
//! `token` is what the writer sent: a bare fence while no key is installed, the lease's
//! `fence_token` once keys are. The rules are [`Guard::check`](super::Guard::check)'s and
//! the fence comparison is `admit`'s: the fence is admitted when it is at least the highest
//! admitted for the key (which it then becomes), and the key's row stays locked until the
//! transaction ends. A refusal is an error whose SQLSTATE says which: [`STALE`],
//! [`INVALID_TOKEN`] or [`NOT_A_TOKEN`].
//!
//! [`POSTGRES`] and [`MYSQL`] are the definitions alone, each from one template; they never
//! touch the installed keys, so a service may apply them at every start. [`postgres`] and
//! [`mysql`] are the scripts `fencelock guard sql` prints: the definitions, and with keys,
//! the statements that make them the installed keys.

use std::collections::BTreeSet;

use sha2::{Digest as _, Sha256};

use crate::domain::FenceKeys;

/// SQLSTATE of a stale fence: a greater fence has been admitted for the key. The message
/// names the current fence (`... the current fence is N, ...`); on PostgreSQL, DETAIL holds
/// it alone, in decimal.
pub const STALE: &str = "FL409";
/// SQLSTATE of a token that no installed key signed for the key written: a well-formed
/// `<fence>.<signature>` that is forged, of another key or tampered, or a bare fence once
/// keys are installed.
pub const INVALID_TOKEN: &str = "FL403";
/// SQLSTATE of a token that is not one, whether or not keys are installed: neither a fence
/// (a positive integer below 2^53 in plain decimal, no sign, no leading zero, no space) nor
/// `<fence>.<signature>` (the signature 43 characters of unpadded base64url). Also a NULL
/// key.
pub const NOT_A_TOKEN: &str = "FL400";

/// The guard's schema, `fencelock_guard`, in PostgreSQL: the `fences` table, the
/// `fence_keys` table and the `admit` function. Idempotent, for a service's own migrations
/// or start-up; run in one transaction (as `batch_execute` runs it). It leaves the
/// installed keys as they are.
pub const POSTGRES: &str = include_str!("sql/postgres.sql");

/// The guard in MySQL or MariaDB's current database: the `fencelock_guard_fences` and
/// `fencelock_guard_fence_keys` tables and the `fencelock_guard_admit` procedure.
/// Idempotent, written for the `mysql` or `mariadb` client (it uses `DELIMITER`). It leaves
/// the installed keys as they are.
pub const MYSQL: &str = include_str!("sql/mysql.sql");

/// What `fencelock guard sql postgres` prints: [`POSTGRES`] and, with `keys`, the statements
/// that make them the installed keys (a new one added before an old one goes, all in one
/// transaction). Without keys the installed ones stay.
pub fn postgres(keys: &FenceKeys) -> String {
    let mut script = String::from(
        "-- The fencelock guard for PostgreSQL (`fencelock guard sql postgres`). Apply it as the role\n\
         -- that is to own the guard: psql -v ON_ERROR_STOP=1 -f FILE DATABASE_URL\n\
         BEGIN;\n\n",
    );
    script.push_str(POSTGRES);
    script.push_str(&installing(
        &hex_secrets(keys, |secret| secret.to_vec()),
        |hex| format!("(decode('{hex}', 'hex'))"),
        |hex| format!("decode('{hex}', 'hex')"),
        |values, kept| {
            format!(
                "INSERT INTO fencelock_guard.fence_keys (secret)\n    VALUES {values}\n    ON CONFLICT (secret) DO NOTHING;\n\
                 DELETE FROM fencelock_guard.fence_keys\n    WHERE secret NOT IN ({kept});\n"
            )
        },
    ));
    script.push_str("\nCOMMIT;\n");
    script
}

/// What `fencelock guard sql mysql` prints: [`MYSQL`] and, with `keys`, the statements that
/// make them the installed keys (a new one added before an old one goes, in one
/// transaction). Without keys the installed ones stay.
pub fn mysql(keys: &FenceKeys) -> String {
    let mut script = String::from(
        "-- The fencelock guard for MySQL or MariaDB (`fencelock guard sql mysql`), in the current\n\
         -- database. Apply it as the user that is to define the guard: mariadb DBNAME < FILE\n\n",
    );
    script.push_str(MYSQL);
    // The key as HMAC uses it, so that the column holds at most one SHA-256 block.
    let block_key = |secret: &[u8]| match secret.len() {
        ..=64 => secret.to_vec(),
        _ => Sha256::digest(secret).to_vec(),
    };
    script.push_str(&installing(
        &hex_secrets(keys, block_key),
        |hex| format!("(X'{hex}', UTC_TIMESTAMP(6))"),
        |hex| format!("X'{hex}'"),
        |values, kept| {
            format!(
                "START TRANSACTION;\n\
                 INSERT INTO fencelock_guard_fence_keys (secret, added_at)\n    VALUES {values}\n    ON DUPLICATE KEY UPDATE secret = secret;\n\
                 DELETE FROM fencelock_guard_fence_keys\n    WHERE secret NOT IN ({kept});\n\
                 COMMIT;\n"
            )
        },
    ));
    script
}

const KEYS_UNTOUCHED: &str = "
-- No --fence-key: the installed keys, if any, stay as they are. While none is installed,
-- admit takes bare fences.
";

const KEYS_REPLACED: &str = "
-- The keys of --fence-key, and no others from now on (to rotate, give the new key and the
-- old one while leases signed with the old one live). This text holds them: keep it as
-- secret as the key files.
";

/// The keys' secrets as `stored` makes them, in hexadecimal, once each, sorted.
fn hex_secrets(keys: &FenceKeys, stored: impl Fn(&[u8]) -> Vec<u8>) -> Vec<String> {
    let hex = |bytes: Vec<u8>| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let unique: BTreeSet<String> = keys.iter().map(|key| hex(stored(key.secret()))).collect();
    unique.into_iter().collect()
}

/// The part of a script that makes `secrets` (hexadecimal) the installed keys, or, with none,
/// leaves the installed ones as they are. `statements(values, kept)` are the dialect's
/// statements that insert `values` (each secret as a `row`) and delete every key not in
/// `kept` (each secret as a `literal`).
fn installing(
    secrets: &[String],
    row: impl Fn(&String) -> String,
    literal: impl Fn(&String) -> String,
    statements: impl FnOnce(&str, &str) -> String,
) -> String {
    if secrets.is_empty() {
        return KEYS_UNTOUCHED.to_owned();
    }
    let values = join(secrets, row, ",\n           ");
    let kept = join(secrets, literal, ", ");
    format!("{KEYS_REPLACED}{}", statements(&values, &kept))
}

/// The `literal` of each secret, joined by `separator`.
fn join(secrets: &[String], literal: impl Fn(&String) -> String, separator: &str) -> String {
    secrets
        .iter()
        .map(literal)
        .collect::<Vec<_>>()
        .join(separator)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::FenceKey;

    fn keys(secrets: &[&[u8]]) -> FenceKeys {
        FenceKeys::new(
            secrets
                .iter()
                .map(|s| FenceKey::from_bytes(s.to_vec()).unwrap())
                .collect(),
        )
    }

    #[test]
    fn without_keys_the_scripts_leave_the_installed_keys_alone() {
        for script in [
            postgres(&FenceKeys::default()),
            mysql(&FenceKeys::default()),
        ] {
            assert!(!script.contains("DELETE FROM"), "{script}");
            assert!(script.contains("stay as they are"), "{script}");
        }
        let script = postgres(&FenceKeys::default());
        assert!(script.contains(POSTGRES));
        assert!(script.starts_with("-- ") && script.contains("\nBEGIN;\n"));
        assert!(script.ends_with("\nCOMMIT;\n"));
        assert!(mysql(&FenceKeys::default()).contains(MYSQL));
    }

    #[test]
    fn with_keys_exactly_those_are_installed_each_once() {
        let (a, b) = ([0xab; 32], [0x01; 40]);
        let script = postgres(&keys(&[&a, &b, &a]));
        let (a_hex, b_hex) = ("ab".repeat(32), "01".repeat(40));
        assert_eq!(
            script.matches(&format!("decode('{a_hex}', 'hex')")).count(),
            2
        );
        assert_eq!(
            script.matches(&format!("decode('{b_hex}', 'hex')")).count(),
            2
        );
        // Added before any other goes, so that no admit ever sees no key at all.
        assert!(script.find("INSERT INTO").unwrap() < script.find("DELETE FROM").unwrap());
        let script = mysql(&keys(&[&a, &b]));
        assert_eq!(script.matches(&format!("X'{a_hex}'")).count(), 2);
        assert!(script.find("INSERT INTO").unwrap() < script.find("DELETE FROM").unwrap());
    }

    #[test]
    fn mysql_stores_a_long_key_as_hmac_uses_it() {
        let long = [7u8; 65];
        let script = mysql(&keys(&[&long]));
        let digest: String = Sha256::digest(long)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(script.contains(&format!("X'{digest}'")), "{script}");
        assert!(!script.contains(&"07".repeat(65)));
        // PostgreSQL keeps the key as it is: its HMAC hashes a long key itself.
        assert!(postgres(&keys(&[&long])).contains(&"07".repeat(65)));
    }
}
