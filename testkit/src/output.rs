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
