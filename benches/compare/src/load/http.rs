//! fencelock's side of the load: one HTTP/1.1 keep-alive connection per client (hyper's
//! client connection, no pool in between, so N clients are exactly N connections).

use std::net::Ipv4Addr;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpSocket;
use tokio::task::JoinHandle;

use super::LockClient;

/// Every lease the load takes; it is released at once, the TTL only matters if a client
/// dies.
const TTL_SECONDS: u32 = 30;

/// One keep-alive connection to the lease server.
pub struct HttpClient {
    sender: SendRequest<Full<Bytes>>,
    host: HeaderValue,
    driver: JoinHandle<()>,
}

impl HttpClient {
    pub async fn connect(port: u16) -> anyhow::Result<Self> {
        Self::connect_from(port, Ipv4Addr::LOCALHOST).await
    }

    /// From the loopback address `source` (any of 127.0.0.0/8): a client of its own to the
    /// server's per-peer connection cap.
    pub async fn connect_from(port: u16, source: Ipv4Addr) -> anyhow::Result<Self> {
        let socket = TcpSocket::new_v4()?;
        socket.bind((source, 0).into())?;
        let stream = socket.connect((Ipv4Addr::LOCALHOST, port).into()).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self {
            sender,
            host: HeaderValue::from_str(&format!("127.0.0.1:{port}"))?,
            driver,
        })
    }

    /// Sends one request and reads the whole answer.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        json: Option<String>,
    ) -> anyhow::Result<(StatusCode, Bytes)> {
        let builder = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, self.host.clone());
        let request = match json {
            Some(json) => builder
                .header(header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(json)))?,
            None => builder.body(Full::new(Bytes::new()))?,
        };
        self.sender.ready().await.context("connection closed")?;
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

impl Drop for HttpClient {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

#[derive(serde::Deserialize)]
struct AcquireAnswer {
    acquired: bool,
}

fn unexpected(what: &str, status: StatusCode, body: &[u8]) -> anyhow::Error {
    let body = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    anyhow::anyhow!("{what}: unexpected {status}: {body}")
}

impl LockClient for HttpClient {
    async fn acquire(&mut self, resource: u32, owner: u64) -> anyhow::Result<bool> {
        let (status, body) = self
            .send(
                Method::POST,
                &format!("/locks/res:{resource}"),
                Some(format!(
                    r#"{{"owner":"o{owner:016x}","ttl_seconds":{TTL_SECONDS}}}"#
                )),
            )
            .await?;
        if status != StatusCode::OK {
            return Err(unexpected("acquire", status, &body));
        }
        let answer: AcquireAnswer =
            serde_json::from_slice(&body).context("acquire: answer without `acquired`")?;
        Ok(answer.acquired)
    }

    async fn release(&mut self, resource: u32, owner: u64, held: bool) -> anyhow::Result<()> {
        let (status, body) = self
            .send(
                Method::DELETE,
                &format!("/locks/res:{resource}"),
                Some(format!(r#"{{"owner":"o{owner:016x}"}}"#)),
            )
            .await?;
        // A lost acquisition's release is refused: another owner holds the lease (403), or
        // has let it go already (404).
        let expected = if held {
            status == StatusCode::NO_CONTENT
        } else {
            status == StatusCode::FORBIDDEN || status == StatusCode::NOT_FOUND
        };
        if !expected {
            return Err(unexpected("release", status, &body));
        }
        Ok(())
    }
}

/// The status of `GET path` on a fresh connection; an error if nothing answers.
pub async fn get_status(port: u16, path: &str) -> anyhow::Result<StatusCode> {
    let mut client = HttpClient::connect(port).await?;
    Ok(client.send(Method::GET, path, None).await?.0)
}

/// Opens `count` keep-alive connections that have each been answered once (`GET
/// /healthz`) and then sit idle, as many quiet clients would; they close when dropped.
pub async fn idle_connections(port: u16, count: usize) -> anyhow::Result<Vec<HttpClient>> {
    let mut open = Vec::with_capacity(count);
    // In batches: a thousand simultaneous connects would overflow the listen backlog.
    for batch in (0..count).collect::<Vec<_>>().chunks(100) {
        let mut set = tokio::task::JoinSet::new();
        for _ in batch {
            set.spawn(async move {
                let mut client = HttpClient::connect(port).await?;
                let (status, _) = client.send(Method::GET, "/healthz", None).await?;
                ensure!(status == StatusCode::OK, "GET /healthz answered {status}");
                anyhow::Ok(client)
            });
        }
        while let Some(client) = set.join_next().await {
            open.push(client??);
        }
    }
    if open.len() != count {
        bail!("opened {} of {count} idle connections", open.len());
    }
    Ok(open)
}
