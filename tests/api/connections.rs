//! Slow and idle clients: none holds a connection past the request timeout, however many
//! there are, and a normal client is served all along.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::helpers::{StoreKind, TestApp, TestDb, parse_raw};

/// The request timeout of these tests' servers, short so that the tests are.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Past the timeout, time for the server to answer, linger (actix reads out what the client
/// still sends for up to a second before closing) and close, on a loaded 2-core machine.
const MARGIN: Duration = Duration::from_secs(4);

/// Past the timeout, for a head or an idle connection: no linger here. Below actix's own
/// defaults (5 s for heads and keep-alive), so these tests see the setting at work.
const HEAD_MARGIN: Duration = Duration::from_millis(1500);

/// How long a slow client keeps sending before the test gives up on the server closing it.
const GIVE_UP: Duration = TIMEOUT
    .saturating_add(MARGIN)
    .saturating_add(Duration::from_secs(2));

/// How often a slow client sends its next byte.
const DRIP: Duration = Duration::from_millis(500);

/// The normal client's p99 latency bound while the slow clients are held. In a debug build
/// on the 2-core machine, with the server, the slow clients and the normal client (on its
/// own thread) in this one process, the p99 measured 9-87 ms over 8 runs of these tests
/// alone, but 107 ms once while the rest of the suite ran beside them, and 530 ms once with
/// the suite beside them on a slower 2-core machine: neither 100 nor 500 ms is a stable bound.
/// This one still catches what the cap is for, a server whose fresh connections stall behind
/// slow clients (their connects timed out after 10 s); the tests print the p99.
const P99_BOUND: Duration = Duration::from_secs(2);

async fn app_with_short_timeout(kind: StoreKind) -> TestApp {
    // The test process holds both ends of every connection: make room for them.
    let _ = fencelock_server::raise_open_file_limit();
    TestApp::spawn_on(TestDb::new(kind).await, |s| s.request_timeout = TIMEOUT).await
}

/// How one slow connection ended.
struct Ending {
    /// From the first byte sent to the server closing; `None`: still open when given up on.
    closed_after: Option<Duration>,
    received: Vec<u8>,
}

/// Sends `head` then, every [`DRIP`], one byte of `drip`, reading whatever comes back, until
/// the server closes the connection or [`GIVE_UP`] has passed.
async fn drip_feed(address: SocketAddr, head: Vec<u8>, drip: Vec<u8>) -> Ending {
    let Ok(Ok(mut stream)) =
        tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(address)).await
    else {
        panic!("could not connect within 10 s");
    };
    let started = Instant::now();
    let closed = |received| Ending {
        closed_after: Some(started.elapsed()),
        received,
    };
    if stream.write_all(&head).await.is_err() {
        return closed(Vec::new());
    }
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let mut ticks = tokio::time::interval(DRIP);
    ticks.tick().await;
    for byte in drip.iter().cycle() {
        if started.elapsed() > GIVE_UP {
            break;
        }
        tokio::select! {
            read = stream.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return closed(received),
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            },
            _ = ticks.tick() => {
                if stream.write_all(&[*byte]).await.is_err() {
                    return closed(received);
                }
            }
        }
    }
    Ending {
        closed_after: None,
        received,
    }
}

/// Opens `count` slowloris connections at once: each sends `head`, then header lines one byte
/// at a time ([`drip_feed`]). Returns how each ended.
async fn slowloris(address: SocketAddr, count: usize, head: &[u8]) -> Vec<Ending> {
    let tasks: Vec<_> = (0..count)
        .map(|_| {
            let drip = b"X-Padding: a\r\n".to_vec();
            tokio::spawn(drip_feed(address, head.to_vec(), drip))
        })
        .collect();
    let mut endings = Vec::with_capacity(count);
    for task in tasks {
        endings.push(task.await.expect("slowloris task"));
    }
    endings
}

