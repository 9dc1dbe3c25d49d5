//! The paused-worker story, played against a real lease server and a real demo store:
//! the ones it is given (`fencelock-demo paused-worker` starts in-process ones for those its
//! command line does not name; the page plays the same steps, `Scene`, on its own desks).
//!
//! Worker A acquires a lease and starts writing, then pauses past its TTL (a stand-in for a
//! GC pause: A neither renews nor notices). The lease expires; worker B acquires it with a
//! greater fence and writes. A wakes, still believing it holds the lease, and writes with its
//! old fence. With the guard the store rejects that late write and B's work stands; without
//! it, A silently overwrites B.

use std::fmt::Display;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use fencelock::client::Client;
use fencelock::client::LockInfo;
use fencelock::guard::FENCING_TOKEN;
use serde_json::{Value, json};

use crate::docs::Guarding;

pub struct StoryOptions {
    /// Whether the demo store checks fences, as the story expects it to.
    pub guarding: Guarding,
    /// The demo store is a running one the command line named (not one started for the
    /// story): its guard is as that store was started, whatever `guarding` says.
    pub store_given: bool,
    pub ttl_seconds: u32,
    /// The bearer secret for a lease server that runs with `--auth-file`; it needs the
    /// `lock` and `read` permissions on `report:`.
    pub token: Option<String>,
    /// Whether a fence key signs the fences of the services started for the story (the
    /// workers send the lease server's `fence_token` whenever it gives one).
    pub signed: bool,
}

/// How the story ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Guard on: the late write was rejected and B's value stands.
    Protected,
    /// Guard on, yet the late write got through or B's value was lost.
    NotProtected,
    /// Guard off: A's late write overwrote B's, as fencing would have prevented.
    DamageShown,
    /// Guard off here, but the store rejected the late write anyway (a running store with
    /// its own guard on).
    NoDamage,
}

/// The workers, as the timeline names them and as they sign their reports.
pub(crate) const WORKER_A: &str = "worker A";
pub(crate) const WORKER_B: &str = "worker B";

