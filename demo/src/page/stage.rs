//! The page's stories: each run played in its own task against the lease server and a store,
//! told event by event into the run's log, and the newest few runs kept for the page.
//!
//! Guard on or off is a matter of which store a run writes to. The stories with the guard
//! write to this store over HTTP, as any worker would, so they meet its guard (and show it
//! when this store runs with `--no-guard`). The guard-off story writes to an unguarded copy:
//! a second document store on a temporary SQLite file, opened by the page and written only
//! in-process. It has no HTTP route, so nobody can use it to write around this store's guard,
//! and nothing it holds is this store's data.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use fencelock::client::{Client, LockInfo};
use fencelock::domain::{FenceKey, ResourceName};
use fencelock::guard::{FencingToken, Guard};
use fencelock::http::ApiError;
use fencelock_server::StoreOptions;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::docs::{self, Guarding, Put, SharedDocs, Write};
use crate::lease_server;
use crate::story::{self, Desk, Narrator, Scene, Store, Takeover, WriteResult};

/// The stories' lease TTL when not told otherwise: long enough to watch it count down.
pub const DEFAULT_TTL_SECONDS: u32 = 3;
/// The pause after each step when not told otherwise: long enough to read what happened.
pub const DEFAULT_BEAT_MS: u64 = 1200;
/// Most runs playing at once; one more is `429 quota-exceeded`.
pub const MAX_PLAYING: usize = 4;
/// How many runs the page shows, newest first.
pub const RUNS_KEPT: usize = 8;

/// How the page plays its stories.
#[derive(Clone)]
pub struct PageOptions {
    /// A running lease server; `None`: one in-process, on a temporary SQLite file, started
    /// when first needed ([`crate::app::DemoServer::prepare_page`] starts it at once).
    pub lease_url: Option<String>,
    /// The bearer secret for a lease server that runs with `--auth-file` (lock and read on
    /// `report:`).
    pub token: Option<String>,
    /// Signs the fences of the in-process lease server: the key of this store's guard, when
    /// it has one.
    pub fence_key: Option<FenceKey>,
    /// The workers' lease TTL; worker A pauses for longer than this.
    pub ttl: Duration,
    /// The pause after each step.
    pub beat: Duration,
    /// This store's own guard, as the page tells it.
    pub guarding: Guarding,
}

impl Default for PageOptions {
    fn default() -> Self {
        Self {
            lease_url: None,
            token: None,
            fence_key: None,
            ttl: Duration::from_secs(u64::from(DEFAULT_TTL_SECONDS)),
            beat: Duration::from_millis(DEFAULT_BEAT_MS),
            guarding: Guarding::On,
        }
    }
}

/// A story the page plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Story {
    /// The paused worker, against this store: A's late write is rejected.
    GuardOn,
    /// The paused worker, against the unguarded copy: A's late write overwrites B's report.
    GuardOff,
    /// A's late write arrives after B acquired but before B's first write: it is accepted.
    Gap,
    /// The same, but A renews its lease before the irreversible step, and stops.
    GapChecked,
}

impl Story {
    pub const ALL: [Self; 4] = [Self::GuardOn, Self::GuardOff, Self::Gap, Self::GapChecked];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::GuardOn => "guard-on",
            Self::GuardOff => "guard-off",
            Self::Gap => "gap",
            Self::GapChecked => "gap-checked",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|story| story.as_str() == text)
    }

    /// Whether the run writes to this store (else to the unguarded copy).
    fn writes_here(self) -> bool {
        self != Self::GuardOff
    }
}

/// How a run ended, in a word the page colours by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictKind {
    /// The late write was rejected; B's report stands.
    Protected,
    /// The late write overwrote B's report.
    DataLoss,
    /// The late write was accepted before B's first write.
    Gap,
    /// A learned from the lease server that it had lost the lease, and wrote nothing.
    Stopped,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Verdict {
    pub kind: VerdictKind,
    pub text: String,
}

/// One event of a run, as the story told it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Event {
    /// Milliseconds since the run began.
    pub at_ms: u64,
    pub who: String,
    pub what: String,
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Playing,
    Finished,
    /// The story could not be played (e.g. the lease server did not answer); see `error`.
    Failed,
}

/// What a run has told so far.
#[derive(Default)]
struct RunLog {
    events: Vec<Event>,
    /// Each fence the story was granted, and to which worker: how the page names holders
    /// and writers (it never sees an owner).
    holders: BTreeMap<i64, &'static str>,
    /// When each fence was granted: a write with a lower fence after that is a late one.
    grants: Vec<(i64, DateTime<Utc>)>,
    verdict: Option<Verdict>,
    error: Option<String>,
    finished: bool,
}

