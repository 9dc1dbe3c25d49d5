//! fencelock-demo: a small protected service that uses the fencelock write guard, and the
//! paused-worker story that shows what the guard prevents.
//!
//! # Layout
//! - [`docs`]: documents and their write log, on PostgreSQL or SQLite, written through the
//!   guard in one transaction.
//! - [`app`]: the demo store's HTTP API.
//! - [`openapi`]: its OpenAPI document, served at `/openapi.json`.
//! - [`story`]: the paused-worker scenario, against in-process or running services.
//! - [`page`]: the same stories as a page in the browser, served by the demo store at `/`.
//! - [`chaos`]: lease servers under faults, workers, and a check of the history they made.

pub mod app;
pub mod chaos;
pub mod docs;
pub mod openapi;
pub mod page;
pub mod story;
