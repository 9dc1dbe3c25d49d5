pub use fencelock_testkit::*;
