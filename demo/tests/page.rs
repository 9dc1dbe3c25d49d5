//! The paused-worker page, driven in a real headless browser (chromium over WebDriver): a
//! click on each story's button, then what the page shows at the end, as a person sees it.
//!
//! `FENCELOCK_PAGE_SCREENSHOTS=DIR` also saves each story's end state as a PNG in `DIR`
//! (1280×800, and one story in a narrow window): the README's screenshots are made so.

mod browser;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use browser::Browser;
use fencelock_testkit::{StoreKind, TestApp, find_line, json_answer, logged_field};
use serde_json::Value;

/// The stories' pace in these tests: fast, yet with A's lease alive for 2 s, several polls
/// of the page (every 400 ms) even on a loaded machine.
const PACE: &[&str] = &["--story-ttl-seconds", "2", "--beat-ms", "200"];
/// Longest a story may take here: it takes about 4 s; the margin is for a loaded machine.
const STORY_TIMEOUT: Duration = Duration::from_secs(60);

const APPLIED_GREEN: &str = "rgb(21, 128, 61)";
const REJECTED_RED: &str = "rgb(220, 38, 38)";

/// A `fencelock-demo` process serving the page, stopped when dropped.
struct Served {
    child: Child,
    url: String,
}

impl Served {
    /// `fencelock-demo SUBCOMMAND --bind 127.0.0.1:0`, at the tests' [`PACE`], with `args`;
    /// no setting of the developer's shell leaks in.
    fn command(subcommand: &str, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock-demo"));
        command
            .args([subcommand, "--bind", "127.0.0.1:0"])
            .args(PACE)
            .args(args)
            .env_remove("FENCELOCK_DEMO_DATABASE_URL")
            .env_remove("FENCELOCK_DEMO_TOKEN")
            .env_remove("RUST_LOG");
        command
    }

