//! Progress of a run, for progress bars and status lines.
//!
//! The `*_with` entry points of the apps ([`crate::water::run_parallel_with`],
//! [`crate::em3d::run_parallel_with`] and the sequential ones) report their phases to a
//! [`Progress`]. In parallel runs only thread 0 reports (on the DSM runtime that thread
//! is in cluster 0, so only cluster 0's observer hears anything); reporting costs one
//! virtual call per phase and per step.

/// Receives the phases of a run and the steps done in each.
///
/// A phase ends when the next one begins or the run returns. Implementations must be
/// cheap and must not block: they are called from a compute thread between two
/// synchronisation points.
pub trait Progress: Sync {
    /// A phase named `phase` begins; it has `steps` steps (0: no steps to count).
    fn begin(&self, phase: &'static str, steps: u64);

    /// `done` steps of the current phase are complete (`done <= steps`).
    fn advance(&self, done: u64);
}

/// A [`Progress`] that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Progress for Silent {
    fn begin(&self, _phase: &'static str, _steps: u64) {}

    fn advance(&self, _done: u64) {}
}

#[cfg(test)]
pub(crate) mod testing {
    use super::Progress;
    use std::sync::Mutex;

    /// Records every call, for tests.
    #[derive(Default)]
    pub(crate) struct Recorder(pub(crate) Mutex<Vec<(String, u64)>>);

    impl Progress for Recorder {
        fn begin(&self, phase: &'static str, steps: u64) {
            self.0
                .lock()
                .unwrap()
                .push((format!("begin {phase}"), steps));
        }

        fn advance(&self, done: u64) {
            self.0.lock().unwrap().push(("advance".to_owned(), done));
        }
    }
}
