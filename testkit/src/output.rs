//! What a finished command printed.

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