/// A client behaving well: sequential requests until `stop`, each timed. Every request must
/// succeed; returns the latencies. It runs on a thread and runtime of its own, so that what
/// it measures is the server, not its queueing behind the slow clients' tasks in the test's
/// runtime.
async fn normal_client(app: &TestApp, stop: tokio::sync::watch::Receiver<bool>) -> Vec<Duration> {
    let base = app.address.clone();
    let thread = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(timed_requests(base, stop))
    });
    tokio::task::spawn_blocking(move || thread.join())
        .await
        .expect("joining the normal client")
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

async fn timed_requests(base: String, stop: tokio::sync::watch::Receiver<bool>) -> Vec<Duration> {
    let http = crate::helpers::client();
    let mut latencies = Vec::new();
    let mut n = 0u64;
    // Bounded: the slow clients are gone well within a minute.
    let until = Instant::now() + Duration::from_secs(60);
    while !*stop.borrow() && Instant::now() < until {
        n += 1;
        let started = Instant::now();
        let request = if n.is_multiple_of(2) {
            http.post(format!("{base}/locks/normal:{n}"))
                .json(&json!({ "owner": "normal", "ttl_seconds": 60 }))
        } else {
            http.get(format!("{base}/healthz"))
        };
        let status = request.send().await.map(|r| r.status().as_u16());
        latencies.push(started.elapsed());
        assert!(
            matches!(status, Ok(200)),
            "a normal request failed while slow clients were held: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    latencies
}

/// The longest any of `endings` took to be closed, asserted to be at most `bound`; fails the
/// test if one was still open when given up on.
fn slowest_close<'a>(endings: impl IntoIterator<Item = &'a Ending>, bound: Duration) -> Duration {
    let mut slowest = Duration::ZERO;
    for (i, ending) in endings.into_iter().enumerate() {
        let Some(after) = ending.closed_after else {
            panic!("slow connection {i} was still open when given up on");
        };
        slowest = slowest.max(after);
    }
    assert!(
        slowest <= bound,
        "a slow connection was closed only after {slowest:?}"
    );
    slowest
}

/// Prints `summary` (of the slow connections) beside the normal client's p99, and asserts
/// that the p99 stayed under [`P99_BOUND`].
fn assert_normal_client_served(summary: &str, mut latencies: Vec<Duration>) {
    let p99 = p99(&mut latencies);
    println!(
        "{summary}; normal client: {} requests, p99 {p99:?}",
        latencies.len()
    );
    assert!(p99 < P99_BOUND, "normal client p99 {p99:?}");
}

fn p99(latencies: &mut [Duration]) -> Duration {
    assert!(!latencies.is_empty(), "the normal client made no request");
    latencies.sort();
    latencies[(latencies.len() * 99).div_ceil(100) - 1]
}

/// Open file handles of this process (the server runs in it too) and its soft limit.
fn open_files() -> (usize, u64) {
    let open = std::fs::read_dir("/proc/self/fd")
        .map(Iterator::count)
        .unwrap_or(0);
    let (soft, _) = rlimit::Resource::NOFILE.get().expect("open-file limit");
    (open, soft)
}

/// Samples the open-file count until `stop`; returns the largest seen.
async fn watch_open_files(mut stop: tokio::sync::watch::Receiver<bool>) -> usize {
    let mut most = 0;
    loop {
        let (open, soft) = open_files();
        assert!(
            (open as u64) < soft,
            "{open} open files reached the limit {soft}"
        );
        most = most.max(open);
        tokio::select! {
            _ = stop.changed() => return most,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// A request head for each kind of route: one that reads the body (acquire, answered `408`)
/// and ones that never read it (inspect, health, unknown path, wrong method).
fn slow_body_head(i: usize) -> (Vec<u8>, u16) {
    let (request, status) = match i % 5 {
        0 | 1 => (format!("POST /locks/slow:{i}"), 408),
        2 => (format!("GET /locks/slow:{i}"), 404),
        3 => ("GET /healthz".to_owned(), 200),
        _ => (format!("PUT /locks/slow:{i}/renew"), 405),
    };
    let head = format!(
        "{request} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 16000\r\n\r\n{{"
    );
    (head.into_bytes(), status)
}

/// 2,000 connections send a body one byte at a time: each is answered (`408` where the body
/// is read) and closed within the request timeout, the process stays below its open-file
/// limit, and a normal client is served throughout with a low p99.
async fn slow_bodies_are_cut_off_at_the_request_timeout(kind: StoreKind) {
    const SLOW: usize = 2_000;
    let app = app_with_short_timeout(kind).await;
    let address = app.socket_address();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let files = tokio::spawn(watch_open_files(stopped.clone()));

    let mut slow = Vec::with_capacity(SLOW);
    let normal = normal_client(&app, stopped.clone());
    let opened = async {
        for i in 0..SLOW {
            let (head, status) = slow_body_head(i);
            let drip = b" ".to_vec();
            slow.push((status, tokio::spawn(drip_feed(address, head, drip))));
            // A ramp rather than a burst, so that the listen backlog never overflows.
            if (i + 1).is_multiple_of(100) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let mut endings = Vec::with_capacity(SLOW);
        for (status, task) in slow.drain(..) {
            endings.push((status, task.await.expect("slow client task")));
        }
        let _ = stop.send(true);
        endings
    };
    let (latencies, endings) = tokio::join!(normal, opened);
    let most_files = files.await.expect("file watcher");

    let slowest = slowest_close(endings.iter().map(|(_, ending)| ending), TIMEOUT + MARGIN);
    for (i, (status, ending)) in endings.iter().enumerate() {
        let response = parse_raw(&ending.received)
            .unwrap_or_else(|| panic!("slow connection {i} closed without an answer"));
        assert_eq!(response.status, *status, "slow connection {i}");
        assert_eq!(
            response.header("connection"),
            Some("close"),
            "connection {i}"
        );
        if *status == 408 {
            crate::helpers::assert_raw_problem(&response, 408, "request-timeout");
        }
    }
    assert_normal_client_served(
        &format!(
            "slow bodies ({kind:?}): {SLOW} connections, all closed within {slowest:?}, at most {most_files} open files"
        ),
        latencies,
    );
}

/// Slowloris: a few hundred connections send their request head one byte at a time; each is
/// closed within the request timeout while a normal client is served.
async fn slow_heads_are_cut_off_at_the_request_timeout(kind: StoreKind) {
    const SLOW: usize = 300;
    let app = app_with_short_timeout(kind).await;
    let address = app.socket_address();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let normal = normal_client(&app, stopped.clone());
    let held = async {
        let endings = slowloris(address, SLOW, b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
        let _ = stop.send(true);
        endings
    };
    let (latencies, endings) = tokio::join!(normal, held);
    let slowest = slowest_close(&endings, TIMEOUT + HEAD_MARGIN);
    for ending in &endings {
        if let Some(response) = parse_raw(&ending.received) {
            crate::helpers::assert_raw_problem(&response, 408, "request-timeout");
        }
    }
    assert_normal_client_served(
        &format!("slow heads ({kind:?}): {SLOW} connections, all closed within {slowest:?}"),
        latencies,
    );
}

/// Slowloris on a kept-alive connection: after a first request served at once, the next
/// head arrives one line at a time; it gets the same deadline as a first head would.
async fn slow_heads_after_a_first_request_are_cut_off(kind: StoreKind) {
    const SLOW: usize = 20;
    let app = app_with_short_timeout(kind).await;
    let address = app.socket_address();
    let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\n";
    let endings = slowloris(address, SLOW, head).await;
    slowest_close(&endings, TIMEOUT + HEAD_MARGIN);
    for ending in &endings {
        let first = parse_raw(&ending.received).expect("the first request was answered");
        assert_eq!(first.status, 200);
        let text = String::from_utf8_lossy(&ending.received);
        assert!(
            text.contains("HTTP/1.1 408"),
            "no 408 for the slow head: {text}"
        );
    }
}

/// With `--max-connections 2`, two silent connections take every slot across all workers: a
/// third client waits in the listen backlog until the request timeout frees one, then is
/// served.
async fn connections_beyond_the_cap_wait_for_a_free_slot(kind: StoreKind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn_on(db, |s| {
        s.request_timeout = TIMEOUT;
        s.max_connections = Some(2);
        // The total cap alone: the per-peer cap (by default as large as a total this small)
        // is another test's.
        s.max_connections_per_peer = Some(0);
    })
    .await;
    let address = app.socket_address();
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(address).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let response = crate::helpers::raw_exchange(
        address,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    let waited = started.elapsed();
    assert_eq!(response.status, 200);
    assert!(
        waited >= TIMEOUT / 2,
        "served after {waited:?}, beside two connections holding the cap of 2"
    );
    assert!(
        waited <= TIMEOUT + HEAD_MARGIN,
        "served only after {waited:?}"
    );
    drop(silent);
}

/// A connection to `app` that has sent `bytes`.
async fn connected(app: &TestApp, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(app.socket_address()).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    stream
}

/// A head that stops halfway is answered `408` with its whole problem document before the
/// close: the body read up to the end of the connection is exactly as long as the
/// `Content-Length` the answer declares. It is counted among the server's answers.
async fn a_slow_head_gets_its_whole_408_before_the_close(kind: StoreKind) {
    let app = app_with_short_timeout(kind).await;
    let mut stream = connected(&app, b"POST /locks/job:1 HTTP/1.1\r\nHost: x\r\n").await;
    let mut received = Vec::new();
    let read = tokio::time::timeout(TIMEOUT + MARGIN, stream.read_to_end(&mut received)).await;
    assert!(
        matches!(read, Ok(Ok(_))),
        "the connection did not end cleanly: {read:?}; received {:?}",
        String::from_utf8_lossy(&received)
    );
    let end = received
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
    let declared: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .expect("a content-length")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        received.len() - (end + 4),
        declared,
        "the body sent before the close is not the declared length: {:?}",
        String::from_utf8_lossy(&received)
    );
    let response = parse_raw(&received).expect("a complete answer");
    crate::helpers::assert_raw_problem(&response, 408, "request-timeout");
    assert_eq!(response.header("connection"), Some("close"));
    // Counted as every answer is, under the method of its request line.
    let labels = [
        ("route", "unmatched"),
        ("method", "POST"),
        ("status", "408"),
    ];
    let metrics = app.metrics().await;
    assert_eq!(metrics.value("fencelock_http_requests_total", &labels), 1.0);
}

/// A client that falls silent after an answer that leaves its body unread (`413` at once
/// for a body declared too large, `408` at the request timeout for one that stopped
/// halfway) is closed soon after the answer, however long it stays silent. The linger after
/// such an answer is short, and counts from the HTTP layer's clock, read every 500 ms; a
/// linger due before it began once left such a connection open for ever. Several
/// connections, started 70 ms apart, meet that clock at different moments.
async fn silent_clients_are_closed_after_an_early_answer(kind: StoreKind) {
    let app = app_with_short_timeout(kind).await;
    let body = br#"{"owner":"a","ttl_seconds":5}"#;
    let too_large = [
        &b"POST /locks/job HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n"[..],
        body,
    ]
    .concat();
    let stopped = [
        &b"POST /locks/job HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 29\r\n\r\n"[..],
        &body[..9],
    ]
    .concat();
    let mut silent = tokio::task::JoinSet::new();
    for i in 0..8 {
        for (request, status, bound) in [
            (too_large.clone(), 413, MARGIN),
            (stopped.clone(), 408, TIMEOUT + MARGIN),
        ] {
            let mut stream = connected(&app, &request).await;
            silent.spawn(async move {
                let started = Instant::now();
                let mut received = Vec::new();
                let read = tokio::time::timeout(bound, stream.read_to_end(&mut received)).await;
                assert!(
                    matches!(read, Ok(Ok(_))),
                    "connection {i} ({status}) still open after {:?}: {:?}",
                    started.elapsed(),
                    String::from_utf8_lossy(&received)
                );
                let response = parse_raw(&received).expect("a complete answer");
                assert_eq!(response.status, status);
            });
        }
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
    while let Some(ended) = silent.join_next().await {
        ended.unwrap();
    }
}

/// With `--max-connections-per-peer 3`, a fourth connection from one address is closed at
/// once, while a client at another address (127.0.0.2: all of 127/8 is loopback) is served,
/// and so are the three; once they are gone the address gets connections again.
async fn one_peer_cannot_take_every_connection(kind: StoreKind) {
    const PER_PEER: u64 = 3;
    // Long enough that no held connection is closed by the head timer during the test.
    const HOLD: Duration = Duration::from_secs(30);
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn_on(db, |s| {
        s.request_timeout = HOLD;
        s.max_connections_per_peer = Some(PER_PEER);
    })
    .await;
    let address = app.socket_address();
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..PER_PEER {
        held.push(TcpStream::connect(address).await.unwrap());
    }
    // Served: each of them is counted before the extra one below connects.
    for stream in &mut held {
        stream.write_all(healthz).await.unwrap();
        assert_eq!(read_answer(stream).await.map(|r| r.status), Some(200));
    }

    let mut extra = TcpStream::connect(address).await.unwrap();
    let _ = extra.write_all(healthz).await;
    let mut buffer = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buffer)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the connection over the per-peer cap was not closed at once: {read:?} {:?}",
        String::from_utf8_lossy(&buffer).trim_end_matches('\0')
    );

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = socket.connect(address).await.unwrap();
    other.write_all(healthz).await.unwrap();
    assert_eq!(read_answer(&mut other).await.map(|r| r.status), Some(200));
    for stream in &mut held {
        stream.write_all(healthz).await.unwrap();
        assert_eq!(read_answer(stream).await.map(|r| r.status), Some(200));
    }

    drop(held);
    crate::helpers::eventually(
        "the address gets connections again",
        Duration::from_secs(10),
        async || {
            let mut stream = TcpStream::connect(address).await.unwrap();
            let _ = stream.write_all(healthz).await;
            read_answer(&mut stream)
                .await
                .is_some_and(|r| r.status == 200)
        },
    )
    .await;
}

/// The next answer on `stream`, or `None` if it is closed first (or after 10 s).
async fn read_answer(stream: &mut TcpStream) -> Option<crate::helpers::RawResponse> {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(response) = parse_raw(&received) {
                return Some(response);
            }
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// A keep-alive connection left idle after a request is closed after the request timeout.
async fn idle_connections_are_closed(kind: StoreKind) {
    let app = app_with_short_timeout(kind).await;
    let mut stream = connected(&app, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let started = Instant::now();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let closed = tokio::time::timeout(TIMEOUT + HEAD_MARGIN, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "an idle connection was still open after {:?}",
        started.elapsed()
    );
    let response = parse_raw(&received).expect("the request was answered");
    assert_eq!(response.status, 200);
    let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(body, json!({ "status": "ok" }));
}

contract!(
    slow_bodies_are_cut_off_at_the_request_timeout,
    slow_heads_are_cut_off_at_the_request_timeout,
    slow_heads_after_a_first_request_are_cut_off,
    idle_connections_are_closed,
    silent_clients_are_closed_after_an_early_answer,
    a_slow_head_gets_its_whole_408_before_the_close,
    one_peer_cannot_take_every_connection,
    connections_beyond_the_cap_wait_for_a_free_slot,
);
