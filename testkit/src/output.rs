//! What a command printed: once finished, or so far, while it runs.

use std::io::{BufRead as _, BufReader, Read};
use std::process::Output;

/// Asserts that `output` is that of a command that succeeded, quoting `context`, its exit
/// status, its stdout and its stderr if not; returns its stdout.
pub fn assert_succeeded(output: &Output, context: &str) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{context}: {:?}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Asserts that `output` is that of a command that failed and said why in exactly one line
/// on stderr (blank lines aside), quoting `context` if not; returns that line.
pub fn assert_failed_in_one_line(output: &Output, context: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!output.status.success(), "{context}: succeeded\n{stderr}");
    assert_eq!(lines.len(), 1, "{context}: {stderr}");
    lines[0].to_owned()
}

/// Reads `stream` (a running command's stdout or stderr) line by line until `find` picks a
/// value out of a line, and returns that value; the lines after it are read on, and
/// dropped, by a thread of its own, as a terminal would, so that the command never blocks
/// on a full pipe. Fails the test with `what` if the stream ends first.
pub fn find_line<T>(
    stream: impl Read + Send + 'static,
    what: &str,
    mut find: impl FnMut(&str) -> Option<T>,
) -> T {
    let mut lines = BufReader::new(stream).lines();
    let found = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| find(&line))
        .unwrap_or_else(|| panic!("{what}: the output ended without it"));
    std::thread::spawn(move || lines.for_each(drop));
    found
}

/// The value of the field `name` in a log line in `tracing`'s text format
/// (`... message name=value ...`).
pub fn logged_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_line_returns_the_first_value_found() {
        let text: &[u8] = b"starting\nport=1\nport=2\n";
        let port = find_line(text, "a port", |line| {
            line.strip_prefix("port=").map(str::to_owned)
        });
        assert_eq!(port, "1");
    }

    #[test]
    #[should_panic(expected = "a port: the output ended without it")]
    fn find_line_fails_when_the_output_ends_first() {
        let text: &[u8] = b"starting\n";
        find_line(text, "a port", |line| {
            line.strip_prefix("port=").map(str::to_owned)
        });
    }

    #[test]
    fn logged_field_reads_one_field_of_a_line() {
        let line =
            "2026-01-01T00:00:00Z  INFO fencelock_demo: serving address=127.0.0.1:0 port=4321";
        assert_eq!(logged_field(line, "port"), Some("4321"));
        assert_eq!(logged_field(line, "address"), Some("127.0.0.1:0"));
        assert_eq!(logged_field(line, "sport"), None);
        assert_eq!(logged_field(line, "pid"), None);
    }
}
