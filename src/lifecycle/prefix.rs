//! Switches that put one old defect of the runtime layer back, for the loom models'
//! pre-fix variants (built only with `--cfg taskstage_loom`).
//!
//! A model proves something only if it can fail. Each new model of the driver comes
//! with a variant that runs the same model with one of these switched on, and that
//! variant must be caught. The switches change the crate's own code at the one place
//! where the defect lived, so the variant is the shipped path with the old mistake,
//! not a re-implementation of it. In a normal build this module does not exist.

use std::sync::atomic::{AtomicU32, Ordering};

/// One defect that the redesign of the runtime layer removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// A check that passed while a pause landed published Paused before its unit was
    /// back in its slot, so a resume in that gap found the slot empty.
    LateUnit = 1,
    /// Stopped (and Finished) were published before the units' `close()` returned.
    CloseAfterPublish = 2,
    /// An abort asked for before the run's abort handle was installed was forgotten.
    ForgetEarlyAbort = 4,
    /// A waiter polled again with a different waker kept the first one.
    StaleWaker = 8,
    /// A check that failed did not hand its unit back.
    LoseUnitOnFailedCheck = 16,
    /// The abort signal's listener filled its waker slot without loading the flag
    /// again, so a raise between its first load and the slot was never seen.
    AbortNoRecheck = 32,
    /// A raise of the signal took the listener's waker even when the listener did not
    /// wait for the raised bit, so a listener that then skipped the lock missed a
    /// later abort.
    WakeAnyListener = 64,
}

/// The defects switched on. A plain `std` atomic: it is set outside the model and is
/// not itself part of what loom explores.
static ON: AtomicU32 = AtomicU32::new(0);

/// Runs `f` with `defect` switched on, and switches it off again (also on a panic).
pub fn with<R>(defect: Defect, f: impl FnOnce() -> R) -> R {
    struct Off(Defect);
    impl Drop for Off {
        fn drop(&mut self) {
            ON.fetch_and(!(self.0 as u32), Ordering::SeqCst);
        }
    }
    ON.fetch_or(defect as u32, Ordering::SeqCst);
    let _off = Off(defect);
    f()
}

/// Whether `defect` is switched on.
pub(crate) fn on(defect: Defect) -> bool {
    ON.load(Ordering::SeqCst) & defect as u32 != 0
}
