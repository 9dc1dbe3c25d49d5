//! The test harness: everything comes from the shared test kit (`fencelock_testkit`): a real
//! fencelock server on port 0 in its own thread and actix system, over a fresh PostgreSQL
//! database or SQLite file that is dropped when the test ends, and the request helpers and
//! assertions the tests share. Test modules import it as `crate::helpers::...`.

pub use fencelock_testkit::*;
