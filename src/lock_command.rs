//! `fencelock lock RESOURCE -- CMD ARGS...`: run a command while holding a lease.
//!
//! The lease comes from [`Client::lock`] (the server waits when `--wait-seconds` asks it to,
//! in rounds of at most its `--max-wait-ms` when the wait is longer) and renews itself in
//! the background ([`Lease`]). This module joins the lease to CMD's process group:
//!
//! - CMD runs with `FENCELOCK_RESOURCE`, `FENCELOCK_FENCE`, `FENCELOCK_FENCE_TOKEN` (only
//!   when the server signs fences; otherwise removed, so a stale one from the caller's
//!   environment cannot leak through) and `FENCELOCK_URL`; stdin, stdout and stderr are
//!   the caller's.
//! - CMD runs in a process group of its own, and every signal meant for CMD goes to the
//!   whole group, so that what CMD started stops with it (`group`). When `fencelock lock`
//!   ends, no process of the group is left: processes CMD left behind get SIGTERM, then
//!   SIGKILL; and if `fencelock lock` is killed itself, a sentinel kills the group.
//! - The lease is released when the group is gone, whatever CMD's status.
//! - Losing the lease: the group gets SIGTERM when the server refuses a renewal (the lease
//!   is gone) or when no renewal has been confirmed and only the grace period is left before
//!   the lease's safe deadline (its expiry by the server's reckoning, less the client's
//!   safety margin). SIGKILL follows at that deadline (at once for a lease that is gone), or
//!   exactly `--grace-seconds` after SIGTERM when that is given, even past the deadline. The
//!   grace period is `--grace-seconds` or 10 s, at most a third of the TTL, so that it
//!   never begins while renewals are on time. The exit status is then [`LEASE_LOST`],
//!   whatever CMD's own was: work cut short must never look like success.
//! - SIGTERM, SIGINT, SIGHUP and SIGQUIT sent to `fencelock lock` go on to the group
//!   (followed by SIGCONT, so that a stopped process acts on them), which decides what they
//!   mean; `fencelock lock` goes on until the group is gone. At a terminal, the group is not
//!   the foreground one: Ctrl-C and Ctrl-\ reach `fencelock lock`, which passes them on;
//!   Ctrl-Z stops the group and `fencelock lock` together (SIGSTOP), and `fg` continues
//!   both. As under `timeout(1)`, CMD cannot read from the terminal: the kernel stops a
//!   background process that tries (SIGTTIN).
//! - Everything `fencelock lock` says is one line on stderr, prefixed `fencelock lock:`.
//!   The renewal task's retries are not logged: they are no failure until the lease is lost.

mod group;

use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{ExitCode, ExitStatus};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep, sleep_until};

use crate::config::{DEFAULT_LOCK_GRACE_SECONDS, LockArgs};
use fencelock::client::{Client, Error, Lease};
use group::Group;

pub(crate) use group::sentinel;

/// RESOURCE was held by another owner for the whole wait (`EX_TEMPFAIL`).
pub(crate) const HELD: u8 = 75;
/// The lease server could not be reached, could not answer, or refused the request
/// (`EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lease was lost while CMD ran, and CMD was stopped (as `timeout(1)` says it stopped
/// its command).
pub(crate) const LEASE_LOST: u8 = 124;
/// CMD could not be run (as shells and `env(1)` say).
pub(crate) const CANNOT_RUN: u8 = 126;
/// CMD was not found (as shells and `env(1)` say).
pub(crate) const NOT_FOUND: u8 = 127;
/// Bad arguments (an unusable `--url`, `--token` or `--cacert`), as for every `fencelock`
/// command.
pub(crate) const USAGE: u8 = 2;

/// The longest wait one request asks for when the server's maximum is not known yet: the
/// contract's default `--max-wait-ms`.
const WAIT_ROUND: Duration = Duration::from_secs(60);

/// How often the group is looked at once CMD itself has ended and others of it are left.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// How long the group may take to vanish after SIGKILL before `fencelock lock` gives up on
/// it (a process in uninterruptible sleep, on a dead NFS mount, cannot be killed sooner).
const KILL_PATIENCE: Duration = Duration::from_secs(5);