/// One play of a story, on a fresh key.
pub struct Run {
    pub id: u64,
    pub story: Story,
    pub key: ResourceName,
    pub started_at: DateTime<Utc>,
    started: Instant,
    log: Mutex<RunLog>,
}

/// A copy of a run's log, for the page.
pub struct RunView {
    pub phase: Phase,
    pub events: Vec<Event>,
    pub holders: BTreeMap<i64, &'static str>,
    pub grants: Vec<(i64, DateTime<Utc>)>,
    pub verdict: Option<Verdict>,
    pub error: Option<String>,
}

impl Run {
    fn log(&self) -> MutexGuard<'_, RunLog> {
        // A panic while the lock was held left the log as it was; it is still worth showing.
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn playing(&self) -> bool {
        !self.log().finished
    }

    pub fn view(&self) -> RunView {
        let log = self.log();
        let phase = match (log.finished, &log.error) {
            (false, _) => Phase::Playing,
            (true, None) => Phase::Finished,
            (true, Some(_)) => Phase::Failed,
        };
        RunView {
            phase,
            events: log.events.clone(),
            holders: log.holders.clone(),
            grants: log.grants.clone(),
            verdict: log.verdict.clone(),
            error: log.error.clone(),
        }
    }

    fn end(&self, result: anyhow::Result<Verdict>) {
        let mut log = self.log();
        match result {
            Ok(verdict) => log.verdict = Some(verdict),
            Err(e) => log.error = Some(format!("{e:#}")),
        }
        log.finished = true;
    }
}

/// Tells a story into its run's log, a beat after each step.
struct RunNarrator<'a> {
    run: &'a Run,
    beat: Duration,
}

impl Narrator for RunNarrator<'_> {
    fn say(&self, who: &str, what: &str) -> std::io::Result<()> {
        let at_ms = u64::try_from(self.run.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.run.log().events.push(Event {
            at_ms,
            who: who.to_owned(),
            what: what.to_owned(),
        });
        Ok(())
    }

    fn granted(&self, worker: &str, lock: &LockInfo) {
        let worker = if worker == story::WORKER_A {
            story::WORKER_A
        } else {
            story::WORKER_B
        };
        let mut log = self.run.log();
        log.holders.insert(lock.fence, worker);
        log.grants.push((lock.fence, Utc::now()));
    }

    async fn beat(&self) {
        tokio::time::sleep(self.beat).await;
    }
}

/// The unguarded copy, written in-process: the fence is read from the token as the guard
/// reads it, but never checked against the highest accepted.
struct Unguarded<'a> {
    docs: &'a SharedDocs,
    guard: &'a Guard,
}

impl Desk for Unguarded<'_> {
    async fn write(&self, key: &str, lock: &LockInfo, value: Value) -> anyhow::Result<WriteResult> {
        let token = FencingToken::new(story::fencing_token(lock));
        let write = Write {
            key: ResourceName::parse(key).map_err(|e| anyhow::anyhow!("key {key}: {e}"))?,
            value,
            fence: self.guard.check(key, &token)?,
        };
        Ok(match self.docs.put(&write).await? {
            Put::Applied(doc) => WriteResult::new(
                200,
                json!({ "key": doc.key, "value": doc.value, "fence": doc.fence }),
            ),
            Put::Stale { current } => WriteResult::new(
                409,
                json!({ "type": "stale-fence", "current_fence": current.get() }),
            ),
        })
    }
}

/// What the stories need beyond this store, started on first use.
pub struct Backstage {
    pub lease_url: String,
    pub locks: Client,
    pub unguarded: SharedDocs,
    /// Holds the temporary files of the in-process lease server and of the unguarded copy.
    _scratch: tempfile::TempDir,
}

impl Backstage {
    async fn start(options: &PageOptions, guard: &Guard) -> anyhow::Result<Self> {
        let scratch = tempfile::tempdir().context("creating a scratch directory")?;
        let lease_url = match &options.lease_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            // It serves as long as this process does: a story may come at any time.
            None => {
                let (url, _handle) =
                    lease_server::start(scratch.path(), options.fence_key.clone()).await?;
                url
            }
        };
        let mut locks = Client::builder(&lease_url).timeout(Duration::from_secs(5));
        if let Some(token) = &options.token {
            locks = locks.bearer_token(token.clone());
        }
        let locks = locks.build()?;
        let copy = format!("sqlite://{}", scratch.path().join("unguarded.db").display());
        let unguarded =
            docs::open(Some(&copy), Guarding::Off, StoreOptions::default(), guard).await?;
        Ok(Self {
            lease_url,
            locks,
            unguarded,
            _scratch: scratch,
        })
    }
}