/// Prints a line of the story. A reader that goes away (`| head -3`) ends the story: the
/// error carries `io::ErrorKind::BrokenPipe`, which `main` treats as a normal end.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// Plays the story against the lease server at `lease_url` and the demo store at
/// `store_url`, printing its timeline, and says how it ended.
pub async fn run(
    options: &StoryOptions,
    lease_url: &str,
    store_url: &str,
) -> anyhow::Result<Verdict> {
    let ttl = Duration::from_secs(u64::from(options.ttl_seconds));
    let mut locks = Client::builder(lease_url);
    if let Some(token) = &options.token {
        locks = locks.bearer_token(token.clone());
    }
    let locks = locks.build()?;
    let store = Store::new(store_url)?;
    let timeline = Timeline::start();
    // A fresh resource per run, so a long-running server's earlier runs never interfere.
    let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S%.3f");
    let resource = format!("report:story-{stamp}");

    let guard_text = match (options.guarding, options.store_given) {
        (Guarding::On, _) => "guard ON",
        (Guarding::Off, false) => "guard OFF",
        (Guarding::Off, true) => "guard as configured on that store",
    };
    out!("The paused-worker story")?;
    out!("  lease server: {lease_url}")?;
    out!("  demo store:   {store_url} ({guard_text})")?;
    out!(
        "  resource:     {resource} (lease TTL {}s)",
        options.ttl_seconds
    )?;
    let signed = match options.signed {
        true => "signed (fence_token, checked by the store)",
        false => "bare",
    };
    out!("  fences:       {signed}\n")?;

    let scene = Scene {
        narrator: &timeline,
        locks: &locks,
        desk: &store,
        resource: &resource,
        ttl,
        ttl_b: ttl,
    };
    let cast = scene.takeover().await?;
    let (b_value, _) = scene.b_writes(&cast).await?;
    let late = scene.a_writes_late(&cast).await?;
    scene.b_releases(&cast).await?;
    let (a, b) = (&cast.a, &cast.b);

    let doc = store.read(&resource).await?;
    out!("\nFinal document:\n  {}", serde_json::to_string(&doc)?)?;
    out!("Write log (oldest first):")?;
    for write in store.writes(&resource).await? {
        out!(
            "  fence {:>4}  {:<8}  at {}",
            write["fence"],
            write["outcome"].as_str().unwrap_or("?"),
            write["at"].as_str().unwrap_or("?")
        )?;
    }

    let b_stands = doc["value"] == b_value;
    let verdict = match (options.guarding, late.applied, b_stands) {
        (Guarding::On, false, true) => Verdict::Protected,
        (Guarding::On, _, _) => Verdict::NotProtected,
        (Guarding::Off, true, false) => Verdict::DamageShown,
        (Guarding::Off, _, _) => Verdict::NoDamage,
    };
    out!()?;
    match verdict {
        Verdict::Protected => out!(
            "OK: the late write from paused worker A (fence {}) was rejected; worker B's report (fence {}) stands.",
            a.fence,
            b.fence
        )?,
        Verdict::NotProtected => out!(
            "FAILED: the guard did not protect the document: late write applied = {}, B's report stands = {b_stands}.",
            late.applied
        )?,
        Verdict::DamageShown => out!(
            "THE DATA IS NOW WRONG: paused worker A (fence {}) overwrote worker B's report (fence {}) after losing its lease. \
             This is the damage the write guard prevents; run without --no-guard to see it rejected.",
            a.fence,
            b.fence
        )?,
        Verdict::NoDamage => out!(
            "No damage this time: the store at {store_url} rejected the late write because its own guard is on, \
             so B's report stands. --no-guard switches off only the guard of a store this command starts itself; \
             to see the damage against a running store, start that store with `fencelock-demo store --no-guard`."
        )?,
    }
    Ok(verdict)
}

/// Who tells a story as it plays, and at what pace: the terminal's timeline, or the page.
pub(crate) trait Narrator {
    /// One event: `who` did `what`.
    fn say(&self, who: &str, what: &str) -> std::io::Result<()>;

    /// `worker` was granted `lock` (the page names each fence's holder by it).
    fn granted(&self, _worker: &str, _lock: &LockInfo) {}

    /// A pause after a step, so that a person can follow; none in the terminal.
    async fn beat(&self) {}
}

/// Where the workers write their documents: a demo store over HTTP ([`Store`]), or the
/// page's unguarded store in-process.
pub(crate) trait Desk {
    /// Writes `value` under `key` with `lock`'s `fence_token` when the lease server gave one,
    /// else its fence. A stale write is an `Ok` that was not applied.
    async fn write(&self, key: &str, lock: &LockInfo, value: Value) -> anyhow::Result<WriteResult>;
}

/// The two workers, a lease server and a store: the steps every paused-worker story is made
/// of, told by `narrator`.
pub(crate) struct Scene<'a, N, D> {
    pub narrator: &'a N,
    pub locks: &'a Client,
    pub desk: &'a D,
    pub resource: &'a str,
    pub ttl: Duration,
    /// B's lease TTL: the page's slow pace needs B's lease to outlive the rest of the story.
    pub ttl_b: Duration,
}

/// The two leases of a story, once B has taken over from the paused A.
pub(crate) struct Takeover {
    pub a: LockInfo,
    pub b: LockInfo,
    owner_a: String,
    owner_b: String,
}

