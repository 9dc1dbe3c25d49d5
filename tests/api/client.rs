//! Worker client tests against the real server.
