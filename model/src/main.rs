//! `fencelock-model`: checks the models to a chosen depth and prints what they explored, and a
//! readable trace of every counterexample found.

use std::process::ExitCode;

use fencelock_model::rules::{Broken, Rules};
use fencelock_model::{Config, Explain, Finish, Outcome, QueueConfig, check, check_queue};

const USAGE: &str = "\
usage: fencelock-model [--depth N] [--threads N] [--variant NAME] [--model actor|queue]
                       [--workers 2|3] [--ttl T] [--max-time T] [--attempts N] [--lossy]
                       [--no-crashes]
                       [--clients 1-3] [--resources 1|2] [--wait T] [--lock-delay T] [--sqlite]

Checks every state reachable in at most N steps (default 13 for the actor model, 10 for the
queue model) of fencelock's two models: the actor model (a lease server, a guarded store and
workers over a faulty network: --workers, --attempts, --lossy, --no-crashes) and the queue
model (clients that wait, renew, release and leave on two resources of one store: --clients,
--resources, --wait, --lock-delay, --sqlite for SQLite's rules instead of PostgreSQL's).
--ttl and --max-time apply to both. --model checks only one of them, and so does a flag that
only one of them takes.
Variants: fencelock (default: both models), and broken on purpose: unguarded,
per-row-fences, check-then-apply, in-memory-counter, clock-ahead (actor model);
handover-skips-queue, handover-to-departed, renew-revives-expired, lock-delay-ignored (queue
model).
Exits 1 when a property fails (its counterexample is printed).";

/// The flags only the actor model takes, and those only the queue model takes.
const ACTOR_FLAGS: [&str; 4] = ["--workers", "--attempts", "--lossy", "--no-crashes"];
const QUEUE_FLAGS: [&str; 5] = [
    "--clients",
    "--resources",
    "--wait",
    "--lock-delay",
    "--sqlite",
];

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
    let mut queue = QueueConfig::fencelock();
    let mut depth = None;
    let mut threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut variant = "fencelock".to_owned();
    let mut only = None;
    // A flag of one model alone selects that model.
    let (mut actor_flag, mut queue_flag) = (false, false);
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        actor_flag |= ACTOR_FLAGS.contains(&flag.as_str());
        queue_flag |= QUEUE_FLAGS.contains(&flag.as_str());
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--depth" => depth = Some(number(&value()?)?),
            "--workers" => cfg.workers = number(&value()?)?,
            "--ttl" => {
                cfg.ttl = number(&value()?)?;
                queue.ttl = cfg.ttl.into();
            }
            "--max-time" => {
                cfg.max_time = number(&value()?)?;
                queue.max_time = cfg.max_time.into();
            }
            "--attempts" => cfg.attempts = number(&value()?)?,
            "--clients" => queue.clients = number(&value()?)?,
            "--resources" => queue.resources = number(&value()?)?,
            "--wait" => queue.wait = number(&value()?)?,
            "--lock-delay" => queue.lock_delay = number(&value()?)?,
            "--sqlite" => queue.rules = Rules::SQLITE,
            "--threads" => threads = number(&value()?)?,
            "--variant" => variant = value()?,
            "--model" => only = Some(value()?),
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
    if !(1..=3).contains(&queue.clients) || !(1..=2).contains(&queue.resources) {
        return Err("--clients is 1-3 and --resources 1-2".into());
    }
    // A broken variant stops at its first counterexample; fencelock itself is explored to
    // the end.
    let finish = if variant == "fencelock" {
        Finish::Exhausted
    } else {
        Finish::FirstCounterexample
    };
    let broken = Broken::from_name(&variant);
    let (actor, queued) = match only.as_deref() {
        None => (
            broken.is_none() && (actor_flag || !queue_flag),
            broken.is_some() || variant == "fencelock" && (queue_flag || !actor_flag),
        ),
        Some("actor") if broken.is_none() => (true, false),
        Some("queue") if variant == "fencelock" || broken.is_some() => (false, true),
        Some(model) => return Err(format!("no variant {variant} of a model {model}")),
    };
    let mut failed = false;
    if actor {
        let cfg = cfg
            .variant(&variant)
            .ok_or_else(|| format!("unknown variant {variant}"))?;
        let depth = depth.unwrap_or(13);
        println!(
            "checking {variant} (actor model): {} workers, ttl {}, clock 0..{}, {} attempts \
             each, {} network, server crashes {}; depth {depth}, {threads} threads",
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
        failed |= report(&check(cfg, depth, threads, finish));
    }
    if queued {
        if let Some(broken) = broken {
            queue = queue.broken(broken);
        }
        let depth = depth.unwrap_or(10);
        println!(
            "checking {variant} (queue model): {} clients, {} resources, ttl {}, wait {}, \
             lock delay {} (client 1), clock 0..{}, {} rules; depth {depth}, {threads} threads",
            queue.clients,
            queue.resources,
            queue.ttl,
            queue.wait,
            queue.lock_delay,
            queue.max_time,
            if queue.rules.handover_on_release {
                "PostgreSQL's (hand-over on release)"
            } else {
                "SQLite's (the first waiter takes a released lease)"
            },
        );
        failed |= report(&check_queue(queue, depth, threads, finish));
    }
    if failed {
        Ok(ExitCode::FAILURE)
    } else {
        println!("no property is violated within the bounds");
        Ok(ExitCode::SUCCESS)
    }
}

/// Prints what a check found; whether a property failed.
fn report<M: Explain>(outcome: &Outcome<M>) -> bool
where
    M::State: Clone,
    M::Action: Clone,
{
    println!("explored {}", outcome.figures());
    print!("{}", outcome.counterexamples());
    for name in outcome.reached.keys() {
        println!("reached: {name}");
    }
    // A missing example is reported, not failed: with three workers an applied write by each
    // takes more steps than a practical depth. `cargo test` requires every example.
    if !outcome.stopped_early {
        for name in outcome.unreached() {
            println!("not reached within the depth: {name}");
        }
    }
    for name in outcome.violated.keys() {
        println!("VIOLATED: {name}");
    }
    !outcome.violated.is_empty()
}

fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not a number in range"))
}
