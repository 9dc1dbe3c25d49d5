//! fencelock patch (see the workspace's `vendor/README.md`): a hook that renders the body of
//! the answers the HTTP/1 dispatcher writes by itself, without calling any service: `400` for
//! a request it cannot parse, `431` for a head that is too large, `408` for a head that does
//! not arrive in time, and the headers it adds. Unpatched, these go out with an empty body.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

use crate::{body::BoxBody, Extensions, Response};

/// A refusal as the renderer answers it.
pub struct Refusal {
    /// The dispatcher's status, or a more precise one for what the renderer sees (a `400`
    /// that a target too long for a URI caused is a `414`).
    pub status: StatusCode,
    /// The headers to add, its `Content-Type` among them.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

/// Renders the answer for `status`, given the start of what the client sent (which may hold
/// a request line, or not) and the connection's data (what the server's `on_connect` hook
/// put there, if it has one), where the renderer may find what it counts the refusal in.
pub type RefusalRenderer = fn(StatusCode, &[u8], Option<&Extensions>) -> Refusal;

static RENDERER: std::sync::OnceLock<RefusalRenderer> = std::sync::OnceLock::new();

/// Installs the renderer for the whole process; the first one installed stays.
pub fn set_refusal_renderer(render: RefusalRenderer) {
    let _ = RENDERER.set(render);
}

/// The body for a response the dispatcher makes itself; empty without a renderer.
pub(crate) fn body(
    res: &mut Response<()>,
    received: &[u8],
    conn_data: Option<&Extensions>,
) -> BoxBody {
    match RENDERER.get() {
        Some(_) => BoxBody::new(bytes(res, received, conn_data)),
        None => BoxBody::new(()),
    }
}

/// [`body`] as bytes, for an answer written in one go (the `408` of a slow head, which is
/// followed by a shutdown that writes nothing more); empty without a renderer.
pub(crate) fn bytes(
    res: &mut Response<()>,
    received: &[u8],
    conn_data: Option<&Extensions>,
) -> Bytes {
    let Some(render) = RENDERER.get() else {
        return Bytes::new();
    };
    let refusal = render(res.status(), received, conn_data);
    *res.status_mut() = refusal.status;
    for (name, value) in refusal.headers {
        res.headers_mut().insert(name, value);
    }
    refusal.body
}
