//! A map by resource name behind a std mutex, as the registry and the lines keep theirs.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Held for a map operation only, never across an `.await`; a poisoned lock is taken as it
/// is.
pub(super) struct ByResource<T>(Mutex<HashMap<String, T>>);

impl<T> Default for ByResource<T> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<T> ByResource<T> {
    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<String, T>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
