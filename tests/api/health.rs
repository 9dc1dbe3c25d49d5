//! `/healthz` and `/readyz` with a working store (outages are in `outage`).

use serde_json::Value;

use crate::helpers::{StoreKind, TestApp};

async fn healthz_and_readyz_answer_200(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    for path in ["/healthz", "/readyz"] {
        let response = app.get(path).await;
        assert_eq!(response.status(), 200, "{path}");
        let body: Value = response.json().await.unwrap();
        assert!(body["status"].is_string());
    }
}

contract!(healthz_and_readyz_answer_200);
