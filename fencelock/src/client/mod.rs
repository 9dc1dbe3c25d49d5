//! The worker client: acquire, renew, release, inspect and list leases over the HTTP
//! contract, retry under contention within a deadline or let the server wait
//! ([`Client::lock`]), and hold a [`Lease`] that renews itself and says promptly when it is
//! lost — or run work under one that is cancelled when it is ([`Lease::run`],
//! [`Client::with_lock`]).
//!
//! ```no_run
//! # async fn work(fence: i64) {}
//! # async fn example() -> Result<(), fencelock::client::Error> {
//! use std::time::Duration;
//! use fencelock::client::{Client, RetryPolicy};
//!
//! let client = Client::new("http://127.0.0.1:8080")?;
//! let lease = client
//!     .lease_with_retry("job:42", Duration::from_secs(30), &RetryPolicy::default())
//!     .await?;
//! tokio::select! {
//!     // Send the fence with every write to the protected store.
//!     () = work(lease.fence()) => lease.release().await?,
//!     reason = lease.lost() => eprintln!("stopped: {reason}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Errors
//! Every operation returns [`Error`], whose variants separate contention
//! ([`Error::Held`]), outages ([`Error::Unavailable`]) and loss ([`Error::LeaseLost`]) from
//! caller bugs, so a worker can choose between waiting, retrying and stopping.
//!
//! # Layout
//! - this file: [`Client`], its builder, and the lock types of the contract.
//! - `error`: [`Error`] and [`LossReason`].
//! - `answer`: HTTP answers → results (the one status mapping).
//! - `retry`: [`RetryPolicy`].
//! - `lease`: [`Lease`], [`LeaseWatch`] and the renewal task.

mod answer;
mod error;
mod lease;
mod retry;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

pub use error::{Error, LossReason};
pub use lease::{Lease, LeaseWatch};
pub use retry::RetryPolicy;

/// Default limit for one whole request (connect, send, answer), so that a hung server turns
/// into [`Error::Unavailable`] instead of a hung worker.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default limit for opening a connection; a refused or black-holed server is found out
/// sooner than the whole-request limit.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A live lease as acquire and renew report it to its holder.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LockInfo {
    /// The locked resource.
    pub resource: String,
    /// The owner, as the server trimmed it.
    pub owner: String,
    /// The fencing token: send it with every write the lease protects. Greater than every
    /// fence issued by the same store before this acquisition.
    pub fence: i64,
    /// The fence signed for this resource, when the server has a fence key: send it as
    /// `Fencing-Token` in place of the bare fence (guards with the key refuse bare fences).
    #[serde(default)]
    pub fence_token: Option<String>,
    /// When this lease was acquired, by the store's clock.
    pub acquired_at: DateTime<Utc>,
    /// When this lease expires, by the store's clock. Do not compare it with the local
    /// clock; use `expires_in_ms`.
    pub expires_at: DateTime<Utc>,
    /// Time left when the server answered, measured by the store's clock. Added to the
    /// instant the request was *sent*, it gives a local deadline that is never late.
    pub expires_in_ms: i64,
}

/// A live lease as anyone may see it (`GET /locks/{resource}`): no owner.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LockView {
    /// The locked resource.
    pub resource: String,
    /// The live lease's fence.
    pub fence: i64,
    /// When the live lease was acquired, by the store's clock.
    pub acquired_at: DateTime<Utc>,
    /// When the live lease expires, by the store's clock.
    pub expires_at: DateTime<Utc>,
    /// Time left when the server answered, by the store's clock.
    pub expires_in_ms: i64,
}

/// One page of live leases (`GET /locks`), in name order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LockPage {
    /// The live leases of the page, without owners.
    pub locks: Vec<LockView>,
    /// Pass it as `after` for the next page; `None` on the last page.
    pub next: Option<String>,
}

/// A successful acquisition and the monotonic instant its request was sent: the earliest
/// moment the server's lease could have started, so `sent + expires_in_ms` never overstates
/// how long the lease is valid.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    lock: LockInfo,
    sent: Instant,
}

/// A client of one fencelock server (or a load balancer in front of several sharing a store).
///
/// Cheap to clone: clones share one connection pool. Nothing is validated on the client side
/// (the server checks names, owners and TTLs and answers `422`, surfaced as
/// [`Error::Rejected`]), except what cannot be sent at all ([`Error::InvalidInput`]).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The base URL without a trailing slash, e.g. `http://127.0.0.1:8080` or
    /// `https://locks.example/fencelock`.
    base: Arc<str>,
    /// The limit for one whole request; a waiting acquire gets its wait on top.
    timeout: Duration,
}

