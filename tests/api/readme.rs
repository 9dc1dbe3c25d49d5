//! The README's `curl` examples, played in order against a fresh server, as a new user would
//! paste them: each must succeed.

use reqwest::Method;

use crate::helpers::{StoreKind, TestApp};

/// One `curl` command of the README: method, path and body.
#[derive(Debug)]
struct Example {
    method: Method,
    path: String,
    body: Option<String>,
}

/// Every `curl ... localhost:8080...` command in the README's shell blocks, joined across
/// `\` line continuations, in order.
fn examples(readme: &str) -> Vec<Example> {
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in readme.lines() {
        let line = line.trim();
        if current.is_empty() && !line.starts_with("curl ") {
            continue;
        }
        current.push_str(line.trim_end_matches('\\'));
        current.push(' ');
        if !line.ends_with('\\') {
            commands.push(std::mem::take(&mut current));
        }
    }
    commands
        .iter()
        .filter(|c| c.contains("localhost:8080"))
        .map(|command| {
            let method = command
                .split_once("-X ")
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .map_or(Method::GET, |m| m.parse().expect("an HTTP method"));
            let after_host = command.split_once("localhost:8080").unwrap().1;
            let path = after_host.split_whitespace().next().unwrap().to_owned();
            let body = command
                .split_once("-d '")
                .map(|(_, rest)| rest.split_once('\'').expect("a closing quote").0.to_owned());
            Example { method, path, body }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_examples_work_on_a_fresh_server() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let examples = examples(&readme);
    assert!(examples.len() >= 5, "{examples:#?}");
    let app = TestApp::spawn(StoreKind::Sqlite).await;
    for example in examples {
        let mut request = app
            .client
            .request(example.method.clone(), app.url(&example.path));
        if let Some(body) = &example.body {
            request = request
                .header("content-type", "application/json")
                .body(body.clone());
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "{example:?} answered {status}: {text}");
    }
}
