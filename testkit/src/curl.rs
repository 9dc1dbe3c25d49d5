//! The `curl` commands of a documentation page's shell blocks, read as a shell would read
//! them, and played in order against a fresh service as a reader would paste them.
//!
//! Shared by `tests/api/readme.rs` (the lease server, `localhost:8080`) and
//! `demo/tests/docs.rs` (the demo store, `localhost:8081`).
//!
//! A comment line right after a command that starts with a status (`# 409 ...`) is the
//! status that command must get; without one, the command must succeed.

/// One `curl` command to `localhost`.
#[derive(Debug)]
struct Curl {
    /// The command as written, continuation lines joined.
    line: String,
    method: String,
    /// The path and query, as sent.
    path: String,
    headers: Vec<(String, String)>,
    body: Option<String>,
    /// The status the page says the command gets; `None`: any success.
    expected: Option<u16>,
}

/// Every `curl` command to `localhost:{port}` in the shell blocks of `markdown`, in order.
/// A `curl` flag the replay does not know fails the test: a page must not show a command
/// whose meaning the replay cannot follow.
fn commands(markdown: &str, port: u16) -> Vec<Curl> {
    let host = format!("localhost:{port}");
    shell_commands(markdown)
        .into_iter()
        .filter_map(|(line, expected)| {
            let words = words(&line);
            (words.first().map(String::as_str) == Some("curl")
                && words
                    .iter()
                    .any(|w| w.trim_start_matches("http://").starts_with(&host)))
            .then(|| parse(&line, &words[1..], &host, expected))
        })
        .collect()
}

/// Plays the commands of `page` (its text, `markdown`) to `localhost:{port}` in order against
/// the service at `base` (`http://127.0.0.1:{port}` of the fresh service), each answered with
/// the status the page says, or a success; the page must have at least `at_least`.
pub async fn play(page: &str, markdown: &str, port: u16, base: &str, at_least: usize) {
    let commands = commands(markdown, port);
    assert!(commands.len() >= at_least, "{page}: {commands:#?}");
    let http = crate::client();
    for command in commands {
        let method: reqwest::Method = command.method.parse().expect("an HTTP method");
        let mut request = http.request(method, format!("{base}{}", command.path));
        for (name, value) in &command.headers {
            request = request.header(name, value);
        }
        if let Some(body) = &command.body {
            request = request.body(body.clone());
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        match command.expected {
            Some(expected) => assert_eq!(
                status.as_u16(),
                expected,
                "{page}: `{}` answered {text}",
                command.line
            ),
            None => assert!(
                status.is_success(),
                "{page}: `{}` answered {status}: {text}",
                command.line
            ),
        }
    }
}

/// The commands of the shell blocks (`sh`, `bash`, `shell`), continuation lines joined, each
/// with the status of the comment line right after it, if that comment starts with one.
fn shell_commands(markdown: &str) -> Vec<(String, Option<u16>)> {
    let mut commands: Vec<(String, Option<u16>)> = Vec::new();
    let mut in_shell = false;
    let mut current = String::new();
    let mut just_ended = false;
    for line in markdown.lines() {
        let trimmed = line.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            in_shell = !in_shell && matches!(info.trim(), "sh" | "bash" | "shell");
            just_ended = false;
            continue;
        }
        if !in_shell {
            continue;
        }
        if current.is_empty() {
            if let Some(comment) = trimmed.strip_prefix('#') {
                if just_ended {
                    commands.last_mut().unwrap().1 = status(comment);
                }
                just_ended = false;
                continue;
            }
            if trimmed.is_empty() {
                just_ended = false;
                continue;
            }
        }
        current.push_str(trimmed.trim_end_matches('\\').trim_end());
        current.push(' ');
        if !trimmed.ends_with('\\') {
            commands.push((std::mem::take(&mut current).trim_end().to_owned(), None));
            just_ended = true;
        }
    }
    commands
}

