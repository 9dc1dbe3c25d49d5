//! The model's bounds, and the switches that turn it into one of its broken variants.

/// A point on the store's clock, in ticks.
pub type Time = u8;

/// How the guarded store treats a write's fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Guard {
    /// fencelock's guard: compare with the highest accepted fence and apply, in one atomic
    /// step (one transaction).
    Atomic,
    /// Broken: no guard at all, every write is applied.
    None,
    /// Broken: the fence is checked in one step and the write applied in a later one, so
    /// another write can be checked and applied in between.
    CheckThenApply,
}

/// Where fences come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fences {
    /// fencelock: one durable counter for the whole store.
    StoreWide,
    /// Broken: each lease row counts its own fences, and a release deletes the row, so the
    /// next acquisition starts again at 1.
    PerRowResetOnRelease,
    /// Broken: one counter, but in the server's memory: a restart starts it again at 0.
    InMemory,
}

/// The bounds of one check and the variant of the protocol it checks.
#[derive(Clone, Debug)]
pub struct Config {
    /// Workers competing for the one resource (2 or 3).
    pub workers: u8,
    /// The lease's TTL, in ticks of the store's clock.
    pub ttl: Time,
    /// The store's clock runs from 0 to this many ticks.
    pub max_time: Time,
    /// Acquire requests a worker makes at most: a new one (a new owner) after each `held`.
    pub attempts: u8,
    /// Whether the network may lose messages (it always delays, reorders and duplicates).
    pub lossy: bool,
    /// Whether the lease server may crash and restart (any number of times).
    pub server_crashes: bool,
    pub guard: Guard,
    pub fences: Fences,
    /// Broken when above 0: the server judges expiry by a clock this many ticks ahead of the
    /// store's (an instance's own clock instead of the store's).
    pub clock_ahead: Time,
}

impl Config {
    /// fencelock as it is, within the bounds `cargo test` checks.
    pub fn fencelock() -> Self {
        Config {
            workers: 2,
            ttl: 2,
            max_time: 3,
            attempts: 2,
            lossy: false,
            server_crashes: true,
            guard: Guard::Atomic,
            fences: Fences::StoreWide,
            clock_ahead: 0,
        }
    }

    /// The variant names the command line accepts, each with its configuration change.
    pub const VARIANTS: [&'static str; 6] = [
        "fencelock",
        "unguarded",
        "per-row-fences",
        "check-then-apply",
        "in-memory-counter",
        "clock-ahead",
    ];

    /// This configuration changed into a named variant.
    pub fn variant(mut self, name: &str) -> Option<Self> {
        match name {
            "fencelock" => {}
            "unguarded" => self.guard = Guard::None,
            "per-row-fences" => self.fences = Fences::PerRowResetOnRelease,
            "check-then-apply" => self.guard = Guard::CheckThenApply,
            "in-memory-counter" => self.fences = Fences::InMemory,
            "clock-ahead" => self.clock_ahead = 1,
            _ => return None,
        }
        Some(self)
    }
}
