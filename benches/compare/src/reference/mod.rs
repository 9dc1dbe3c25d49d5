//! The references fencelock is compared with, each used only when installed: pgbench
//! running the reference SQL against a database of its own, and a private Redis with an
//! append-only file synced on every write.

pub mod pgbench;
pub mod redis;

use std::path::{Path, PathBuf};

/// `name` found on `PATH`, as a shell would find it.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The first line `program --version` prints, or a note that it printed none.
pub fn version_of(program: &Path) -> String {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "(version unknown)".to_owned())
}
