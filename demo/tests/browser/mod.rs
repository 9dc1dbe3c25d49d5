//! A real headless browser for the page's tests: Debian's `chromium`, driven over WebDriver
//! by its `chromedriver` (the `chromium-driver` package; `.ci/run` installs both). The
//! WebDriver protocol is JSON over HTTP, so the few commands the tests use are sent with
//! reqwest rather than through a WebDriver crate and its dependency tree.

use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

/// Chromium's flags for a headless run on a CI box: no sandbox (the tests may run as root),
/// no GPU, and nothing that would reach the network on its own (component updates, sync,
/// background requests), so the only requests made are the page's.
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
];

fn program(variable: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(variable).map_or_else(|| PathBuf::from(default), PathBuf::from);
    assert!(
        path.exists(),
        "{} not found: install Debian's chromium and chromium-driver \
         (`apt-get install -y chromium chromium-driver`; .ci/run does), or set {variable}",
        path.display()
    );
    path
}

/// A browser session, closed (and its driver stopped) when dropped.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// A fresh browser (its own profile directory) with a `width`×`height` window.
    pub async fn start(width: u32, height: u32) -> Self {
        let chromium = program("FENCELOCK_CHROMIUM", "/usr/bin/chromium");
        let chromedriver = program("FENCELOCK_CHROMEDRIVER", "/usr/bin/chromedriver");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let profile = tempfile::tempdir().unwrap();
        let mut browser = Self {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = browser
                .http
                .get(format!("{}/status", browser.base))
                .send()
                .await;
            if let Ok(response) = status
                && let Ok(body) = response.json::<Value>().await
                && body["value"]["ready"] == true
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut args: Vec<String> = FLAGS.iter().map(|f| (*f).to_owned()).collect();
        args.push(format!(
            "--user-data-dir={}",
            browser._profile.path().display()
        ));
        args.push(format!("--window-size={width},{height}"));
        let created = browser
            .send(
                reqwest::Method::POST,
                "/session",
                Some(json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": { "binary": chromium, "args": args },
                    "goog:loggingPrefs": { "browser": "ALL" },
                }}})),
            )
            .await;
        browser.session = created["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned();
        browser.resize(width, height).await;
        browser
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("chromedriver answers");
        let status = response.status();
        let body: Value = response.json().await.expect("chromedriver answers JSON");
        assert!(status.is_success(), "{method} {path}: {status} {body}");
        body["value"].clone()
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        self.send(method, &path, body).await
    }

    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// Clicks the element `css` selects, as a user would (WebDriver's element click).
    pub async fn click(&self, css: &str) {
        let found = self
            .command(
                reqwest::Method::POST,
                "/element",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await;
        let id = found["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .expect("an element id");
        self.command(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Runs `body` (a function body: `return ...;`) in the page.
    pub async fn script(&self, body: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": body, "args": [] })),
        )
        .await
    }

    /// Polls `body` until it returns something other than `null` or `false`, and returns
    /// that; panics with `what` after `timeout`.
    pub async fn wait_for(&self, what: &str, body: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.script(body).await;
            if !value.is_null() && value != false {
                return value;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sizes the window so that the page's viewport is `width`×`height`: headless chromium
    /// keeps room for a window frame it does not draw, so the window is sized, the viewport
    /// measured, and the window sized again by the difference.
    pub async fn resize(&self, width: u32, height: u32) {
        let (mut outer_width, mut outer_height) = (width, height);
        for _ in 0..2 {
            self.command(
                reqwest::Method::POST,
                "/window/rect",
                Some(json!({ "width": outer_width, "height": outer_height })),
            )
            .await;
            let inner = self.script("return [innerWidth, innerHeight];").await;
            let measured = |i: usize| u32::try_from(inner[i].as_u64().unwrap_or(0)).unwrap_or(0);
            outer_width = (outer_width + width).saturating_sub(measured(0));
            outer_height = (outer_height + height).saturating_sub(measured(1));
        }
    }

    /// A PNG of the window's viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        let encoded = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("base64 text"))
            .expect("a PNG in base64")
    }

    /// The browser's console and network log since the last call: `{level, message}` each.
    pub async fn log(&self) -> Vec<Value> {
        let entries = self
            .command(
                reqwest::Method::POST,
                "/se/log",
                Some(json!({ "type": "browser" })),
            )
            .await;
        entries.as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Browser {
    /// Ends the session (which closes chromium), then stops the driver this test started.
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let address = self.base.trim_start_matches("http://").to_owned();
            if let Ok(mut stream) = TcpStream::connect(&address) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = write!(
                    stream,
                    "DELETE /session/{} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    self.session
                );
                let _ = std::io::Read::read_to_end(&mut stream, &mut Vec::new());
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