/// Runs `fencelock lock` to its end on a runtime of its own and gives its exit status.
pub(crate) fn main(args: LockArgs) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let code = match runtime {
        Ok(runtime) => runtime.block_on(run(args)),
        Err(e) => {
            say(&format!("cannot start: {e}"));
            CANNOT_RUN
        }
    };
    ExitCode::from(code)
}

/// The whole command: acquire, run CMD under the lease, release. Returns the exit status.
async fn run(args: LockArgs) -> u8 {
    let resource = args.resource.as_str();
    // Taken over before the lease exists, so that a signal while waiting for it is ours to
    // answer (and CMD never starts), and no signal is lost between acquiring and spawning.
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            say(&format!("cannot handle signals: {e}"));
            return CANNOT_RUN;
        }
    };
    let client = match client(&args) {
        Ok(client) => client,
        Err(message) => {
            say(&message);
            return USAGE;
        }
    };
    let ttl = Duration::from_secs(u64::from(args.ttl_seconds));
    let wait = Duration::from_secs(u64::from(args.wait_seconds));
    let acquisition = acquire(&client, resource, ttl, wait);
    tokio::pin!(acquisition);
    let acquired = loop {
        tokio::select! {
            acquired = &mut acquisition => break acquired,
            signal = signals.recv() => {
                if signal == Signal::SIGTSTP {
                    // Nothing runs yet that could go on without us.
                    group::suspend_self();
                    continue;
                }
                // Dropping the request closes its connection: a waiting server drops us
                // from its queue, and a lease granted unseen lapses at the end of its TTL.
                say(&format!("{signal} while acquiring `{resource}`; CMD not run"));
                return signal_status(signal as i32);
            }
        }
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(Error::Held { .. }) if wait.is_zero() => {
            say(&format!("`{resource}` is held by another owner"));
            return HELD;
        }
        Err(Error::Held { .. }) => {
            say(&format!(
                "`{resource}` is still held by another owner after waiting {} s",
                args.wait_seconds
            ));
            return HELD;
        }
        Err(e) => {
            say(&format!(
                "cannot acquire `{resource}` from {}: {}",
                args.url,
                describe(&e, &args)
            ));
            return UNAVAILABLE;
        }
    };
    let (group, mut child) = match start(&args, &lease).await {
        Ok(started) => started,
        Err((e, status)) => {
            let _ = lease.release().await;
            say(&e);
            return status;
        }
    };
    let grace = Grace::new(args.grace_seconds, ttl);
    let ended = supervise(&mut child, &group, &lease, &mut signals, grace).await;
    let status = match ended {
        Ok(Ended::Exited(status)) => {
            group.close().await;
            if let Err(e) = lease.release().await {
                say(&format!(
                    "CMD ended, but the lease on `{resource}` was not released ({e}); it lapses by itself"
                ));
            }
            return exit_status(status);
        }
        Ok(Ended::LeaseLost) => LEASE_LOST,
        Err(e) => {
            // Waiting for our own child failed: nothing sensible is left to do but stop it.
            group.signal(Signal::SIGKILL);
            say(&format!("lost track of CMD: {e}"));
            CANNOT_RUN
        }
    };
    group.close().await;
    // Still held if CMD ended before its safe deadline: give it back for the next holder,
    // but no longer than the lease lasts anyway (its renewals are failing, and so may this).
    let left = lease.remaining();
    if !left.is_zero() {
        let _ = tokio::time::timeout(left, lease.release()).await;
    }
    status
}

/// The client of `--url`, with `--token` and `--cacert`; or the one line saying what is
/// wrong with them.
fn client(args: &LockArgs) -> Result<Client, String> {
    let mut client = Client::builder(&args.url);
    if let Some(token) = &args.token {
        client = client.bearer_token(token);
    }
    if let Some(path) = &args.cacert {
        let shown = path.display();
        let pem = std::fs::read(path).map_err(|e| format!("--cacert {shown}: {e}"))?;
        match reqwest::Certificate::from_pem_bundle(&pem) {
            Ok(certificates) if !certificates.is_empty() => {}
            Ok(_) => return Err(format!("--cacert {shown}: no PEM certificate in it")),
            Err(e) => return Err(format!("--cacert {shown}: not PEM certificates: {e}")),
        }
        client = client.add_root_certificate_pem(pem);
    }
    client
        .build()
        .map_err(|e| format!("--url, --token or --cacert: {e}"))
}

