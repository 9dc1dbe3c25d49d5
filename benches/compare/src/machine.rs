//! Facts about the machine the figures come from, and how fast it makes a small write
//! durable.

use std::fs::File;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct Machine {
    /// Cores this process may run on.
    pub cores: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub memory_gib: f64,
}

impl Machine {
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown".to_owned(), |(_, m)| m.trim().to_owned());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".to_owned(), |k| k.trim().to_owned());
        let memory_gib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
        Self {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            cpu_model,
            kernel,
            memory_gib,
        }
    }
}

/// The fdatasync measurement: 4 KiB written in place, then `fdatasync`, in a loop.
pub struct SyncRate {
    pub per_second: f64,
    pub dir: PathBuf,
    /// Whether `dir` is on the file system of PostgreSQL's data directory; `None` when that
    /// directory could not be looked at (another machine, no permission).
    pub same_fs_as_postgres: Option<bool>,
}

/// Writes 4 KiB and calls `fdatasync`, over and over for `duration`, in a 16 MiB file in
/// `dir` (written in full and synced first, so that the loop overwrites blocks in place the
/// way a write-ahead log segment is reused).
pub fn fdatasync_rate(
    dir: &Path,
    duration: Duration,
    postgres_data: Option<&Path>,
) -> std::io::Result<SyncRate> {
    const BLOCK: usize = 4096;
    const BLOCKS: u64 = 4096;
    let path = dir.join("fdatasync-probe");
    let file = File::options()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let zeros = vec![0u8; BLOCK * 256];
    for chunk in 0..BLOCKS / 256 {
        file.write_all_at(&zeros, chunk * 256 * BLOCK as u64)?;
    }
    file.sync_all()?;
    let block = vec![0xa5u8; BLOCK];
    let started = Instant::now();
    let mut syncs = 0u64;
    while started.elapsed() < duration {
        file.write_all_at(&block, (syncs % BLOCKS) * BLOCK as u64)?;
        file.sync_data()?;
        syncs += 1;
    }
    let per_second = syncs as f64 / started.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path)?;
    let same_fs_as_postgres = postgres_data.and_then(|data| {
        let data = std::fs::metadata(data).ok()?;
        Some(std::fs::metadata(dir).ok()?.dev() == data.dev())
    });
    Ok(SyncRate {
        per_second,
        dir: dir.to_owned(),
        same_fs_as_postgres,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdatasync_rate_counts_syncs_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let rate =
            fdatasync_rate(dir.path(), Duration::from_millis(100), Some(dir.path())).unwrap();
        assert!(rate.per_second > 0.0);
        assert_eq!(rate.same_fs_as_postgres, Some(true));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