/// `409` from a comment ` 409 {"type":...}`.
fn status(comment: &str) -> Option<u16> {
    let comment = comment.trim_start();
    let digits = comment.split(' ').next()?;
    if digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse().ok()
    } else {
        None
    }
}

/// The words of a command line as a shell splits them: single quotes keep everything,
/// double quotes keep all but `\"` and `\\`; an unquoted `#` word starts a comment, and an
/// unquoted `|`, `;`, `&` or `>` ends the command.
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    w.push(c);
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' if matches!(chars.peek(), Some('"' | '\\')) => {
                            w.push(chars.next().unwrap());
                        }
                        c => w.push(c),
                    }
                }
            }
            c if c.is_whitespace() => words.extend(word.take()),
            '#' if word.is_none() => break,
            '|' | ';' | '&' | '>' => break,
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

fn parse(line: &str, args: &[String], host: &str, expected: Option<u16>) -> Curl {
    let mut method = None;
    let mut headers = Vec::new();
    let mut data = Vec::new();
    let mut get = false;
    let mut url = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| panic!("{arg} without a value in `{line}`"))
                .clone()
        };
        match arg.as_str() {
            "-s" | "--silent" | "-S" | "--show-error" | "-sS" => {}
            "-X" | "--request" => method = Some(value()),
            "-H" | "--header" => {
                let header = value();
                let (name, value) = header
                    .split_once(':')
                    .unwrap_or_else(|| panic!("header {header:?} in `{line}`"));
                headers.push((name.trim().to_owned(), value.trim().to_owned()));
            }
            "-d" | "--data" | "--data-raw" => data.push(value()),
            "-G" | "--get" => get = true,
            other if other.starts_with('-') => {
                panic!("the replay does not know the curl flag {other} of `{line}`")
            }
            other => {
                assert!(url.is_none(), "two URLs in `{line}`");
                url = Some(other.trim_start_matches("http://").to_owned());
            }
        }
    }
    let url = url.unwrap_or_else(|| panic!("no URL in `{line}`"));
    let mut path = url
        .strip_prefix(host)
        .unwrap_or_else(|| panic!("`{line}` is not for {host}"))
        .to_owned();
    let body = if get {
        if !data.is_empty() {
            path.push(if path.contains('?') { '&' } else { '?' });
            path.push_str(&data.join("&"));
        }
        None
    } else {
        (!data.is_empty()).then(|| data.join("&"))
    };
    let method = method.unwrap_or_else(|| if body.is_some() { "POST" } else { "GET" }.to_owned());
    Curl {
        line: line.to_owned(),
        method,
        path,
        headers,
        body,
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_read_as_a_shell_reads_them() {
        let page = "text\n```sh\n\
        curl -s -X POST localhost:8080/locks/a -H 'content-type: application/json' \\\n\
        \x20    -d '{\"owner\":\"o w\",\"ttl_seconds\":1}'\n\
        # {\"acquired\":true}\n\
        curl -s -G localhost:8080/locks -d prefix=a -d limit=2   # a page\n\
        # 422 {\"type\":\"validation-failed\"}\n\
        curl -s localhost:8081/docs/a\n\
        # or: curl -s localhost:8080/locks/b\n\
        curl -s localhost:8080/openapi.json | python3 -m json.tool\n\
        ```\n```json\ncurl -s localhost:8080/not-a-command\n```\n";
        let found = commands(page, 8080);
        let seen: Vec<_> = found
            .iter()
            .map(|c| {
                (
                    c.method.as_str(),
                    c.path.as_str(),
                    c.body.as_deref(),
                    c.expected,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "POST",
                    "/locks/a",
                    Some("{\"owner\":\"o w\",\"ttl_seconds\":1}"),
                    None
                ),
                ("GET", "/locks?prefix=a&limit=2", None, Some(422)),
                ("GET", "/openapi.json", None, None),
            ]
        );
        assert_eq!(
            found[0].headers,
            [("content-type".to_owned(), "application/json".to_owned())]
        );
        assert_eq!(commands(page, 8081).len(), 1);
    }
}
