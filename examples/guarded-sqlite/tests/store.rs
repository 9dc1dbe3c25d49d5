//! The store on a temporary SQLite file: what the guard admits, what it refuses, and that a
//! refused write leaves nothing behind.

use std::path::Path;

use fencelock::domain::{Fence, FenceKey, FenceKeys};
use fencelock::guard::{FencingToken, GuardError};
use fencelock::metrics::{self, Registry};
use guarded_sqlite::Store;
use rusqlite::OptionalExtension as _;

/// What the file holds for `key`, read on a connection of the test's own: the document, and
/// the guard's highest fence.
fn stored(path: &Path, key: &str) -> (Option<String>, Option<i64>) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let body = conn
        .query_row("SELECT body FROM docs WHERE key = ?1", [key], |r| r.get(0))
        .optional()
        .unwrap();
    let fence = conn
        .query_row("SELECT fence FROM fence_guard WHERE key = ?1", [key], |r| {
            r.get(0)
        })
        .optional()
        .unwrap();
    (body, fence)
}

/// A refusal's HTTP status and problem type.
fn refusal(error: &GuardError) -> (u16, &'static str) {
    (error.status().as_u16(), error.kind())
}

#[test]
fn a_write_with_a_lower_fence_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.db");
    let registry = Registry::new();
    let mut store = Store::open(&path, FenceKeys::default(), &registry).unwrap();

    store
        .put("report", &FencingToken::new("5"), "by fence 5")
        .expect("fence 5 is admitted");
    assert_eq!(
        stored(&path, "report"),
        (Some("by fence 5".to_owned()), Some(5))
    );

    let late = store
        .put("report", &FencingToken::new("3"), "by fence 3")
        .expect_err("fence 3 is stale");
    assert_eq!(refusal(&late), (409, "stale-fence"), "{late}");
    let GuardError::Stale { current, .. } = late else {
        panic!("not a stale write: {late:?}");
    };
    assert_eq!(current.get(), 5);
    // Nothing of the late write: neither its body nor its fence.
    assert_eq!(
        stored(&path, "report"),
        (Some("by fence 5".to_owned()), Some(5))
    );
    assert_eq!(store.get("report").unwrap().as_deref(), Some("by fence 5"));

    let not_a_fence = store
        .put("report", &FencingToken::new("five"), "not a fence")
        .expect_err("not a fence");
    assert_eq!(refusal(&not_a_fence), (400, "malformed-request"));

    // An equal or greater fence still writes: the lease that wrote 5, or a newer one.
    store
        .put("report", &FencingToken::new("5"), "by fence 5, again")
        .unwrap();
    store
        .put("report", &FencingToken::new("8"), "by fence 8")
        .unwrap();
    assert_eq!(
        stored(&path, "report"),
        (Some("by fence 8".to_owned()), Some(8))
    );

    // The guard counted what it decided: three writes admitted, one stale.
    let counted = metrics::render(&registry);
    for line in [
        r#"fencelock_guard_writes_total{outcome="admitted"} 3"#,
        r#"fencelock_guard_writes_total{outcome="stale"} 1"#,
    ] {
        assert!(
            counted.lines().any(|l| l == line),
            "no {line:?} in:\n{counted}"
        );
    }
}

#[test]
fn the_fence_survives_the_store_being_opened_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.db");
    let mut store = Store::open(&path, FenceKeys::default(), &Registry::new()).unwrap();
    store
        .put("report", &FencingToken::new("5"), "by fence 5")
        .unwrap();
    drop(store);

    let mut reopened = Store::open(&path, FenceKeys::default(), &Registry::new()).unwrap();
    let late = reopened
        .put("report", &FencingToken::new("3"), "by fence 3")
        .expect_err("fence 3 is stale after a restart too");
    assert_eq!(refusal(&late), (409, "stale-fence"));
    assert_eq!(
        reopened.get("report").unwrap().as_deref(),
        Some("by fence 5")
    );
}

#[test]
fn a_guard_with_fence_keys_refuses_a_bare_fence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("docs.db");
    let key =
        FenceKey::from_bytes(b"a fence key of at least 32 bytes, for tests".to_vec()).unwrap();
    let keys = FenceKeys::new(vec![key.clone()]);
    let mut store = Store::open(&path, keys, &Registry::new()).unwrap();

    let bare = store
        .put("ledger", &FencingToken::new("7"), "by a bare fence")
        .expect_err("a bare fence is refused");
    assert_eq!(refusal(&bare), (403, "invalid-fence-token"), "{bare}");
    let other = key.sign("another-key", Fence::new(7).unwrap());
    let forged = store
        .put(
            "ledger",
            &FencingToken::new(other),
            "signed for another key",
        )
        .expect_err("a token of another key is refused");
    assert_eq!(refusal(&forged), (403, "invalid-fence-token"), "{forged}");
    assert_eq!(stored(&path, "ledger"), (None, None));

    // The token the lease server signed for this key is admitted.
    let signed = key.sign("ledger", Fence::new(7).unwrap());
    store
        .put("ledger", &FencingToken::new(signed), "by a signed fence")
        .expect("a token signed for the key is admitted");
    assert_eq!(
        stored(&path, "ledger"),
        (Some("by a signed fence".to_owned()), Some(7))
    );
}
