//! The `fencelock` binary: the lease server, its checks and tools, and `fencelock lock`.

fn main() -> std::process::ExitCode {
    fencelock_server::main()
}