/// [`Client::lock`], waiting up to `wait` in all. A server waits at most its `--max-wait-ms`
/// per request, so a longer wait is asked for in rounds: 60 s each (the contract's default
/// maximum) until a server that allows less refuses that, naming its maximum, which the
/// rounds then keep to. Each round queues anew, behind the waiters that came meanwhile.
async fn acquire(
    client: &Client,
    resource: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<Lease, Error> {
    let deadline = Instant::now() + wait;
    let mut round = WAIT_ROUND;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let this = left.min(round);
        let asked = Instant::now();
        match client.lock(resource, ttl, this).await {
            Err(Error::Held { .. }) if Instant::now() < deadline => {
                // A server answers a wait only when it is over; one that answers sooner must
                // not be asked again in a busy loop.
                if asked.elapsed() < this {
                    sleep(Duration::from_millis(100).min(left)).await;
                }
            }
            Err(Error::Rejected { status, problem }) if !this.is_zero() => {
                match max_wait(status, &problem) {
                    Some(max) if !max.is_zero() && max < this => round = max,
                    _ => return Err(Error::Rejected { status, problem }),
                }
            }
            done => return done,
        }
    }
}

/// The largest `wait_ms` a server allows, from its refusal of a larger one: a `422` naming
/// `wait_ms`, "must be an integer from 0 to MAX (milliseconds)".
fn max_wait(status: u16, problem: &serde_json::Value) -> Option<Duration> {
    if status != 422 {
        return None;
    }
    let errors = problem.get("errors")?.as_array()?;
    let message = errors
        .iter()
        .find(|e| e.get("field").and_then(|f| f.as_str()) == Some("wait_ms"))?
        .get("message")?
        .as_str()?;
    let max = message.split(" to ").nth(1)?.split_whitespace().next()?;
    max.parse().ok().map(Duration::from_millis)
}