/// Builds a [`Client`]: base URL, timeouts, proxy use, extra CA certificates.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base_url: String,
    timeout: Duration,
    connect_timeout: Duration,
    use_proxy: bool,
    bearer_token: Option<BearerToken>,
    /// PEM bundles of CA certificates trusted beside the built-in roots.
    root_certificates: Vec<Vec<u8>>,
}

/// A bearer secret: never shown by `Debug`.
#[derive(Clone)]
struct BearerToken(String);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

impl ClientBuilder {
    /// Sends `Authorization: Bearer <secret>` with every request, for a server that runs
    /// with `--auth-file`. The secret is never shown by `Debug` nor in errors.
    pub fn bearer_token(mut self, secret: impl Into<String>) -> Self {
        self.bearer_token = Some(BearerToken(secret.into()));
        self
    }

    /// The limit for one whole request (default [`DEFAULT_TIMEOUT`]). A [`Lease`] further
    /// bounds each renewal by its renewal interval and its expiry.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The limit for opening a connection (default [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Ignores the proxy settings of the environment (`HTTP_PROXY` and friends), which are
    /// honoured by default. For servers on the local host or network, and for tests.
    pub fn no_proxy(mut self) -> Self {
        self.use_proxy = false;
        self
    }

    /// Also trusts the CA certificates in `pem` (one or more PEM `CERTIFICATE` blocks) for
    /// an `https` server, beside the built-in web roots: for a server whose certificate was
    /// issued by a private CA, or is self-signed (then `pem` is that certificate). The PEM is
    /// read by [`ClientBuilder::build`], which fails with [`Error::Config`] if it holds no
    /// certificate.
    pub fn add_root_certificate_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificates.push(pem.into());
        self
    }

    /// Builds the client. Fails with [`Error::Config`] if the base URL is not an absolute
    /// `http`/`https` URL without query or fragment, a CA certificate is not PEM, or the
    /// HTTP stack cannot start.
    pub fn build(self) -> Result<Client, Error> {
        let base = base_url(&self.base_url)?;
        let mut http = reqwest::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            // A redirect would silently turn a POST into a GET; the contract has none.
            .redirect(reqwest::redirect::Policy::none());
        if !self.use_proxy {
            http = http.no_proxy();
        }
        if let Some(BearerToken(secret)) = &self.bearer_token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {secret}"))
                .map_err(|_| {
                    Error::Config("the bearer token holds characters a header cannot".to_owned())
                })?;
            value.set_sensitive(true);
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(reqwest::header::AUTHORIZATION, value);
            http = http.default_headers(headers);
        }
        for pem in &self.root_certificates {
            let bundle = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| Error::Config(format!("CA certificate: {}", chain(&e))))?;
            if bundle.is_empty() {
                return Err(Error::Config(
                    "CA certificate: no PEM certificate in it".to_owned(),
                ));
            }
            for certificate in bundle {
                http = http.add_root_certificate(certificate);
            }
        }
        let http = http
            .build()
            .map_err(|e| Error::Config(format!("building the HTTP client: {}", chain(&e))))?;
        Ok(Client {
            http,
            base: base.into(),
            timeout: self.timeout,
        })
    }
}

impl Client {
    /// A client with default settings for the server at `base_url`, e.g.
    /// `http://127.0.0.1:8080`. Proxies are taken from the environment, as reqwest does.
    pub fn new(base_url: impl Into<String>) -> Result<Self, Error> {
        Self::builder(base_url).build()
    }

