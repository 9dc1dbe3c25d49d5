//! Test support for fencelock and the services beside it. Used only by tests: nothing here
//! knows about the lease server's internals, so any test (of the lease server, of the demo
//! store, of a service using the guard) can use it against any TCP upstream.
//!
//! # Layout
//! - [`Proxy`]: a TCP proxy between a service and its upstream (PostgreSQL, a lease server)
//!   that can freeze (a network partition: bytes stop, nothing is reset), thaw and cut.
//! - [`closed_port`]: a local port nothing listens on, for "unreachable" tests.

mod proxy;

pub use proxy::Proxy;

/// A port on 127.0.0.1 that nothing listens on: connecting to it is refused at once.
///
/// The port is taken from the OS and released again, so another process could in principle
/// bind it in between; on a test machine that is rare enough not to matter.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("local address").port()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_port_refuses_connections() {
        let port = closed_port();
        let refused = std::net::TcpStream::connect(("127.0.0.1", port));
        assert!(refused.is_err(), "something listens on {port}");
    }
}
