//! Checks of a service's OpenAPI document (`GET /openapi.json`) against the live service.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// The problem document's media type.
const PROBLEM_JSON: &str = "application/problem+json";

/// Methods a path item may hold.
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Fetches `base/openapi.json` and checks that it is a valid OpenAPI 3.1 document: it
/// deserialises as one (`oas3`), every response and request body's `$ref` resolves, and every
/// operation has a success answer and documents its problems as problem documents.
pub async fn fetch_document(base: &str) -> Value {
    let response = crate::client()
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .expect("GET /openapi.json");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let text = response.text().await.expect("a body");

    let spec = oas3::from_json(&text).expect("an OpenAPI 3.1 document");
    let version = spec
        .validate_version()
        .expect("a supported OpenAPI version");
    assert_eq!((version.major, version.minor), (3, 1));
    for (path, method, operation) in spec.operations() {
        let at = format!("{method} {path}");
        assert!(operation.operation_id.is_some(), "{at} has no operationId");
        let documented = operation.responses.as_ref().map_or(0, |r| r.len());
        let responses = operation.responses(&spec);
        assert_eq!(
            responses.len(),
            documented,
            "{at}: a response does not resolve"
        );
        for (status, answer) in &responses {
            for (media, content) in &answer.content {
                content
                    .schema(&spec)
                    .unwrap_or_else(|e| panic!("{at} {status} {media}: {e}"));
            }
        }
        if let Some(body) = operation
            .request_body(&spec)
            .expect("a request body resolves")
        {
            for (media, content) in &body.content {
                let schema = content
                    .schema(&spec)
                    .unwrap_or_else(|e| panic!("{at} body {media}: {e}"));
                assert!(schema.is_some(), "{at}: a body without a schema");
            }
        }
    }

    let document: Value = serde_json::from_str(&text).expect("JSON");
    for (path, method, operation) in operations(&document) {
        let responses = operation["responses"].as_object().expect("responses");
        assert!(
            responses.keys().any(|s| s.starts_with('2')),
            "{method} {path} documents no success"
        );
        for (status, answer) in responses.iter().filter(|(s, _)| !s.starts_with('2')) {
            let schema = &answer["content"][PROBLEM_JSON]["schema"];
            let narrowed = &schema["allOf"][1]["properties"];
            assert_eq!(
                schema["allOf"][0]["$ref"], "#/components/schemas/Problem",
                "{method} {path} {status} is not a problem document"
            );
            assert!(
                narrowed["type"]["enum"]
                    .as_array()
                    .is_some_and(|s| !s.is_empty()),
                "{method} {path} {status} names no problem type"
            );
            assert_eq!(narrowed["status"]["enum"][0].to_string(), *status);
        }
    }
    document
}

/// Every operation of the document: (path, method, operation).
pub fn operations(document: &Value) -> Vec<(String, String, &Value)> {
    let mut all = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in METHODS {
            if let Some(operation) = item.get(method) {
                all.push((path.clone(), method.to_uppercase(), operation));
            }
        }
    }
    all
}

/// The documented statuses of each operation, as `"METHOD path" -> statuses`.
pub fn statuses(document: &Value) -> BTreeMap<String, BTreeSet<u16>> {
    operations(document)
        .into_iter()
        .map(|(path, method, operation)| {
            let statuses = operation["responses"]
                .as_object()
                .expect("responses")
                .keys()
                .map(|s| s.parse().expect("a numeric status"))
                .collect();
            (format!("{method} {path}"), statuses)
        })
        .collect()
}

/// The slugs a documented problem answer can carry.
pub fn slugs(document: &Value, path: &str, method: &str, status: u16) -> Vec<String> {
    let answer = &document["paths"][path][method.to_lowercase()]["responses"][status.to_string()];
    answer["content"][PROBLEM_JSON]["schema"]["allOf"][1]["properties"]["type"]["enum"]
        .as_array()
        .unwrap_or_else(|| panic!("{method} {path} documents no {status} problem"))
        .iter()
        .map(|s| s.as_str().expect("a slug").to_owned())
        .collect()
}

/// The parameters of an operation (`method` as in [`operations`]), in the document's order.
pub fn parameters<'a>(document: &'a Value, path: &str, method: &str) -> &'a [Value] {
    document["paths"][path][method.to_lowercase()]["parameters"]
        .as_array()
        .unwrap_or_else(|| panic!("{method} {path} documents no parameters"))
}

/// The names of an operation's parameters, in the document's order.
pub fn parameter_names<'a>(document: &'a Value, path: &str, method: &str) -> Vec<&'a str> {
    parameters(document, path, method)
        .iter()
        .map(|p| p["name"].as_str().expect("a parameter name"))
        .collect()
}

/// Asserts the slugs of documented problem answers, one `(path, method, status, slugs)` each.
pub fn assert_slugs(document: &Value, expected: &[(&str, &str, u16, &[&str])]) {
    for &(path, method, status, expected) in expected {
        let at = format!("{method} {path} {status}");
        assert_eq!(slugs(document, path, method, status), expected, "{at}");
    }
}

/// Checks that the live service at `base` serves exactly what the document says: every
/// documented path as documented, and none of `not_served` (paths a careless route pattern
/// could catch).
///
/// Path by path, each documented method reaches a handler (no `405`, and no `404` for want
/// of a route), and a method the document does not list is `405` with `Allow` naming
/// exactly the documented ones. A path's parameters are filled in from `values` (`{name}`
/// -> value). Each of `not_served` is `404` for every method the document knows.
pub async fn assert_serves_exactly(
    base: &str,
    document: &Value,
    values: &[(&str, &str)],
    not_served: &[&str],
) {
    let client = crate::client();
    for (template, item) in document["paths"].as_object().expect("paths") {
        let mut path = template.clone();
        for (name, value) in values {
            path = path.replace(&format!("{{{name}}}"), value);
        }
        assert!(
            !path.contains('{'),
            "no value for a parameter of {template}"
        );
        let url = format!("{base}{path}");
        let documented: BTreeSet<String> = METHODS
            .iter()
            .filter(|m| item.get(**m).is_some())
            .map(|m| m.to_uppercase())
            .collect();
        for method in &documented {
            let response = client
                .request(method.parse().unwrap(), &url)
                .send()
                .await
                .unwrap();
            let status = response.status();
            let text = response.text().await.unwrap();
            assert_ne!(status, 405, "{method} {template} is not served: {text}");
            assert!(
                !(status == 404 && text.contains("no route")),
                "{method} {template} has no route: {text}"
            );
        }
        let undocumented = ["PATCH", "PUT", "DELETE", "POST", "GET"]
            .into_iter()
            .find(|m| !documented.contains(*m))
            .expect("some method is not documented");
        let response = client
            .request(undocumented.parse().unwrap(), &url)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{undocumented} {template}");
        let allow: BTreeSet<String> = response.headers()["allow"]
            .to_str()
            .unwrap()
            .split(',')
            .map(|m| m.trim().to_owned())
            .collect();
        assert_eq!(allow, documented, "the methods served at {template}");
    }
    for path in not_served {
        for method in ["GET", "POST", "PUT", "DELETE"] {
            let response = client
                .request(method.parse().unwrap(), format!("{base}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 404, "{method} {path} is served");
        }
    }
}