impl<N: Narrator, D: Desk> Scene<'_, N, D> {
    async fn step(&self, who: &str, what: impl Display) -> anyhow::Result<()> {
        self.narrator.say(who, &what.to_string())?;
        self.narrator.beat().await;
        Ok(())
    }

    /// Tells a write made with `lock`'s fence, and what came of it.
    async fn wrote(
        &self,
        who: &str,
        what: &str,
        lock: &LockInfo,
        result: &WriteResult,
    ) -> anyhow::Result<()> {
        self.step(who, format!("{what} with fence {} → {result}", lock.fence))
            .await
    }

    /// A acquires and writes part 1, then pauses past its TTL; the lease expires and B
    /// acquires it with a greater fence (and has not written yet).
    pub async fn takeover(&self) -> anyhow::Result<Takeover> {
        let (owner_a, owner_b) = (secret(), secret());
        let resource = self.resource;
        let a = self.locks.acquire(resource, &owner_a, self.ttl).await?;
        self.narrator.granted(WORKER_A, &a);
        self.step(WORKER_A, format!("acquires the lease: fence {}", a.fence))
            .await?;
        let part_1 = report(WORKER_A, "A's report, part 1");
        let first = self.desk.write(resource, &a, part_1).await?;
        self.wrote(WORKER_A, "writes part 1", &a, &first).await?;
        self.narrator.say(
            WORKER_A,
            "pauses (a long GC pause): it stops renewing and does not know it",
        )?;

        wait_for_expiry(self.locks, resource, self.ttl).await?;
        self.step(
            "lease server",
            format!("A's lease on {resource} has expired"),
        )
        .await?;

        let b = self.locks.acquire(resource, &owner_b, self.ttl_b).await?;
        self.narrator.granted(WORKER_B, &b);
        self.step(
            WORKER_B,
            format!(
                "acquires the lease: fence {} (greater than A's {})",
                b.fence, a.fence
            ),
        )
        .await?;
        Ok(Takeover {
            a,
            b,
            owner_a,
            owner_b,
        })
    }

    /// B writes its report: the value that must stand.
    pub async fn b_writes(&self, cast: &Takeover) -> anyhow::Result<(Value, WriteResult)> {
        let b_value = report(WORKER_B, "B's complete report");
        let written = self
            .desk
            .write(self.resource, &cast.b, b_value.clone())
            .await?;
        self.wrote(WORKER_B, "writes its report", &cast.b, &written)
            .await?;
        Ok((b_value, written))
    }

    /// A wakes, still believing it holds the lease, and writes part 2 with its old fence.
    pub async fn a_writes_late(&self, cast: &Takeover) -> anyhow::Result<WriteResult> {
        self.narrator.say(
            WORKER_A,
            "wakes up, still believes it holds the lease, writes part 2",
        )?;
        let part_2 = report(WORKER_A, "A's report, part 2 (late)");
        let late = self.desk.write(self.resource, &cast.a, part_2).await?;
        self.wrote("demo store", "A's late write", &cast.a, &late)
            .await?;
        Ok(late)
    }

    /// A wakes and, before its irreversible step, asks the lease server whether it still
    /// holds the lease: a renew naming its fence. True when it does (and may go on).
    pub async fn a_checks(&self, cast: &Takeover) -> anyhow::Result<bool> {
        self.step(
            WORKER_A,
            format!(
                "wakes up and, before the irreversible step, renews its lease (fence {})",
                cast.a.fence
            ),
        )
        .await?;
        match self
            .locks
            .renew(self.resource, &cast.owner_a, self.ttl, Some(cast.a.fence))
            .await
        {
            Ok(_) => {
                self.step("lease server", "renews A's lease: A still holds it")
                    .await?;
                Ok(true)
            }
            Err(e) if e.is_lease_lost() => {
                self.step(
                    "lease server",
                    format!(
                        "refuses A's renewal ({e}): fence {} holds it now",
                        cast.b.fence
                    ),
                )
                .await?;
                self.step(WORKER_A, "has lost the lease: stops without writing")
                    .await?;
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    pub async fn b_releases(&self, cast: &Takeover) -> anyhow::Result<()> {
        self.locks
            .release(self.resource, &cast.owner_b, Some(cast.b.fence))
            .await?;
        self.step(WORKER_B, "releases the lease").await
    }
}

/// Polls the lease server until the lease is gone: the paused worker's sleep, ended by the
/// lease server's own clock rather than ours.
async fn wait_for_expiry(locks: &Client, resource: &str, ttl: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + ttl + Duration::from_secs(30);
    while locks.inspect(resource).await?.is_some() {
        if Instant::now() > deadline {
            bail!("the lease on {resource} did not expire within its TTL plus 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// What a worker sends as `Fencing-Token` for `lock`: the lease server's signed
/// `fence_token` when it gave one, else the bare fence.
pub(crate) fn fencing_token(lock: &LockInfo) -> String {
    lock.fence_token
        .clone()
        .unwrap_or_else(|| lock.fence.to_string())
}

/// A document as the workers write it.
fn report(author: &str, text: &str) -> Value {
    json!({ "author": author, "text": text })
}

/// The owner is the holder's secret: a fresh random one per acquisition attempt.
fn secret() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Prints one timeline line per event, with the time since the story began.
struct Timeline {
    started: Instant,
}

impl Timeline {
    fn start() -> Self {
        Self {
            started: Instant::now(),
        }
    }
}

impl Narrator for Timeline {
    fn say(&self, who: &str, what: &str) -> std::io::Result<()> {
        let at = self.started.elapsed().as_secs_f64();
        writeln!(std::io::stdout().lock(), "  +{at:6.3}s  {who:<12}  {what}")
    }
}

/// The demo store's HTTP API, as a worker uses it.
pub(crate) struct Store {
    http: reqwest::Client,
    base: String,
}

pub(crate) struct WriteResult {
    pub applied: bool,
    status: u16,
    body: Value,
}

/// How the timeline tells the outcome: `applied`, or why not.
impl Display for WriteResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.applied {
            f.write_str("applied")
        } else {
            write!(
                f,
                "REJECTED ({} {}, current fence {})",
                self.status,
                self.body["type"].as_str().unwrap_or("?"),
                self.body["current_fence"]
            )
        }
    }
}

impl WriteResult {
    /// A store's answer to a write: `200` applied, `409` stale with the problem `body`.
    pub(crate) fn new(status: u16, body: Value) -> Self {
        Self {
            applied: status == 200,
            status,
            body,
        }
    }
}

impl Desk for Store {
    async fn write(&self, key: &str, lock: &LockInfo, value: Value) -> anyhow::Result<WriteResult> {
        let token = fencing_token(lock);
        let response = self
            .http
            .put(format!("{}/docs/{key}", self.base))
            .header(FENCING_TOKEN, token)
            .json(&value)
            .send()
            .await
            .context("writing to the demo store")?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        match status {
            200 | 409 => Ok(WriteResult::new(status, body)),
            _ => bail!("the demo store answered {status}: {body}"),
        }
    }
}

impl Store {
    pub(crate) fn new(base: &str) -> anyhow::Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
            base: base.to_owned(),
        })
    }

    async fn read(&self, key: &str) -> anyhow::Result<Value> {
        let response = self
            .http
            .get(format!("{}/docs/{key}", self.base))
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("reading {key} from the demo store: {}", response.status());
        }
        Ok(response.json().await?)
    }

    /// The key's whole write log, page after page (a story writes only a handful).
    async fn writes(&self, key: &str) -> anyhow::Result<Vec<Value>> {
        let mut writes = Vec::new();
        let mut after = None;
        loop {
            let mut request = self
                .http
                .get(format!("{}/docs/{key}/writes", self.base))
                .query(&[("limit", "1000")]);
            if let Some(after) = &after {
                request = request.query(&[("after", after)]);
            }
            let body: Value = request.send().await?.json().await?;
            let page = body["writes"].as_array().cloned().unwrap_or_default();
            let more = !page.is_empty();
            writes.extend(page);
            // A store without pages sends no "next": its one answer is the whole log.
            match &body["next"] {
                Value::Number(next) if more => after = Some(next.to_string()),
                _ => return Ok(writes),
            }
        }
    }
}
