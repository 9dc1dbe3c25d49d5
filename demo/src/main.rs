//! The write-guard demo lands with the write guard itself; until then this binary only says so.

fn main() {
    eprintln!("fencelock-demo: the paused-worker demo is not built yet");
    std::process::exit(2);
}
