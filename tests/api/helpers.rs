pub use fencelock_testkit::*;

/// Values that are no JSON integer, whatever the field's bounds (API.md, *Input rules*): a
/// string, a float, a bool, an exponent, a number beyond any range, an array, an object.
pub const NOT_INTEGERS: [&str; 7] = ["\"5\"", "5.0", "true", "1e2", "1e400", "[]", "{}"];

/// The status of a renew by `owner` for [`TTL`] seconds.
pub async fn renew_status(app: &TestApp, resource: &str, owner: &str) -> u16 {
    app.renew(
        resource,
        serde_json::json!({ "owner": owner, "ttl_seconds": TTL }),
    )
    .await
    .status()
    .as_u16()
}

/// The status of a release by `owner`, with no fence.
pub async fn release_status(app: &TestApp, resource: &str, owner: &str) -> u16 {
    app.release(resource, serde_json::json!({ "owner": owner }))
        .await
        .status()
        .as_u16()
}

/// Asserts each unlabelled series of `metrics` has its expected value.
pub fn assert_unlabelled(metrics: &Exposition, expected: &[(&str, f64)]) {
    for &(name, value) in expected {
        assert_eq!(metrics.value(name, &[]), value, "{name}");
    }
}