/// An error of the client in words, without the server's raw JSON.
fn describe(error: &Error, args: &LockArgs) -> String {
    match error {
        Error::Rejected { status, problem } => {
            let kind = problem.get("type").and_then(|t| t.as_str());
            let detail = problem.get("detail").and_then(|d| d.as_str());
            let fields: Vec<String> = problem
                .get("errors")
                .and_then(|e| e.as_array())
                .map(|errors| {
                    errors
                        .iter()
                        .filter_map(|e| {
                            let field = e.get("field")?.as_str()?;
                            let message = e.get("message")?.as_str()?;
                            Some(format!("{field} {message}"))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let said = if !fields.is_empty() {
                fields.join("; ")
            } else if let Some(detail) = detail {
                detail.to_owned()
            } else {
                // Not a problem document: its start, as text.
                let text = problem
                    .as_str()
                    .map_or_else(|| problem.to_string(), str::to_owned);
                text.chars().take(200).collect()
            };
            match kind {
                Some(kind) => format!("the server refused the request ({status} {kind}): {said}"),
                None => format!("the server refused the request ({status}): {said}"),
            }
        }
        Error::Unavailable(cause)
            if args.url.starts_with("https:") && cause.contains("certificate") =>
        {
            match &args.cacert {
                None => format!(
                    "{error} (for a server whose certificate a private CA issued, give that CA with --cacert FILE)"
                ),
                Some(path) => format!(
                    "{error} (is {} the CA that issued the server's certificate?)",
                    path.display()
                ),
            }
        }
        other => other.to_string(),
    }
}

/// Starts the sentinel and CMD in its group; or the line to say and the exit status.
async fn start(args: &LockArgs, lease: &Lease) -> Result<(Group, Child), (String, u8)> {
    let mut group = Group::start().map_err(|e| {
        (
            format!("cannot start the sentinel of CMD's process group: {e}"),
            CANNOT_RUN,
        )
    })?;
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("FENCELOCK_RESOURCE", &args.resource)
        .env("FENCELOCK_FENCE", lease.fence().to_string())
        .env("FENCELOCK_URL", &args.url);
    match lease.fence_token() {
        Some(token) => command.env("FENCELOCK_FENCE_TOKEN", token),
        None => command.env_remove("FENCELOCK_FENCE_TOKEN"),
    };
    let child = match group.spawn(&mut command) {
        Ok(child) => child,
        Err(e) => {
            group.close().await;
            let program = args.command[0].to_string_lossy();
            let status = if e.kind() == io::ErrorKind::NotFound {
                NOT_FOUND
            } else {
                CANNOT_RUN
            };
            return Err((format!("cannot run `{program}`: {e}"), status));
        }
    };
    if let Err(e) = group.seal().await {
        // Without the sentinel's guard CMD must not run: nothing would stop it if we died.
        group.signal(Signal::SIGKILL);
        let mut child = child;
        let _ = child.wait().await;
        group.close().await;
        return Err((
            format!("cannot watch CMD's process group ({e}); CMD killed"),
            CANNOT_RUN,
        ));
    }
    Ok((group, child))
}

/// When CMD's group gets SIGTERM and SIGKILL once the lease is in danger.
#[derive(Debug, Clone, Copy)]
struct Grace {
    /// `--grace-seconds`, when given: the time between SIGTERM and SIGKILL, whatever the
    /// lease has left.
    given: Option<Duration>,
    /// How long before the lease's safe deadline an unconfirmed lease gets SIGTERM: the
    /// grace period, at most a third of the TTL (a renewal is due every third, so a lease
    /// renewed on time never comes this close).
    window: Duration,
}

impl Grace {
    fn new(given: Option<u32>, ttl: Duration) -> Self {
        let given = given.map(|s| Duration::from_secs(u64::from(s)));
        let period = given.unwrap_or(Duration::from_secs(u64::from(DEFAULT_LOCK_GRACE_SECONDS)));
        Self {
            given,
            window: period.min(ttl / 3),
        }
    }

    /// When SIGKILL follows a SIGTERM sent now, with `left` before the lease's safe deadline.
    fn kill_at(&self, now: Instant, left: Duration) -> Instant {
        now + self.given.unwrap_or(left)
    }
}

/// How CMD's run ended.
enum Ended {
    /// CMD ended while the lease was held (any processes it left have been stopped).
    Exited(ExitStatus),
    /// The lease was lost, or about to be; CMD's group was stopped and is gone.
    LeaseLost,
}

/// The stopping of CMD's group, once begun.
struct Stopping {
    /// Begun because of the lease (not for processes CMD left behind when it ended).
    for_lease: bool,
    /// When the group gets SIGKILL.
    kill_at: Instant,
    /// When it got SIGKILL.
    killed: Option<Instant>,
}

/// Waits for CMD's group to end, passing signals on, and stops it if the lease is lost or
/// about to be.
async fn supervise(
    child: &mut Child,
    group: &Group,
    lease: &Lease,
    signals: &mut Signals,
    grace: Grace,
) -> io::Result<Ended> {
    let resource = lease.resource();
    let mut status: Option<ExitStatus> = None;
    let mut stopping: Option<Stopping> = None;
    let mut loss_seen = false;
    loop {
        // When an unconfirmed lease has only the grace window left.
        let window_at = Instant::now() + lease.remaining().saturating_sub(grace.window);
        let kill_at = stopping
            .as_ref()
            .filter(|s| s.killed.is_none())
            .map(|s| s.kill_at);
        tokio::select! {
            // CMD's end first: a status it has reached is the truth, even if the loss or a
            // signal is noticed in the same poll.
            biased;
            ended = child.wait(), if status.is_none() => {
                let ended = ended?;
                status = Some(ended);
                if stopping.is_none() {
                    if group.is_empty() {
                        return Ok(Ended::Exited(ended));
                    }
                    let now = Instant::now();
                    let kill_at = now + grace.given.unwrap_or(grace.window).min(lease.remaining());
                    say(&format!(
                        "CMD ended, leaving processes in its group: stopping them (SIGTERM, then SIGKILL in {}) before releasing `{resource}`",
                        seconds(kill_at - now)
                    ));
                    group.signal(Signal::SIGTERM);
                    stopping = Some(Stopping { for_lease: false, kill_at, killed: None });
                }
            }
            signal = signals.recv() => {
                if signal == Signal::SIGTSTP {
                    group.suspend();
                } else {
                    group.signal(signal);
                }
            }
            reason = lease.lost(), if !loss_seen => {
                loss_seen = true;
                let now = Instant::now();
                // The server says the lease is gone (or its safe deadline has passed): no
                // time is left on it.
                let kill_at = grace.kill_at(now, Duration::ZERO);
                match &mut stopping {
                    Some(stop) => stop.kill_at = stop.kill_at.min(kill_at),
                    None => {
                        say(&format!(
                            "lost the lease on `{resource}` ({reason}): stopping CMD (SIGTERM, then SIGKILL {})",
                            kill_when(now, kill_at, None, grace)
                        ));
                        group.signal(Signal::SIGTERM);
                        stopping = Some(Stopping { for_lease: true, kill_at, killed: None });
                    }
                }
            }
            () = sleep_until(window_at), if stopping.is_none() && !loss_seen => {
                let left = lease.remaining();
                if left <= grace.window {
                    let now = Instant::now();
                    let kill_at = grace.kill_at(now, left);
                    say(&format!(
                        "lost the lease on `{resource}`: no renewal confirmed, and {} left before its expiry less a safety margin: stopping CMD (SIGTERM, then SIGKILL {})",
                        seconds(left),
                        kill_when(now, kill_at, Some(now + left), grace)
                    ));
                    group.signal(Signal::SIGTERM);
                    stopping = Some(Stopping { for_lease: true, kill_at, killed: None });
                }
            }
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                group.signal(Signal::SIGKILL);
                if let Some(stop) = &mut stopping {
                    stop.killed = Some(Instant::now());
                }
            }
            () = sleep(GROUP_POLL), if status.is_some() => {
                let Some(stop) = &stopping else { continue };
                let outlived = stop.killed.is_some_and(|at| at.elapsed() > KILL_PATIENCE);
                if group.is_empty() || outlived {
                    if outlived {
                        say(&format!(
                            "processes of CMD's group are still there {} after SIGKILL; leaving them",
                            seconds(KILL_PATIENCE)
                        ));
                    }
                    return Ok(match (stop.for_lease, status) {
                        (false, Some(status)) => Ended::Exited(status),
                        _ => Ended::LeaseLost,
                    });
                }
            }
        }
    }
}

/// "in 3.2 s", and what that means for the lease when `--grace-seconds` overrides the safe
/// deadline (`None`: the lease is gone already).
fn kill_when(now: Instant, kill_at: Instant, deadline: Option<Instant>, grace: Grace) -> String {
    let when = if kill_at <= now {
        "at once".to_owned()
    } else {
        format!("in {}", seconds(kill_at - now))
    };
    match (grace.given, deadline) {
        (Some(_), None) if kill_at > now => {
            format!("{when}, as --grace-seconds says, though the lease is gone")
        }
        (Some(_), Some(deadline)) if kill_at > deadline => format!(
            "{when}, as --grace-seconds says, {} after the lease's expiry less a safety margin",
            seconds(kill_at - deadline)
        ),
        _ => when,
    }
}

/// A duration as "3.2 s".
fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

/// The signals `fencelock lock` answers: the first four are passed on to CMD's group,
/// SIGTSTP (Ctrl-Z) stops the group and `fencelock lock`.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    tstp: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
            tstp: signal(SignalKind::from_raw(Signal::SIGTSTP as i32))?,
        })
    }

    /// The next signal that arrives. Cancel-safe.
    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.hup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
            _ = self.tstp.recv() => Signal::SIGTSTP,
        }
    }
}

/// CMD's status as a shell gives it: its exit code, or 128+N if signal N ended it.
fn exit_status(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => signal_status(signal),
        (None, None) => 1,
    }
}

/// 128+N for signal N, as shells report a command ended by it.
fn signal_status(signal: i32) -> u8 {
    u8::try_from(128 + signal.clamp(0, 127)).unwrap_or(u8::MAX)
}

/// One line on stderr.
fn say(message: &str) {
    let line = message.replace('\n', "; ");
    eprintln!("fencelock lock: {line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_reported_as_shells_do() {
        assert_eq!(exit_status(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_status(ExitStatus::from_raw(7 << 8)), 7);
        // Ended by SIGTERM (15), and by SIGKILL (9).
        assert_eq!(exit_status(ExitStatus::from_raw(15)), 143);
        assert_eq!(exit_status(ExitStatus::from_raw(9)), 137);
    }
}