/// The page's stories and their runs.
pub struct Stage {
    options: PageOptions,
    /// This store, as its workers reach it.
    store_url: String,
    /// This store's documents, read for the page.
    docs: SharedDocs,
    guard: Guard,
    /// Longest the page waits on this store's documents.
    store_timeout: Duration,
    backstage: OnceCell<Backstage>,
    /// Newest first, at most [`RUNS_KEPT`].
    runs: Mutex<VecDeque<Arc<Run>>>,
    next_id: AtomicU64,
}

impl Stage {
    /// The stage of the store bound to `bound`, whose documents are `docs`, checked by
    /// `guard`, each call bounded by `store_timeout`.
    pub fn new(
        options: PageOptions,
        bound: SocketAddr,
        docs: SharedDocs,
        guard: Guard,
        store_timeout: Duration,
    ) -> Self {
        Self {
            options,
            store_url: format!("http://{}", reachable(bound)),
            docs,
            guard,
            store_timeout,
            backstage: OnceCell::new(),
            runs: Mutex::new(VecDeque::new()),
            next_id: AtomicU64::new(1),
        }
    }

    pub fn options(&self) -> &PageOptions {
        &self.options
    }

    pub fn store_timeout(&self) -> Duration {
        self.store_timeout
    }

    /// The lease server and the unguarded copy, started on first use.
    pub async fn backstage(&self) -> anyhow::Result<&Backstage> {
        self.backstage
            .get_or_try_init(|| Backstage::start(&self.options, &self.guard))
            .await
    }

    /// The backstage if a story has needed it yet.
    pub fn started_backstage(&self) -> Option<&Backstage> {
        self.backstage.get()
    }

    /// The runs the page shows, newest first.
    pub fn runs(&self) -> Vec<Arc<Run>> {
        self.lock_runs().iter().cloned().collect()
    }

    fn lock_runs(&self) -> MutexGuard<'_, VecDeque<Arc<Run>>> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts playing `story` on a fresh key; it plays on after this returns.
    pub async fn play(self: Arc<Self>, story: Story) -> Result<Arc<Run>, ApiError> {
        self.backstage().await.map_err(ApiError::Internal)?;
        let run = {
            let mut runs = self.lock_runs();
            if runs.iter().filter(|run| run.playing()).count() >= MAX_PLAYING {
                return Err(ApiError::QuotaExceeded(format!(
                    "{MAX_PLAYING} stories are playing; start another when one has ended"
                )));
            }
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            // A fresh key per run: earlier runs, and anything else on this store, never meet it.
            let stamp = Utc::now().format("%Y%m%d-%H%M%S%.3f");
            let key = ResourceName::parse(&format!("report:page-{id}-{stamp}"))
                .map_err(|e| ApiError::Internal(anyhow::anyhow!("a run's key: {e}")))?;
            let run = Arc::new(Run {
                id,
                story,
                key,
                started_at: Utc::now(),
                started: Instant::now(),
                log: Mutex::new(RunLog::default()),
            });
            runs.push_front(run.clone());
            runs.truncate(RUNS_KEPT);
            run
        };
        let played = run.clone();
        actix_web::rt::spawn(async move {
            let result = self.tell(&played).await;
            if let Err(e) = &result {
                tracing::warn!(run = played.id, error = %format!("{e:#}"), "a page story failed");
            }
            played.end(result);
        });
        Ok(run)
    }

    /// The documents `run` writes to.
    pub fn docs_of(&self, run: &Run) -> Option<&SharedDocs> {
        if run.story.writes_here() {
            Some(&self.docs)
        } else {
            self.started_backstage().map(|b| &b.unguarded)
        }
    }

    /// Whether the store `run` writes to checks fences.
    pub fn guarded(&self, run: &Run) -> bool {
        run.story.writes_here() && self.options.guarding == Guarding::On
    }

