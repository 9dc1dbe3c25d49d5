//! Raw HTTP over TCP, for what no HTTP client would send (bad bytes, broken framing, slow
//! bodies): a request byte for byte, and its answer parsed by hand.

use std::time::Duration;

use serde_json::{Value, json};

/// An answer read off a raw TCP connection.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header names in lower case, in the order sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One request over a fresh TCP connection; the answer is read until its body is complete
/// or the server closes. Bounded in time: a server that does not answer fails the test.
pub async fn raw_exchange(address: std::net::SocketAddr, request: &[u8]) -> RawResponse {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connecting to the server");
        // The server may answer and close before it has read everything; that is fine.
        let _ = stream.write_all(request).await;
        let mut received = Vec::new();
        let mut buffer = [0u8; 8192];
        loop {
            if let Some(response) = parse_raw(&received) {
                return response;
            }
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
        parse_raw(&received).unwrap_or_else(|| {
            panic!(
                "no complete HTTP response; received {:?}",
                String::from_utf8_lossy(&received)
            )
        })
    };
    tokio::time::timeout(Duration::from_secs(15), exchange)
        .await
        .expect("the server answers a raw request within 15 s")
}

/// A complete response at the start of `bytes`, if there is one yet.
pub fn parse_raw(bytes: &[u8]) -> Option<RawResponse> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&bytes[..end]).expect("response head is text");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()?
        .split(' ')
        .nth(1)?
        .parse()
        .expect("status code");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().expect("content-length"));
    let body = bytes.get(end + 4..end + 4 + length)?.to_vec();
    Some(RawResponse {
        status,
        headers,
        body,
    })
}

/// Asserts a raw answer is an RFC 9457 problem with the given status and type; returns it.
pub fn assert_raw_problem(response: &RawResponse, status: u16, kind: &str) -> Value {
    let body: Value = serde_json::from_slice(&response.body).unwrap_or_else(|_| {
        panic!(
            "problem body is JSON: {response:?} ({})",
            String::from_utf8_lossy(&response.body)
        )
    });
    assert_eq!(response.status, status, "{body}");
    assert_eq!(
        response.header("content-type"),
        Some("application/problem+json"),
        "{body}"
    );
    assert_eq!(body["type"], json!(kind), "{body}");
    assert_eq!(body["status"], json!(status), "{body}");
    for member in ["title", "detail", "instance"] {
        assert!(body[member].is_string(), "{member} in {body}");
    }
    body
}
