//! `fencelock-model`: checks the model to a chosen depth and prints what it explored, and a
//! readable trace of every counterexample found.

use std::process::ExitCode;

use fencelock_model::{Config, Finish, check};

const USAGE: &str = "\
usage: fencelock-model [--depth N] [--workers 2|3] [--ttl T] [--max-time T] [--attempts N]
                       [--threads N] [--lossy] [--no-crashes] [--variant NAME]

Checks every state of fencelock's protocol model reachable in at most N steps (default 13).
Variants: fencelock (default), unguarded, per-row-fences, check-then-apply,
in-memory-counter, clock-ahead (all but the first are broken on purpose).
Exits 1 when a property fails (its counterexample is printed).";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("fencelock-model: {message}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> Result<ExitCode, String> {
    let mut cfg = Config::fencelock();
    let mut depth = 13;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut variant = "fencelock".to_owned();
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--depth" => depth = number(&value()?)?,
            "--workers" => cfg.workers = number(&value()?)?,
            "--ttl" => cfg.ttl = number(&value()?)?,
            "--max-time" => cfg.max_time = number(&value()?)?,
            "--attempts" => cfg.attempts = number(&value()?)?,
            "--threads" => threads = number(&value()?)?,
            "--variant" => variant = value()?,
            "--lossy" => cfg.lossy = true,
            "--no-crashes" => cfg.server_crashes = false,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if !(1..=3).contains(&cfg.workers) || cfg.ttl == 0 || cfg.attempts == 0 || threads == 0 {
        return Err("--workers is 1-3; --ttl, --attempts and --threads are at least 1".into());
    }
    let cfg = cfg
        .variant(&variant)
        .ok_or_else(|| format!("unknown variant {variant}"))?;
    println!(
        "checking {variant}: {} workers, ttl {}, clock 0..{}, {} attempts each, {} network, \
         server crashes {}; depth {depth}, {threads} threads",
        cfg.workers,
        cfg.ttl,
        cfg.max_time,
        cfg.attempts,
        if cfg.lossy {
            "delaying, reordering, duplicating and lossy"
        } else {
            "delaying, reordering and duplicating"
        },
        if cfg.server_crashes { "on" } else { "off" },
    );
    // A broken variant stops at its first counterexample; fencelock itself is explored to
    // the end.
    let finish = if variant == "fencelock" {
        Finish::Exhausted
    } else {
        Finish::FirstCounterexample
    };
    let outcome = check(cfg, depth, threads, finish);
    println!("explored {}", outcome.figures());
    print!("{}", outcome.counterexamples());
    for name in outcome.reached.keys() {
        println!("reached: {name}");
    }
    // A missing example is reported, not failed: with three workers an applied write by each
    // takes more steps than a practical depth. `cargo test` requires both examples.
    if !outcome.stopped_early {
        for name in outcome.unreached() {
            println!("not reached within the depth: {name}");
        }
    }
    for name in outcome.violated.keys() {
        println!("VIOLATED: {name}");
    }
    if outcome.violated.is_empty() {
        println!("no property is violated within the bounds");
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::FAILURE)
    }
}

fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not a number in range"))
}