    async fn tell(&self, run: &Run) -> anyhow::Result<Verdict> {
        let backstage = self.backstage().await?;
        let narrator = RunNarrator {
            run,
            beat: self.options.beat,
        };
        if run.story.writes_here() {
            let desk = Store::new(&self.store_url)?;
            self.scene(run, &narrator, &backstage.locks, &desk).await
        } else {
            let desk = Unguarded {
                docs: &backstage.unguarded,
                guard: &self.guard,
            };
            self.scene(run, &narrator, &backstage.locks, &desk).await
        }
    }

    async fn scene<D: Desk>(
        &self,
        run: &Run,
        narrator: &RunNarrator<'_>,
        locks: &Client,
        desk: &D,
    ) -> anyhow::Result<Verdict> {
        let scene = Scene {
            narrator,
            locks,
            desk,
            resource: run.key.as_str(),
            ttl: self.options.ttl,
            // B's lease lasts through every step after its acquisition, to its release.
            ttl_b: self.options.ttl + self.options.beat * 8,
        };
        let cast = scene.takeover().await?;
        let verdict = match run.story {
            Story::GuardOn | Story::GuardOff => {
                scene.b_writes(&cast).await?;
                let late = scene.a_writes_late(&cast).await?;
                late_write_verdict(&cast, late.applied)
            }
            Story::Gap => {
                let late = scene.a_writes_late(&cast).await?;
                scene.b_writes(&cast).await?;
                gap_verdict(&cast, late.applied)
            }
            Story::GapChecked => {
                if scene.a_checks(&cast).await? {
                    let late = scene.a_writes_late(&cast).await?;
                    scene.b_writes(&cast).await?;
                    gap_verdict(&cast, late.applied)
                } else {
                    scene.b_writes(&cast).await?;
                    Verdict {
                        kind: VerdictKind::Stopped,
                        text: format!(
                            "Worker A asked the lease server before its irreversible step, learned \
                             that fence {} had taken over, and stopped: nothing stale was written. \
                             A check narrows the gap but cannot close it (A could pause again \
                             right after it); the fence stops every late write once B has written.",
                            cast.b.fence
                        ),
                    }
                }
            }
        };
        scene.b_releases(&cast).await?;
        Ok(verdict)
    }
}

/// After B wrote: A's late write either was rejected, or destroyed B's report.
fn late_write_verdict(cast: &Takeover, applied: bool) -> Verdict {
    let (a, b) = (cast.a.fence, cast.b.fence);
    let (kind, text) = if applied {
        (
            VerdictKind::DataLoss,
            format!(
                "Data loss: paused worker A's late write (fence {a}) overwrote worker B's report \
                 (fence {b}) after A had lost its lease. Nothing checked the fence."
            ),
        )
    } else {
        (
            VerdictKind::Protected,
            format!(
                "Protected: the store rejected A's late write (fence {a}) because it had already \
                 accepted fence {b}. Worker B's report stands."
            ),
        )
    };
    Verdict { kind, text }
}

/// Before B wrote: the store had not seen B's fence yet. Rejected, the late write is a
/// protected one like any other.
fn gap_verdict(cast: &Takeover, applied: bool) -> Verdict {
    if !applied {
        return late_write_verdict(cast, false);
    }
    let (a, b) = (cast.a.fence, cast.b.fence);
    Verdict {
        kind: VerdictKind::Gap,
        text: format!(
            "The gap: A's late write (fence {a}) was accepted. B held the lease with fence {b} \
             but had not written yet, so the highest fence the store had seen was still {a}. \
             B's write replaced it, but an irreversible step A took on the strength of it (an \
             e-mail sent, a payment made) cannot be undone."
        ),
    }
}

/// An address a client on this machine can connect to: a wildcard bind is reached on
/// loopback.
fn reachable(bound: SocketAddr) -> SocketAddr {
    let ip = match bound.ip() {
        ip if !ip.is_unspecified() => ip,
        std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
    };
    SocketAddr::new(ip, bound.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stories_have_one_name_each() {
        for story in Story::ALL {
            assert_eq!(Story::parse(story.as_str()), Some(story));
            assert_eq!(
                serde_json::to_value(story).unwrap(),
                Value::String(story.as_str().into())
            );
        }
        assert_eq!(Story::parse("Guard-On"), None);
    }

    #[test]
    fn a_wildcard_bind_is_reached_on_loopback() {
        let at = |text: &str| reachable(text.parse().unwrap()).to_string();
        assert_eq!(at("0.0.0.0:8081"), "127.0.0.1:8081");
        assert_eq!(at("[::]:8081"), "[::1]:8081");
        assert_eq!(at("192.0.2.7:80"), "192.0.2.7:80");
    }
}