    /// `fencelock-demo page`, which prints the page's URL.
    fn page(args: &[&str]) -> Self {
        let mut child = Self::command("page", args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the demo binary runs");
        let url = find_line(child.stdout.take().unwrap(), "the page's URL", |line| {
            Some(line.trim().strip_prefix("page:")?.trim().to_owned())
        });
        Self { child, url }
    }

    /// `fencelock-demo store`, which serves the page at `/` too; its port is in its log.
    fn store(args: &[&str], dir: &std::path::Path) -> Self {
        let mut child = Self::command("store", args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the demo binary runs");
        let port: u16 = find_line(child.stderr.take().unwrap(), "the store's port", |line| {
            logged_field(line, "port")?.parse().ok()
        });
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/"),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the page shows of the newest run.
#[derive(Debug)]
struct Shown {
    key: String,
    verdict_class: String,
    verdict: String,
    document: String,
    document_class: String,
    events: String,
    marks: Vec<Mark>,
}

#[derive(Debug)]
struct Mark {
    worker: String,
    fence: i64,
    outcome: String,
    /// The colour of the mark's dot, as the browser computed it.
    colour: String,
    text: String,
    classes: String,
}

const SHOWN: &str = r#"
const current = document.getElementById("current");
const text = (id) => { const node = document.getElementById(id); return node ? node.textContent : ""; };
const cls = (id) => { const node = document.getElementById(id); return node ? node.className : ""; };
return {
  key: current.querySelector(".key").textContent,
  verdict_class: cls("verdict"),
  verdict: text("verdict"),
  document: text("document-text"),
  document_class: cls("document"),
  events: current.querySelector(".events").textContent,
  marks: [...current.querySelectorAll(".mark")].map((m) => ({
    worker: m.dataset.worker,
    fence: Number(m.dataset.fence),
    outcome: m.dataset.outcome,
    colour: getComputedStyle(m.querySelector(".dot")).backgroundColor,
    text: m.textContent,
    classes: m.className,
  })),
};
"#;

/// Clicks the story's button and waits until the page shows the run it started as finished.
async fn play(browser: &Browser, story: &str) -> Shown {
    let before = browser
        .script(r#"return document.getElementById("current").dataset.run || "0";"#)
        .await;
    browser.click(&format!("#play-{story}")).await;
    let wait = format!(
        r#"const c = document.getElementById("current");
           if (c.dataset.phase === "failed") return "failed: " + c.textContent;
           return c.dataset.run !== {before} && c.dataset.story === "{story}"
               && c.dataset.phase === "finished" ? "finished" : null;"#
    );
    let ended = browser.wait_for(story, &wait, STORY_TIMEOUT).await;
    assert_eq!(ended, "finished", "{story}");
    let value = browser.script(SHOWN).await;
    let field = |v: &Value, name: &str| v[name].as_str().unwrap_or_default().to_owned();
    Shown {
        key: field(&value, "key"),
        verdict_class: field(&value, "verdict_class"),
        verdict: field(&value, "verdict"),
        document: field(&value, "document"),
        document_class: field(&value, "document_class"),
        events: field(&value, "events"),
        marks: value["marks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Mark {
                worker: field(m, "worker"),
                fence: m["fence"].as_i64().unwrap(),
                outcome: field(m, "outcome"),
                colour: field(m, "colour"),
                text: field(m, "text"),
                classes: field(m, "classes"),
            })
            .collect(),
    }
}

fn outcomes(shown: &Shown) -> Vec<(&str, &str)> {
    shown
        .marks
        .iter()
        .map(|m| (m.worker.as_str(), m.outcome.as_str()))
        .collect()
}

/// Guard on: A's late write is a red mark with A's fence, and B's report stands.
fn assert_protected(shown: &Shown) {
    let marks = &shown.marks;
    assert_eq!(
        outcomes(shown),
        [
            ("worker A", "applied"),
            ("worker B", "applied"),
            ("worker A", "rejected")
        ],
        "{shown:#?}"
    );
    let (a, b, late) = (&marks[0], &marks[1], &marks[2]);
    assert!(a.fence < b.fence, "{shown:#?}");
    assert_eq!(late.fence, a.fence, "{shown:#?}");
    assert_eq!(late.colour, REJECTED_RED, "{shown:#?}");
    assert!(late.text.contains(&late.fence.to_string()), "{shown:#?}");
    assert!(late.text.contains("rejected"), "{shown:#?}");
    assert_eq!(b.colour, APPLIED_GREEN, "{shown:#?}");
    assert_eq!(shown.document, "B's complete report", "{shown:#?}");
    assert!(shown.verdict_class.contains("protected"), "{shown:#?}");
}

/// Saves a screenshot as `name` when `FENCELOCK_PAGE_SCREENSHOTS` names a directory.
async fn screenshot(browser: &Browser, name: &str) {
    let png = browser.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    if let Some(dir) = std::env::var_os("FENCELOCK_PAGE_SCREENSHOTS") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("page-{name}.png")), png).unwrap();
    }
}

/// Every request the page made went to its own origin, and the browser logged no error: no
/// Content-Security-Policy violation, no failed request.
async fn assert_only_own_requests(browser: &Browser, url: &str) {
    let origin = url.trim_end_matches('/');
    let requested = browser
        .script(r#"return performance.getEntriesByType("resource").map((e) => e.name);"#)
        .await;
    let requested = requested.as_array().unwrap();
    assert!(!requested.is_empty(), "the page loads its files");
    for name in requested {
        let name = name.as_str().unwrap();
        assert!(name.starts_with(origin), "a request elsewhere: {name}");
    }
    let log = browser.log().await;
    for entry in &log {
        let message = entry["message"].as_str().unwrap_or_default();
        assert_ne!(entry["level"], "SEVERE", "{log:#?}");
        assert!(!message.contains("Content Security Policy"), "{log:#?}");
        assert!(!message.contains("Failed to load"), "{log:#?}");
    }
}

/// The page's files and endpoints answer with the policy that keeps it to its own origin.
async fn assert_policy(url: &str) {
    let http = fencelock_testkit::client();
    for (path, kind) in [
        ("", "text/html"),
        ("page.css", "text/css"),
        ("page.js", "text/javascript"),
        ("page.svg", "image/svg+xml"),
    ] {
        let response = http.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(response.status(), 200, "/{path}");
        let header = |name: &str| {
            response.headers()[name]
                .to_str()
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(
            header("content-security-policy"),
            "default-src 'self'",
            "/{path}"
        );
        assert!(header("content-type").starts_with(kind), "/{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "/{path}");
    }
    // The page's JSON never shows an owner, the holder's secret.
    let state = json_answer(http.get(format!("{url}page/state"))).await;
    assert!(!state.to_string().contains("\"owner\""), "{state}");
}

/// `fencelock-demo page`: every story, clicked in the browser, ends as it should, the lease
/// is shown counting down while A holds it, and nothing is loaded from elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_plays_every_story_in_a_browser() {
    let served = Served::page(&[]);
    assert_policy(&served.url).await;
    let browser = Browser::start(1280, 800).await;
    browser.goto(&served.url).await;
    browser
        .wait_for(
            "the first state",
            r#"return document.getElementById("status").textContent === "Ready." || null;"#,
            STORY_TIMEOUT,
        )
        .await;

    // While A holds the lease (2 s), the page shows it as the lease server sees it: A's
    // fence, A's name, and the time left.
    browser.click("#play-guard-on").await;
    let lease = browser
        .wait_for(
            "A's lease on the page",
            r#"const lease = document.getElementById("lease");
               const left = document.getElementById("lease-left");
               return lease && left && lease.textContent.includes("worker A")
                   && /[0-9.]+ s/.test(left.textContent) ? lease.textContent : null;"#,
            STORY_TIMEOUT,
        )
        .await;
    assert!(lease.as_str().unwrap().contains("fence "), "{lease}");
    browser
        .wait_for(
            "the first run to end",
            r#"return document.getElementById("current").dataset.phase === "finished" || null;"#,
            STORY_TIMEOUT,
        )
        .await;
    assert_protected(&play(&browser, "guard-on").await);
    screenshot(&browser, "guard-on").await;

    let lost = play(&browser, "guard-off").await;
    assert_eq!(
        outcomes(&lost),
        [
            ("worker A", "applied"),
            ("worker B", "applied"),
            ("worker A", "applied")
        ],
        "{lost:#?}"
    );
    let (b, late) = (&lost.marks[1], &lost.marks[2]);
    assert!(late.fence < b.fence, "{lost:#?}");
    assert_eq!(late.colour, APPLIED_GREEN, "{lost:#?}");
    assert!(b.classes.contains("overwritten"), "{lost:#?}");
    assert!(late.classes.contains("stale"), "{lost:#?}");
    assert_eq!(lost.document, "A's report, part 2 (late)", "{lost:#?}");
    assert!(lost.document_class.contains("lost"), "{lost:#?}");
    assert!(lost.verdict_class.contains("data-loss"), "{lost:#?}");
    assert!(lost.verdict.contains("Data loss"), "{lost:#?}");
    screenshot(&browser, "guard-off").await;
    browser.resize(420, 900).await;
    screenshot(&browser, "guard-off-narrow").await;
    browser.resize(1280, 800).await;

    // The gap: A's late write comes before B's first, so the store takes it.
    let gap = play(&browser, "gap").await;
    assert_eq!(
        outcomes(&gap),
        [
            ("worker A", "applied"),
            ("worker A", "applied"),
            ("worker B", "applied")
        ],
        "{gap:#?}"
    );
    assert!(!gap.marks[0].classes.contains("stale"), "{gap:#?}");
    assert!(gap.marks[1].classes.contains("stale"), "{gap:#?}");
    assert!(gap.verdict_class.contains("gap"), "{gap:#?}");
    assert_eq!(gap.document, "B's complete report", "{gap:#?}");
    screenshot(&browser, "gap").await;

    // The same gap, but A asks the lease server before its irreversible step, and stops.
    let checked = play(&browser, "gap-checked").await;
    assert_eq!(
        outcomes(&checked),
        [("worker A", "applied"), ("worker B", "applied")],
        "{checked:#?}"
    );
    assert!(
        checked.events.contains("stops without writing"),
        "{checked:#?}"
    );
    assert!(checked.verdict_class.contains("stopped"), "{checked:#?}");
    screenshot(&browser, "gap-checked").await;

    // Each run had a key of its own, and the earlier runs stay on the page below.
    let earlier = browser
        .script(r##"return document.querySelectorAll("#earlier .earlier-run").length;"##)
        .await;
    assert_eq!(earlier, 4, "the first run and three more");
    assert_ne!(gap.key, checked.key);
    assert_only_own_requests(&browser, &served.url).await;
}

/// `fencelock-demo store --lease-url` serves the page too, and plays its stories against
/// that lease server: here one on PostgreSQL, whose metrics count the two workers' leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_serves_the_page_with_a_lease_server_on_postgres() {
    let leases = TestApp::spawn(StoreKind::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let served = Served::store(&["--lease-url", &leases.address], dir.path());
    assert_policy(&served.url).await;
    let browser = Browser::start(1280, 800).await;
    browser.goto(&served.url).await;

    let shown = play(&browser, "guard-on").await;
    assert_protected(&shown);
    let lease_server = browser
        .script(r#"return document.getElementById("lease-server").textContent;"#)
        .await;
    assert_eq!(lease_server, leases.address.as_str());

    // The lease server on PostgreSQL granted both leases: A's first, then B's after A's had
    // expired (a takeover), and B released its own.
    let counted = leases.metrics().await;
    let acquired = |outcome| counted.value("fencelock_acquire_total", &[("outcome", outcome)]);
    assert_eq!(acquired("acquired"), 1.0, "A's lease");
    assert_eq!(acquired("taken_over"), 1.0, "B's lease");
    let released = counted.value("fencelock_release_total", &[("outcome", "released")]);
    assert_eq!(released, 1.0, "B's release");
    assert_only_own_requests(&browser, &served.url).await;
}
