//! Requests the HTTP parser itself refuses, before any route: still problem documents,
//! sent over raw TCP since no HTTP client would send them.

use std::collections::BTreeMap;

use crate::helpers::{StoreKind, TestApp, assert_raw_problem};

const REQUESTS: &str = "fencelock_http_requests_total";

/// One request the parser refuses: what is sent, the answer's status, type and instance.
pub struct Refused {
    pub name: &'static str,
    pub request: Vec<u8>,
    pub status: u16,
    pub kind: &'static str,
    /// The request's target, also where the head parsed and its framing headers were refused
    /// (and whatever the client sent after it).
    pub instance: String,
}

fn head(request_line: &str, headers: &str) -> Vec<u8> {
    format!("{request_line}\r\nHost: x\r\n{headers}\r\n").into_bytes()
}

pub fn refused_requests() -> Vec<Refused> {
    let many_headers: String = (0..101).map(|i| format!("X-H{i}: v\r\n")).collect();
    let long_path = format!("/{}", "a".repeat(100 * 1024));
    let bad = |name, request, instance: &str| Refused {
        name,
        request,
        status: 400,
        kind: "malformed-request",
        instance: instance.to_owned(),
    };
    let smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    vec![
        bad(
            "control byte in the path",
            head("GET /lo\x01cks HTTP/1.1", ""),
            "/lo%01cks",
        ),
        bad(
            "control byte in a header value",
            head("GET /healthz HTTP/1.1", "X-A: a\x01b\r\n"),
            "/healthz",
        ),
        bad(
            "space in a header name",
            head("GET /healthz HTTP/1.1", "X A: b\r\n"),
            "/healthz",
        ),
        bad(
            "non-numeric Content-Length",
            head(
                "POST /locks/a HTTP/1.1",
                "Content-Type: application/json\r\nContent-Length: abc\r\n",
            ),
            "/locks/a",
        ),
        bad(
            "Content-Length with Transfer-Encoding",
            [
                head(
                    "POST /locks/a HTTP/1.1",
                    "Content-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                ),
                b"0\r\n\r\n".to_vec(),
            ]
            .concat(),
            "/locks/a",
        ),
        // The refusal is the first request's, not the one sent after it.
        bad(
            "Content-Length with Transfer-Encoding, a request after it",
            [
                head(
                    "POST /locks/a HTTP/1.1",
                    "Content-Type: application/json\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                ),
                smuggled.to_vec(),
            ]
            .concat(),
            "/locks/a",
        ),
        bad(
            "no Host header",
            [b"DELETE /locks/a HTTP/1.1\r\n\r\n".as_slice(), smuggled].concat(),
            "/locks/a",
        ),
        bad(
            "an HTTP/1.0 POST without Content-Length",
            [
                b"POST /locks/a HTTP/1.0\r\nContent-Type: application/json\r\n\r\n".as_slice(),
                smuggled,
            ]
            .concat(),
            "/locks/a",
        ),
        Refused {
            name: "101 headers",
            request: head("GET /healthz HTTP/1.1", &many_headers),
            status: 431,
            kind: "headers-too-large",
            instance: "/healthz".to_owned(),
        },
        // Longer than a URI may be (65,534 bytes): refused as a bad request by the parser at
        // first, as a head too large further on, and answered as what it is.
        Refused {
            name: "66,000-byte path",
            request: head(&format!("GET {} HTTP/1.1", &long_path[..66_000]), ""),
            status: 414,
            kind: "uri-too-long",
            instance: format!("{}...", &long_path[..256]),
        },
        Refused {
            name: "100 KiB path",
            request: head(&format!("GET {long_path} HTTP/1.1"), ""),
            status: 414,
            kind: "uri-too-long",
            instance: format!("{}...", &long_path[..256]),
        },
        Refused {
            name: "200 KiB path",
            request: head(&format!("GET /{} HTTP/1.1", "a".repeat(200 * 1024)), ""),
            status: 414,
            kind: "uri-too-long",
            instance: format!("{}...", &long_path[..256]),
        },
    ]
}

/// Every refusal of the HTTP parser is a problem document, with the request target as its
/// instance.
async fn parser_refusals_are_problem_documents(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    for case in refused_requests() {
        let response = app.raw(&case.request).await;
        let problem = assert_raw_problem(&response, case.status, case.kind);
        // Every answer carries its request id, these too.
        assert_eq!(
            response.header("x-request-id"),
            problem["request_id"].as_str(),
            "{}",
            case.name
        );
        assert_eq!(problem["instance"], case.instance, "{}", case.name);
        // The server is fine afterwards.
        assert_eq!(app.get("/healthz").await.status(), 200, "{}", case.name);
    }
}

/// A refused head keeps the client's `X-Request-Id` by the rule of every request: a valid
/// one is the answer's, an invalid one is replaced.
async fn parser_refusals_keep_a_valid_request_id(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let many_headers: String = (0..101).map(|i| format!("X-H{i}: v\r\n")).collect();
    for (name, request, status) in [
        (
            "framing headers refused, another request after them",
            [
                head(
                    "POST /locks/a HTTP/1.1",
                    "X-Request-Id: kept.by_the-parser\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n",
                ),
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: the.next-one\r\n\r\n".to_vec(),
            ]
            .concat(),
            400,
        ),
        (
            "control byte in another header",
            head(
                "GET /healthz HTTP/1.1",
                "X-Request-Id: kept.by_the-parser\r\nX-A: a\x01b\r\n",
            ),
            400,
        ),
        (
            "too many headers",
            head(
                "GET /healthz HTTP/1.1",
                &format!("X-Request-Id: kept.by_the-parser\r\n{many_headers}"),
            ),
            431,
        ),
    ] {
        let response = app.raw(&request).await;
        assert_eq!(response.status, status, "{name}");
        assert_eq!(
            response.header("x-request-id"),
            Some("kept.by_the-parser"),
            "{name}"
        );
        let problem: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        assert_eq!(problem["request_id"], "kept.by_the-parser", "{name}");
    }
    let response = app
        .raw(&head(
            "GET /healthz HTTP/1.1",
            "X-Request-Id: not kept\r\nX-A: a\x01b\r\n",
        ))
        .await;
    assert_eq!(response.status, 400);
    let id = response.header("x-request-id").expect("a request id");
    assert_ne!(id, "not kept");
    assert!(!id.is_empty());
}

/// A `CONNECT` names an authority, not a path: the problem's instance is that target.
async fn connect_gets_its_target_as_instance(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let response = app
        .raw(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        .await;
    let problem = assert_raw_problem(&response, 404, "not-found");
    assert_eq!(problem["instance"], "example.com:443");
}

/// The parser's refusals are answers of this server like any other: counted in
/// `fencelock_http_requests_total` by status, under the route `unmatched` and the method of
/// their request line (`other` where there is none).
async fn parser_refusals_are_counted(kind: StoreKind) {
    let app = TestApp::spawn(kind).await;
    let mut expected: BTreeMap<(String, String), f64> = BTreeMap::new();
    for case in refused_requests() {
        let response = app.raw(&case.request).await;
        assert_eq!(response.status, case.status, "{}", case.name);
        let method = case.request.split(|b| *b == b' ').next().unwrap();
        *expected
            .entry((
                String::from_utf8(method.to_vec()).unwrap(),
                case.status.to_string(),
            ))
            .or_default() += 1.0;
    }
    // A request line that is not one: no method to name.
    let response = app.raw(b"\x01\x02\x03\r\n\r\n").await;
    assert_eq!(response.status, 400);
    *expected
        .entry(("other".to_owned(), "400".to_owned()))
        .or_default() += 1.0;

    let metrics = app.metrics().await;
    for ((method, status), count) in &expected {
        let labels = [
            ("route", "unmatched"),
            ("method", method.as_str()),
            ("status", status.as_str()),
        ];
        assert_eq!(
            metrics.value(REQUESTS, &labels),
            *count,
            "{method} {status} refused by the parser"
        );
    }
    let refused: f64 = metrics
        .family(REQUESTS)
        .iter()
        .filter(|s| s.labels["route"] == "unmatched")
        .map(|s| s.value)
        .sum();
    assert_eq!(
        refused,
        expected.values().sum::<f64>(),
        "every refusal once"
    );
}

contract!(
    parser_refusals_are_counted,
    parser_refusals_are_problem_documents,
    parser_refusals_keep_a_valid_request_id,
    connect_gets_its_target_as_instance,
);