    /// A builder for a client of the server at `base_url`.
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            use_proxy: true,
            bearer_token: None,
            root_certificates: Vec::new(),
        }
    }

    /// Acquires `resource` for `owner` for `ttl` (sent as whole seconds, rounded up; the
    /// server accepts 1 s up to its maximum). Never blocks on contention.
    ///
    /// - Ok: the lease, with a new fence. Also when `owner` already held it (re-acquired).
    /// - [`Error::Held`]: another owner holds a live lease.
    /// - [`Error::Unavailable`]: unknown outcome; retry with the same `owner`.
    pub async fn acquire(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<LockInfo, Error> {
        self.acquire_timed(resource, owner, ttl)
            .await
            .map(|grant| grant.lock)
    }

    /// [`acquire`](Self::acquire), retried on [`Error::Held`] and [`Error::Unavailable`] as
    /// `policy` says, always with the same `owner` (so an attempt that succeeded unseen is
    /// re-acquired, not blocked on). After the deadline, returns the last error.
    pub async fn acquire_with_retry(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
        policy: &RetryPolicy,
    ) -> Result<LockInfo, Error> {
        policy.run(|| self.acquire(resource, owner, ttl)).await
    }

    /// Extends `owner`'s live lease on `resource` to now + `ttl`. With `fence`, only the lease
    /// with that fence is extended, so a late renewal can never extend a newer lease.
    ///
    /// [`Error::LeaseLost`] when the server answers `404` or `409`: the lease is gone.
    pub async fn renew(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
        fence: Option<i64>,
    ) -> Result<LockInfo, Error> {
        let body = json!({ "owner": owner, "ttl_seconds": whole_seconds(ttl), "fence": fence });
        let url = self.url(resource, "/renew")?;
        let (status, bytes) = self.send(Method::POST, url, Some(body)).await?;
        answer::renew(status, &bytes, fence)
    }

    /// Releases `owner`'s live lease on `resource`. With `fence`, only the lease with that
    /// fence is released, so a late release can never free a newer lease.
    ///
    /// [`Error::LeaseLost`] when the server answers `404`, `403` or `409`: the caller did not
    /// hold that lease (any more).
    pub async fn release(
        &self,
        resource: &str,
        owner: &str,
        fence: Option<i64>,
    ) -> Result<(), Error> {
        let body = json!({ "owner": owner, "fence": fence });
        let url = self.url(resource, "")?;
        let (status, bytes) = self.send(Method::DELETE, url, Some(body)).await?;
        answer::release(status, &bytes)
    }

    /// The live lease on `resource`, if any (`Ok(None)` for none or expired).
    pub async fn inspect(&self, resource: &str) -> Result<Option<LockView>, Error> {
        let url = self.url(resource, "")?;
        let (status, bytes) = self.send(Method::GET, url, None).await?;
        answer::inspect(status, &bytes)
    }

    /// One page of the live leases whose names start with `prefix` (`""`: all), in name
    /// order: those after `after` (the previous page's `next`; `None` from the start), at most
    /// `limit` (1-1000; `None`: the server's default, 100). With a bearer token, only names
    /// inside its prefixes; a `prefix` outside all of them is [`Error::Rejected`] (`403`).
    pub async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: Option<u32>,
    ) -> Result<LockPage, Error> {
        let mut url = reqwest::Url::parse(&format!("{}/locks", self.base))
            .map_err(|e| Error::Config(format!("base URL: {e}")))?;
        {
            // Form-encoded, so a `+` in a name goes as `%2B`, not as a space.
            let mut query = url.query_pairs_mut();
            query.append_pair("prefix", prefix);
            if let Some(after) = after {
                query.append_pair("after", after);
            }
            if let Some(limit) = limit {
                query.append_pair("limit", &limit.to_string());
            }
        }
        let (status, bytes) = self.send(Method::GET, url.into(), None).await?;
        answer::list(status, &bytes)
    }

    /// Acquires `resource` under a fresh random owner secret and returns a [`Lease`] that
    /// renews itself every third of its time until released, dropped or lost. Fails like
    /// [`acquire`](Self::acquire); [`Error::Held`] if someone else holds it. Must run on a
    /// Tokio runtime (the renewals are a spawned task).
    ///
    /// If it fails with [`Error::Unavailable`], the server may still have granted the lease
    /// unseen; nobody knows its owner secret, so it simply lapses at the end of `ttl`.
    pub async fn lease(&self, resource: &str, ttl: Duration) -> Result<Lease, Error> {
        let owner = lease::OwnerSecret::random();
        let grant = self.acquire_timed(resource, owner.expose(), ttl).await?;
        Ok(Lease::start(self.clone(), resource, owner, ttl, grant))
    }

    /// Acquires `resource` under a fresh random owner secret, letting the server wait up to
    /// `wait` for another owner to release it (API.md, *Waiting*: one request, answered as
    /// soon as the lease is handed over, in the order waiters arrived), and returns a
    /// self-renewing [`Lease`] as [`lease`](Self::lease) does.
    ///
    /// With `wait` zero this is [`lease`](Self::lease): one attempt, and `wait_ms` is not
    /// sent, so servers without waiting serve it too. Otherwise `wait` is sent as `wait_ms`
    /// (whole milliseconds, rounded up; the server refuses more than its `--max-wait-ms`
    /// with [`Error::Rejected`]), and the request may take `wait` longer than the client's
    /// [timeout](ClientBuilder::timeout). A server that does not wait refuses `wait_ms` with
    /// [`Error::Rejected`] (`422`): use [`lease_with_retry`](Self::lease_with_retry) there.
    ///
    /// [`Error::Held`] if the resource is still held when the wait is over.
    pub async fn lock(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, Error> {
        let owner = lease::OwnerSecret::random();
        let grant = self
            .acquire_waiting(resource, owner.expose(), ttl, wait)
            .await?;
        Ok(Lease::start(self.clone(), resource, owner, ttl, grant))
    }

    /// Runs `work` while holding a lock on `resource`: [`lock`](Self::lock), then
    /// [`Lease::run`] with the future `work` makes from the lease's [`LeaseWatch`] (for its
    /// fence). The lease is released when `work` ends; if the lease is lost first, `work` is
    /// cancelled (dropped) and the result is [`Error::LeaseLost`].
    ///
    /// ```no_run
    /// # async fn write_report(fence: i64) -> usize { 0 }
    /// # async fn example() -> Result<(), fencelock::client::Error> {
    /// use std::time::Duration;
    /// use fencelock::client::Client;
    ///
    /// let client = Client::new("http://127.0.0.1:8080")?;
    /// let pages = client
    ///     .with_lock("report:monthly", Duration::from_secs(30), Duration::from_secs(10), |lease| async move {
    ///         // Send the fence with every write to the protected store.
    ///         write_report(lease.fence()).await
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn with_lock<F, Fut>(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
        work: F,
    ) -> Result<Fut::Output, Error>
    where
        F: FnOnce(LeaseWatch) -> Fut,
        Fut: Future,
    {
        let lease = self.lock(resource, ttl, wait).await?;
        let watch = lease.watch();
        lease.run(work(watch)).await
    }

    /// [`lease`](Self::lease), with the acquisition retried as `policy` says (one owner
    /// secret for all attempts, so an attempt that succeeded unseen is re-acquired by the
    /// next one). After the deadline, returns the last error.
    pub async fn lease_with_retry(
        &self,
        resource: &str,
        ttl: Duration,
        policy: &RetryPolicy,
    ) -> Result<Lease, Error> {
        let owner = lease::OwnerSecret::random();
        let grant = policy
            .run(|| self.acquire_timed(resource, owner.expose(), ttl))
            .await?;
        Ok(Lease::start(self.clone(), resource, owner, ttl, grant))
    }

    /// Acquire, remembering when the request was sent.
    async fn acquire_timed(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Grant, Error> {
        self.acquire_waiting(resource, owner, ttl, Duration::ZERO)
            .await
    }

    /// Acquire, letting the server wait up to `wait` (`wait_ms` is sent only when it is not
    /// zero), remembering when the lease can have started at the earliest.
    async fn acquire_waiting(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Grant, Error> {
        let mut body = json!({ "owner": owner, "ttl_seconds": whole_seconds(ttl) });
        if !wait.is_zero() {
            body["wait_ms"] = json!(whole_millis(wait));
        }
        let url = self.url(resource, "")?;
        let sent = Instant::now();
        let mut request = self.http.post(url).json(&body);
        if !wait.is_zero() {
            // The server answers only when the wait is over: the limit is for the rest.
            request = request.timeout(self.timeout.saturating_add(wait));
        }
        let (status, bytes) = read(request).await?;
        let granted = answer::acquire(status, &bytes, resource)?;
        // The server granted the lease only after waiting `waited_ms` from the request's
        // arrival, which is after it was sent: a later start, still never a late one.
        let sent = sent + granted.waited;
        Ok(Grant {
            lock: granted.lock,
            sent,
        })
    }

    /// `{base}/locks/{resource}{suffix}`, with the resource as one path segment.
    fn url(&self, resource: &str, suffix: &str) -> Result<String, Error> {
        Ok(format!(
            "{}/locks/{}{suffix}",
            self.base,
            path_segment(resource)?
        ))
    }

    /// Sends one request and reads the whole answer. Transport failures (connect, timeout,
    /// unreadable body) are [`Error::Unavailable`]; statuses are left to `answer`.
    async fn send(
        &self,
        method: Method,
        url: String,
        body: Option<serde_json::Value>,
    ) -> Result<(StatusCode, Vec<u8>), Error> {
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        read(request).await
    }
}

/// Sends `request` and reads the whole answer (see [`Client::send`]).
async fn read(request: reqwest::RequestBuilder) -> Result<(StatusCode, Vec<u8>), Error> {
    let response = request.send().await.map_err(transport)?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(transport)?.to_vec();
    Ok((status, bytes))
}

/// Checks and normalises the base URL: absolute `http`/`https`, no query or fragment, no
/// trailing slash.
fn base_url(raw: &str) -> Result<String, Error> {
    let url =
        reqwest::Url::parse(raw).map_err(|e| Error::Config(format!("base URL `{raw}`: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Error::Config(format!(
            "base URL `{raw}` is not http or https"
        )));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Error::Config(format!(
            "base URL `{raw}` has a query or fragment"
        )));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// The resource as one URL path segment. Characters the contract allows in names go as
/// they are; any other byte is percent-encoded, so that the server sees the name as given
/// (and answers `422` for a bad one) rather than another path (`/` would make one).
fn path_segment(resource: &str) -> Result<String, Error> {
    if matches!(resource, "." | "..") {
        return Err(Error::InvalidInput(format!(
            "the resource `{resource}` cannot be named in a URL path"
        )));
    }
    let mut segment = String::with_capacity(resource.len());
    for byte in resource.bytes() {
        if byte.is_ascii_alphanumeric() || b"._-:@+=~".contains(&byte) {
            segment.push(char::from(byte));
        } else {
            segment.push_str(&format!("%{byte:02X}"));
        }
    }
    Ok(segment)
}

/// A TTL in the contract's whole seconds, rounded up so that a lease is never shorter than
/// asked (zero stays zero, which the server refuses).
fn whole_seconds(ttl: Duration) -> u64 {
    let seconds = ttl.as_secs();
    if ttl.subsec_nanos() > 0 {
        seconds.saturating_add(1)
    } else {
        seconds
    }
}

/// A wait in the contract's whole milliseconds, rounded up (so `wait_ms` is never zero for
/// a wait that is not).
fn whole_millis(wait: Duration) -> u64 {
    let millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    if !wait.subsec_nanos().is_multiple_of(1_000_000) {
        millis.saturating_add(1)
    } else {
        millis
    }
}

/// A transport failure as [`Error::Unavailable`] (or [`Error::Config`] if the request
/// could not even be built), with its whole cause chain: reqwest's own message alone hides
/// whether the connection was refused or timed out.
fn transport(error: reqwest::Error) -> Error {
    if error.is_builder() {
        Error::Config(chain(&error))
    } else {
        Error::Unavailable(chain(&error))
    }
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_names_go_as_they_are_and_others_are_encoded() {
        for (name, segment) in [
            ("job:42@a+b=c~d.e_f-g", "job:42@a+b=c~d.e_f-g"),
            ("a/b c", "a%2Fb%20c"),
            ("ü%", "%C3%BC%25"),
            ("", ""),
        ] {
            assert_eq!(path_segment(name).unwrap(), segment, "{name:?}");
        }
        for dots in ["..", "."] {
            let refused = path_segment(dots);
            assert!(matches!(refused, Err(Error::InvalidInput(_))), "{dots}");
        }
    }

    #[test]
    fn base_url_is_normalised() {
        for (given, base) in [
            ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
            ("https://h/prefix/", "https://h/prefix"),
        ] {
            assert_eq!(base_url(given).unwrap(), base, "{given}");
        }
        for bad in ["127.0.0.1:8080", "ftp://h", "http://h/?q=1", "not a url"] {
            assert!(matches!(base_url(bad), Err(Error::Config(_))), "{bad}");
        }
    }

    #[test]
    fn ttl_is_rounded_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn wait_is_rounded_up_to_whole_milliseconds() {
        assert_eq!(whole_millis(Duration::from_nanos(1)), 1);
        assert_eq!(whole_millis(Duration::from_millis(1500)), 1500);
        assert_eq!(whole_millis(Duration::from_micros(1500)), 2);
        assert_eq!(whole_millis(Duration::MAX), u64::MAX);
    }
}
