//! fencelock-demo: a small protected service that uses the fencelock write guard, and the
//! paused-worker story that shows what the guard prevents.
//!
//! # Layers
//! Each module uses only the modules above it in this list, never one below
//! (`scripts/check-imports` checks it):
//!
//! 1. [`docs`]: documents and their write log, on PostgreSQL or SQLite, written through the
//!    guard in one transaction.
//! 2. [`lease_server`]: a lease server in this process, for the stories that are given none.
//! 3. [`wire`]: the shapes of the demo store's requests and answers, and the problem answers
//!    of each operation, for its OpenAPI document.
//! 4. [`story`]: the paused-worker scenario, played against the lease server and the demo
//!    store it is given (their URLs); its steps (`story::Scene`) also play on the page's
//!    desks (`story::Desk`).
//! 5. [`page`]: the same stories as a page in the browser, served by the demo store at `/`.
//! 6. [`app`]: the demo store's HTTP API (the page's routes mounted too) and its OpenAPI
//!    document, served at `/openapi.json`.
//! 7. [`chaos`]: lease servers under faults, workers, and a check of the history they made.
//!
//! The `fencelock-demo` binary (`main.rs`) composes them: it starts the services a command
//! is not given, then serves, plays the story, or runs the chaos.

pub mod app;
pub mod chaos;
pub mod docs;
pub mod lease_server;
pub mod page;
pub mod story;
pub mod wire;
