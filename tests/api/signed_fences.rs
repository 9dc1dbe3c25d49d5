//! Signed fences — with `--fence-key`, every lock object given to its holder carries a
//! `fence_token` signed for its resource and fence, inspect included.

use fencelock::domain::fence_token::TokenError;
use fencelock::domain::{Fence, FenceKey, FenceKeys};
use serde_json::{Value, json};

use crate::helpers::{StoreKind, TTL, TestApp, TestDb, assert_failed_in_one_line, fence};

fn key() -> FenceKey {
    FenceKey::from_bytes((0..32).map(|_| rand::random::<u8>()).collect()).unwrap()
}

async fn signed_app(kind: StoreKind, key: &FenceKey) -> TestApp {
    let key = key.clone();
    TestApp::spawn_on(TestDb::new(kind).await, move |settings| {
        settings.fence_key = Some(key);
    })
    .await
}

/// The token of `lock`, checked against `key` for its own resource and fence.
fn assert_signed(lock: &Value, key: &FenceKey) {
    let token = lock["fence_token"]
        .as_str()
        .unwrap_or_else(|| panic!("{lock}"));
    let resource = lock["resource"].as_str().unwrap();
    let keys = FenceKeys::new(vec![key.clone()]);
    assert_eq!(
        keys.verify(resource, token).map(Fence::get),
        Ok(fence(lock)),
        "{lock}"
    );
    assert!(token.starts_with(&format!("{}.", fence(lock))), "{token}");
}

async fn holders_get_a_fence_token_that_verifies(kind: StoreKind) {
    let key = key();
    let app = signed_app(kind, &key).await;

    let lock = app.acquire_ok("job:1", "a", TTL).await;
    assert_signed(&lock, &key);
    // Another resource's token does not verify for this one: a token, but forged for it
    // (the guard's 403). Respelled or cut, it is no token at all (the guard's 400).
    let token = lock["fence_token"].as_str().unwrap();
    let keys = FenceKeys::new(vec![key.clone()]);
    let forged = TokenError::Forged {
        resource: "job:2".to_owned(),
    };
    assert_eq!(keys.verify("job:2", token), Err(forged));
    for malformed in [format!("0{token}"), token[..token.len() - 1].to_owned()] {
        assert_eq!(
            keys.verify("job:1", &malformed),
            Err(TokenError::Malformed),
            "{malformed}"
        );
    }

    let renew = json!({"owner": "a", "ttl_seconds": TTL, "fence": fence(&lock)});
    let renewed = app.renew_ok("job:1", renew).await;
    assert_signed(&renewed, &key);
    assert_eq!(renewed["fence_token"], lock["fence_token"]);

    let again = app.acquire_ok("job:1", "a", TTL).await;
    assert_signed(&again, &key);
    assert_ne!(again["fence_token"], lock["fence_token"]);

    // Inspect shows the live lease's token too, as it shows its fence (API.md: every lock
    // object carries it).
    let inspected: Value = app.inspect("job:1").await.json().await.unwrap();
    assert_eq!(fence(&inspected), fence(&again));
    assert_eq!(
        inspected["fence_token"], again["fence_token"],
        "{inspected}"
    );
}

async fn without_a_key_there_is_no_fence_token(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let lock = app.acquire_ok("job:1", "a", TTL).await;
    assert!(lock.get("fence_token").is_none(), "{lock}");
}

contract!(
    holders_get_a_fence_token_that_verifies,
    without_a_key_there_is_no_fence_token,
    the_document_shows_fence_token_as_optional,
);

/// A key file that is missing, empty or shorter than 32 bytes stops start-up with one line
/// naming it.
#[test]
fn a_bad_key_file_stops_startup_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.key");
    std::fs::write(&short, [7; 31]).unwrap();
    let missing = dir.path().join("missing.key");
    for (file, by_env) in [(&short, false), (&missing, true)] {
        let mut command = crate::process::command(None, dir.path());
        if by_env {
            command.env("FENCELOCK_FENCE_KEY", file);
        } else {
            command.arg("--fence-key").arg(file);
        }
        let line = assert_failed_in_one_line(&command.output().unwrap(), &format!("{file:?}"));
        assert!(line.starts_with("fencelock: --fence-key"), "{line}");
        let name = file.file_name().unwrap().to_str().unwrap();
        assert!(line.contains(name), "{line}");
        // The OS's reason (`No such file or directory (os error 2)`) is said once.
        assert!(line.matches("os error").count() <= 1, "{line}");
    }
    // The server signs with one key; `fencelock guard` is where several are given.
    let good = dir.path().join("good.key");
    std::fs::write(&good, [7; 32]).unwrap();
    let mut command = crate::process::command(None, dir.path());
    command
        .arg("--fence-key")
        .arg(&good)
        .arg("--fence-key")
        .arg(&good);
    let line = assert_failed_in_one_line(&command.output().unwrap(), "two --fence-key");
    assert!(
        line.starts_with("fencelock: --fence-key: the server signs with one key"),
        "{line}"
    );
}

/// The lock objects' schemas document `fence_token` as an optional string.
async fn the_document_shows_fence_token_as_optional(kind: StoreKind) {
    let app = signed_app(kind, &key()).await;
    let document: Value = app.get("/openapi.json").await.json().await.unwrap();
    let schemas = &document["components"]["schemas"];
    let lock = &schemas["Lock"];
    assert_eq!(
        lock["properties"]["fence_token"]["type"], "string",
        "{lock}"
    );
    let required = lock["required"].as_array().unwrap();
    assert!(!required.contains(&json!("fence_token")), "{lock}");
    let live = &schemas["LiveLease"];
    assert_eq!(
        live["properties"]["fence_token"]["type"], "string",
        "{live}"
    );
    // A live answer matches the pattern the document gives.
    let pattern = lock["properties"]["fence_token"]["pattern"]
        .as_str()
        .unwrap();
    let lock = app.acquire_ok("job:1", "a", TTL).await;
    let token = lock["fence_token"].as_str().unwrap();
    assert!(
        regex_lite::Regex::new(pattern).unwrap().is_match(token),
        "{pattern} {token}"
    );
}
