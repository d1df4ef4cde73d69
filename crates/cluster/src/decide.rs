//! The worker's decisions, as a pure function.
//!
//! [`decide`] is the only place a worker decides what to do about a task: given
//! what it read from the store (desired stage, ownership, the status it last
//! published), what it holds locally (the task's stage), its lease deadline and the
//! outcome of its last fenced write, it returns at most one [`Action`]. [`gather`]
//! is the only place those inputs are worked out: from what the worker [`Known`]s
//! of the task (its cache of the task's keys, the slot it holds, the keys the store
//! refused it, what it sent), it reads whose the key is, whether the task is
//! settled, what this worker published under its token and whether a hand-over is
//! committed. Neither performs I/O, reads a clock or takes a lock; the worker
//! (`worker/reconcile/`) fills a [`Known`], calls both and carries the action out,
//! and the stateright model (`crates/cluster/tests/cluster_model.rs`) runs the very same two
//! functions against an abstract etcd, so the model checks the gathering and the
//! decision the worker ships.
//!
//! The loop is level-triggered, like kube-runtime's `reconcile`: every decision is
//! taken from the current state, never from the event that woke the loop, so a lost
//! notification only delays convergence (a periodic resync is the safety net).
//!
//! # Invariants (cited by number in the code)
//!
//! 1. **No run without a valid lease and the key.** A command that starts a run
//!    (Resume) or builds a task is returned only while `now < stop_at`, the owner key
//!    is this worker's and no fenced write was rejected.
//! 2. **Self-fencing.** Once any of those fails, every local task that is not
//!    terminal gets [`Action::Fence`] (stop, escalating to abort) and nothing else;
//!    a terminal one is dropped. Nothing is published then.
//! 3. **Publish only the truth.** A report is the local stage as read for this
//!    decision, and it is published only in a step that issues no command, so it
//!    never names a stage that a command of the same step is about to change.
//! 4. **One attempt per desired revision.** A run that failed for a desired revision
//!    is not restarted for the same revision: its failure is published instead.
//! 5. **No stuck owner.** A local task that a fence stopped while the key stayed
//!    this worker's is dropped and built again, not kept Stopped under a desired
//!    stage that asks for more (the stateright model found this one).
//! 6. **A hand-over is a pause, then a release.** A task handed over to another
//!    worker (fair shares) is paused locally until its run has really returned;
//!    only then is the owner key released, in one fenced write with the report of
//!    that rest ([`Action::Hand`]), so the store never shows the key gone beside a
//!    report of a live run, nor a rest report beside a key still held. The Pausing
//!    of a hand-over is not published: it would only lag the truth, and each write
//!    on the way lengthens the time the task runs nowhere. A task whose run failed
//!    is not handed over (its failure is the answer, invariant 4). Once its rest is
//!    published for the current desired revision, the hand-over is carried through
//!    even if it is given up: resuming under that report would leave a rest report
//!    standing while a run is alive; and once a release was sent, the worker hands
//!    the task over whatever happens (a release whose answer was lost may still
//!    land, and another worker start the task). The stateright model found both.
//! 7. **A drain hands everything over.** A draining worker claims nothing, and hands
//!    every task it holds over by the same pause, then release, as invariant 6,
//!    a task whose run failed included (a drain is a shutdown that stays alive: the
//!    new owner runs it for the desired stage, as after a shutdown). A task desired
//!    Stopped is not handed over: it stops where it is and its key is released.

use taskstage::Stage;

use super::keys::DesiredStage;

/// Whether the owner key of a task is this worker's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ownership {
    /// No owner key: the task can be claimed.
    Unowned,
    /// The owner key holds this worker's value under its current lease.
    Mine,
    /// The owner key holds another worker's value (or an older lease of this one).
    Other,
}

/// The worker's local task, as read for a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Local {
    /// The local handle's stage.
    pub stage: Stage,
    /// Whether the last run (or pre-start check) failed.
    pub failed: bool,
    /// The local generation.
    pub generation: u64,
}

/// An observed status, as the owner publishes it (and as it reads it back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Report {
    /// The local stage.
    pub stage: Stage,
    /// Whether the last run failed.
    pub failed: bool,
    /// The local generation.
    pub generation: u64,
    /// The desired revision this report answers.
    pub desired_revision: i64,
}

/// Everything a decision about one task depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskView {
    /// The desired stage and its revision; `None` when the task has no readable
    /// desired stage (or the store could not be read this time).
    pub desired: Option<(DesiredStage, i64)>,
    /// Whose the owner key is.
    pub ownership: Ownership,
    /// Whether the stored observed status is terminal and answers the current
    /// desired revision: nothing is left to do, so the task is not claimed.
    pub settled: bool,
    /// The local task, if this worker holds one.
    pub local: Option<Local>,
    /// The desired revision this worker last issued a resume or pause for.
    pub acted: Option<i64>,
    /// The observed status this worker's current token last published, read back
    /// from the store (so a lost or overwritten report is published again).
    pub published: Option<Report>,
    /// Now, on the worker's monotonic clock (milliseconds).
    pub now: u64,
    /// When the worker must begin stopping its runs (see [`stop_at`]); `None` once
    /// the store said the lease is gone.
    pub stop_at: Option<u64>,
    /// Whether a fenced write with this task's token was rejected.
    pub fence_rejected: bool,
    /// Whether a stop (or fence) of the local task is already under way.
    pub stopping: bool,
    /// Whether the worker has room for one more task.
    pub capacity_left: bool,
    /// Whether the worker hands this task over to another (it holds more than its
    /// fair share, or a release of its key was already sent): pause, publish,
    /// release (invariant 6).
    pub hand_over: bool,
    /// Whether the local task was paused for a hand-over since its last resume: if
    /// the hand-over is given up, it is resumed again for the same revision.
    pub yielded: bool,
    /// Whether the worker is draining (invariant 7): every task it holds is handed
    /// over, one whose run failed included, and nothing is claimed.
    pub draining: bool,
}

/// What the worker does about a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Create the owner key under the worker's lease, only if absent.
    Claim,
    /// Build the task from its spec through the factory, in stage New.
    Build,
    /// Resume the local task, for this desired revision.
    Resume {
        /// The desired revision acted upon.
        revision: i64,
    },
    /// Pause the local task, for this desired revision.
    Pause {
        /// The desired revision acted upon.
        revision: i64,
    },
    /// Pause the local task to hand it over (the desired stage is still Running).
    Yield,
    /// Stop the local task (desired Stopped).
    Stop,
    /// Stop the local task, escalating to abort, because the worker may no longer
    /// run it (invariant 2).
    Fence,
    /// Forget the local task (it is terminal, and the worker may not or need not
    /// keep it).
    Drop,
    /// Publish this report through a fenced write.
    Publish(Report),
    /// Delete the owner key through a fenced write: the task is terminal and its
    /// terminal status is published, or it is handed over and its rest is.
    Release,
    /// Hand the task over: publish this report of its rest and delete the owner
    /// key, in one fenced write (invariant 6).
    Hand(Report),
}

/// When an owner must begin stopping its runs, given when its last answered
/// keep-alive was *sent*.
///
/// `sent + ttl·(1−ρ) − stop_bound`, with ρ in parts per thousand. The store expires
/// the lease no earlier than `ttl` after it *received* that keep-alive, which is
/// after it was sent; ρ covers the two clocks' drift over one TTL; a stop takes at
/// most `stop_bound` (the grace period, then abort). So a run that starts stopping
/// at this instant is gone before the lease can expire and before anyone else can
/// take the owner key.
pub fn stop_at(sent: u64, ttl: u64, rho_permille: u64, stop_bound: u64) -> u64 {
    trusted_until(sent, ttl, rho_permille).saturating_sub(stop_bound)
}

/// The last instant at which a run of the owner may still be alive, given when its
/// last answered keep-alive was *sent*: `sent + ttl·(1−ρ) − margin`.
///
/// [`stop_at`] leaves a whole stop bound before the earliest instant the store may
/// expire the lease; this one leaves only `margin`. A run that is not confirmed gone
/// by then is past what the safety argument allows, and the worker applies its
/// overrun policy (by default it ends the process, which the kernel enforces).
/// `margin < stop_bound` (checked at join), so this comes after `stop_at`.
pub fn exit_at(sent: u64, ttl: u64, rho_permille: u64, margin: u64) -> u64 {
    trusted_until(sent, ttl, rho_permille).saturating_sub(margin)
}

/// `sent + ttl·(1−ρ)`: the earliest instant, on this machine's clock, at which the
/// store may expire a lease whose keep-alive was sent at `sent`.
fn trusted_until(sent: u64, ttl: u64, rho_permille: u64) -> u64 {
    let usable = ttl.saturating_mul(1000 - rho_permille.min(1000)) / 1000;
    sent.saturating_add(usable)
}

/// Whether the lease still allows local runs at `now`: its `stop_at` is known and not
/// reached (invariants 1 and 2).
pub fn lease_allows(now: u64, stop_at: Option<u64>) -> bool {
    stop_at.is_some_and(|deadline| now < deadline)
}

/// Whether a local task in `stage` is fenced once the lease no longer allows runs:
/// every task that is not terminal, New and Paused included, so that a resume decided
/// just before the deadline finds its task stopping rather than starts a run.
pub fn must_fence(stage: Stage) -> bool {
    !stage.is_terminal()
}

/// The owner key of a task, as the worker's cache holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerKey {
    /// The key's create revision: the fence token of whoever holds it.
    pub create_revision: i64,
    /// Whether the key's value is this worker's under its current lease.
    pub ours: bool,
}

/// The observed key of a task, as the worker's cache holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObservedKey {
    /// Whether this worker published it.
    pub ours: bool,
    /// The token (owner key's create revision) it was published under.
    pub owner_revision: i64,
    /// What it reports.
    pub report: Report,
}

/// A local task the worker holds, with what the worker has done to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holding {
    /// The task as read for this decision.
    pub local: Local,
    /// The desired revision the worker last issued a resume or pause for.
    pub acted: Option<i64>,
    /// Whether a fenced write under the task's token was rejected.
    pub fence_rejected: bool,
    /// Whether a stop (or fence) of it is under way.
    pub stopping: bool,
    /// Whether it was paused for a hand-over since its last resume.
    pub yielded: bool,
}

/// What the worker has sent about a task under one token: writes that may land
/// late, whatever their answer said (invariant 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sent {
    /// The token (owner key's create revision) they were sent under.
    pub token: i64,
    /// The desired revision of the last rest report (New, Paused) sent.
    pub rest: Option<i64>,
    /// Whether a release of the key was sent.
    pub releasing: bool,
}

/// Everything a worker knows of one task when it decides about it: its cache of
/// the task's keys (never a fresh read of the store) and its own records.
/// [`gather`] reads the [`TaskView`] that [`decide`] takes out of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Known {
    /// The desired stage and the revision of its last change, if readable.
    pub desired: Option<(DesiredStage, i64)>,
    /// The owner key, if present.
    pub owner: Option<OwnerKey>,
    /// The observed key, if present and readable.
    pub observed: Option<ObservedKey>,
    /// The token the worker holds the task under, if it holds a slot for it.
    pub slot_token: Option<i64>,
    /// An owner key (by create revision) the store refused as this worker's: it
    /// is not the worker's, whatever the cache says of its value.
    pub refused: Option<i64>,
    /// The local task, if the worker holds one.
    pub holding: Option<Holding>,
    /// What the worker sent about the task, if anything.
    pub sent: Option<Sent>,
    /// Whether the worker has picked the task to hand over (fair shares).
    pub picked_to_hand_over: bool,
    /// Now, on the worker's monotonic clock (milliseconds).
    pub now: u64,
    /// When the worker must begin stopping its runs.
    pub stop_at: Option<u64>,
    /// Whether the worker has room for one more task.
    pub capacity_left: bool,
    /// Whether the worker is draining.
    pub draining: bool,
}

/// A [`TaskView`] and the token the worker would act under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gathered {
    /// The inputs of [`decide`].
    pub view: TaskView,
    /// The token of the worker's slot, or of a key the cache shows as the
    /// worker's: what `published` and `sent` are matched against.
    pub token: Option<i64>,
    /// Whether [`Known::sent`] was sent under another token than `token`: it is
    /// settled, and the worker may forget it.
    pub sent_is_stale: bool,
}

/// Whether a stored report is terminal and answers the current desired revision:
/// nothing is left to do about the task.
pub fn settled(observed: Option<Report>, desired: Option<(DesiredStage, i64)>) -> bool {
    match (observed, desired) {
        (Some(report), Some((stage, revision))) => {
            report.stage.is_terminal()
                && report.desired_revision == revision
                && stage.answered_by(report.stage, report.failed)
        }
        _ => false,
    }
}

/// Reads the inputs of [`decide`] out of what the worker knows of a task. Pure,
/// like `decide`: the worker calls it at every step, and the stateright model
/// (`crates/cluster/tests/cluster_model.rs`) calls it on its abstract worker, so that the model
/// checks the gathering the worker ships.
pub fn gather(known: &Known) -> Gathered {
    let ownership = match known.owner {
        None => Ownership::Unowned,
        // The store said this key is not ours: the cache lags behind it.
        Some(key) if known.refused == Some(key.create_revision) => Ownership::Other,
        Some(key) if key.ours => match known.slot_token {
            // Ours by value, but not the key the slot was built under.
            Some(token) if token != key.create_revision => Ownership::Other,
            _ => Ownership::Mine,
        },
        Some(_) => Ownership::Other,
    };
    let token = match (known.slot_token, known.owner) {
        (Some(token), _) => Some(token),
        (None, Some(key)) if ownership == Ownership::Mine => Some(key.create_revision),
        _ => None,
    };
    let published = known
        .observed
        .filter(|o| o.ours && Some(o.owner_revision) == token)
        .map(|o| o.report);
    let sent = known.sent.filter(|s| Some(s.token) == token);
    let holding = known.holding;
    // A hand-over is carried through once its release was sent, or once a rest
    // report for this revision was (invariant 6): either may land late, after a
    // resume.
    let committed = holding.is_some()
        && sent.is_some_and(|s| {
            s.releasing
                || (s.rest.is_some()
                    && known.desired.is_some_and(|(stage, revision)| {
                        stage == DesiredStage::Running && s.rest == Some(revision)
                    }))
        });
    Gathered {
        view: TaskView {
            desired: known.desired,
            ownership,
            settled: settled(known.observed.map(|o| o.report), known.desired),
            local: holding.map(|h| h.local),
            acted: holding.and_then(|h| h.acted),
            published,
            now: known.now,
            stop_at: known.stop_at,
            fence_rejected: holding.is_some_and(|h| h.fence_rejected),
            stopping: holding.is_some_and(|h| h.stopping),
            capacity_left: known.capacity_left,
            hand_over: known.picked_to_hand_over || committed,
            yielded: holding.is_some_and(|h| h.yielded),
            draining: known.draining,
        },
        token,
        sent_is_stale: known.sent.is_some() && sent.is_none(),
    }
}

/// Decides what to do about one task. Pure: see the module docs.
pub fn decide(view: &TaskView) -> Option<Action> {
    let lease_ok = lease_allows(view.now, view.stop_at);
    let may_run = lease_ok && !view.fence_rejected && view.ownership == Ownership::Mine;

    let Some(local) = view.local else {
        // Invariant 1: build or claim only with a valid lease.
        if !lease_ok || view.fence_rejected || view.desired.is_none() {
            return None;
        }
        return match view.ownership {
            Ownership::Mine => Some(Action::Build),
            // Invariant 7: a draining worker claims nothing.
            Ownership::Unowned if view.capacity_left && !view.settled && !view.draining => {
                Some(Action::Claim)
            }
            _ => None,
        };
    };

    if !may_run {
        // Invariant 2.
        return if !must_fence(local.stage) {
            Some(Action::Drop)
        } else if view.stopping {
            None
        } else {
            Some(Action::Fence)
        };
    }

    let (desired, revision) = view.desired?;
    // Invariant 6: a task to be stopped, or whose run failed, is not handed over;
    // one whose rest for this revision is published is handed over whatever else.
    let rest_published = view
        .published
        .is_some_and(|p| p.stage.is_at_rest() && p.desired_revision == revision);
    let committed = view.yielded && rest_published && desired == DesiredStage::Running;
    // Invariant 7: a drain hands over every task, a failed one included.
    let handing_over = (view.hand_over || view.draining || committed)
        && desired != DesiredStage::Stopped
        && (!local.failed || view.draining);
    if local.stage == Stage::Stopped && desired != DesiredStage::Stopped {
        // Stopped by a fence, and the lease came back: a stopped task cannot run
        // again, so forget it; the next step builds it anew (invariant 5).
        return Some(Action::Drop);
    }
    let command = match desired {
        DesiredStage::Running if handing_over => match local.stage {
            Stage::Running | Stage::Resuming => Some(Action::Yield),
            _ => None,
        },
        DesiredStage::Running => match local.stage {
            Stage::New => Some(Action::Resume { revision }),
            // Invariant 4: a failure for this revision is reported, not retried; a
            // pause for a hand-over given up is resumed.
            Stage::Paused if view.acted != Some(revision) || (view.yielded && !local.failed) => {
                Some(Action::Resume { revision })
            }
            _ => None,
        },
        DesiredStage::Paused => match local.stage {
            Stage::Running | Stage::Resuming => Some(Action::Pause { revision }),
            _ => None,
        },
        DesiredStage::Stopped => {
            let winding_down = local.stage == Stage::Stopping || view.stopping;
            (!local.stage.is_terminal() && !winding_down).then_some(Action::Stop)
        }
    };
    if command.is_some() {
        return command; // invariant 3: no publish in a step that commands
    }
    let report = Report {
        stage: local.stage,
        failed: local.failed,
        generation: local.generation,
        desired_revision: revision,
    };
    // Invariant 6: released only once no run is alive, with the report of that.
    let at_rest = matches!(local.stage, Stage::New | Stage::Paused);
    if view.published != Some(report) {
        return match local.stage {
            _ if handing_over && at_rest => Some(Action::Hand(report)),
            // A hand-over's Pausing only lags the truth: not published.
            Stage::Pausing if handing_over => None,
            _ => Some(Action::Publish(report)),
        };
    }
    if local.stage.is_terminal() && desired.answered_by(local.stage, local.failed) {
        return Some(Action::Release);
    }
    if handing_over && at_rest {
        return Some(Action::Release);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> TaskView {
        TaskView {
            desired: Some((DesiredStage::Running, 10)),
            ownership: Ownership::Mine,
            settled: false,
            local: Some(Local {
                stage: Stage::Running,
                failed: false,
                generation: 1,
            }),
            acted: Some(10),
            published: None,
            now: 100,
            stop_at: Some(1_000),
            fence_rejected: false,
            stopping: false,
            capacity_left: true,
            hand_over: false,
            yielded: false,
            draining: false,
        }
    }

    fn local(stage: Stage) -> Option<Local> {
        Some(Local {
            stage,
            failed: false,
            generation: 1,
        })
    }

    /// A worker holding the task under token 7, its key in the cache, its own
    /// report of Running for desired revision 10 published under that token.
    fn known() -> Known {
        let report = Report {
            stage: Stage::Running,
            failed: false,
            generation: 1,
            desired_revision: 10,
        };
        Known {
            desired: Some((DesiredStage::Running, 10)),
            owner: Some(OwnerKey {
                create_revision: 7,
                ours: true,
            }),
            observed: Some(ObservedKey {
                ours: true,
                owner_revision: 7,
                report,
            }),
            slot_token: Some(7),
            refused: None,
            holding: Some(Holding {
                local: local(Stage::Running).expect("a local task"),
                acted: Some(10),
                fence_rejected: false,
                stopping: false,
                yielded: false,
            }),
            sent: None,
            picked_to_hand_over: false,
            now: 100,
            stop_at: Some(1_000),
            capacity_left: true,
            draining: false,
        }
    }

    #[test]
    fn gather_reads_a_key_as_ours_only_under_our_token_and_unrefused() {
        let g = gather(&known());
        assert_eq!(g.view.ownership, Ownership::Mine);
        assert_eq!(g.token, Some(7));
        let mut other_slot = known();
        other_slot.slot_token = Some(5);
        assert_eq!(gather(&other_slot).view.ownership, Ownership::Other);
        let mut refused = known();
        refused.refused = Some(7);
        assert_eq!(gather(&refused).view.ownership, Ownership::Other);
        let mut theirs = known();
        theirs.owner = Some(OwnerKey {
            create_revision: 7,
            ours: false,
        });
        assert_eq!(gather(&theirs).view.ownership, Ownership::Other);
        let mut gone = known();
        gone.owner = None;
        gone.slot_token = None;
        assert_eq!(gather(&gone).view.ownership, Ownership::Unowned);
        assert_eq!(gather(&gone).token, None);
    }

    #[test]
    fn gather_takes_as_published_only_a_report_under_the_current_token() {
        assert!(gather(&known()).view.published.is_some());
        let mut older = known();
        older.slot_token = Some(9);
        older.owner = Some(OwnerKey {
            create_revision: 9,
            ours: true,
        });
        assert_eq!(gather(&older).view.published, None);
        let mut anothers = known();
        if let Some(o) = anothers.observed.as_mut() {
            o.ours = false;
        }
        assert_eq!(gather(&anothers).view.published, None);
    }

    #[test]
    fn gather_commits_a_hand_over_by_what_was_sent_under_the_current_token() {
        assert!(!gather(&known()).view.hand_over);
        let mut released = known();
        released.sent = Some(Sent {
            token: 7,
            rest: None,
            releasing: true,
        });
        assert!(gather(&released).view.hand_over);
        let mut rest = known();
        rest.sent = Some(Sent {
            token: 7,
            rest: Some(10),
            releasing: false,
        });
        assert!(gather(&rest).view.hand_over);
        // A rest for an older revision commits nothing.
        rest.sent = Some(Sent {
            token: 7,
            rest: Some(8),
            releasing: false,
        });
        assert!(!gather(&rest).view.hand_over);
        // Sent under an earlier token: settled, and stale.
        let mut stale = released;
        stale.sent = Some(Sent {
            token: 3,
            rest: None,
            releasing: true,
        });
        let g = gather(&stale);
        assert!(!g.view.hand_over);
        assert!(g.sent_is_stale);
        assert!(!gather(&released).sent_is_stale);
    }

    #[test]
    fn gather_finds_a_task_settled_by_a_terminal_report_for_the_current_revision() {
        let mut k = known();
        k.desired = Some((DesiredStage::Stopped, 10));
        assert!(!gather(&k).view.settled);
        if let Some(o) = k.observed.as_mut() {
            o.report.stage = Stage::Stopped;
        }
        assert!(gather(&k).view.settled);
        k.desired = Some((DesiredStage::Stopped, 11));
        assert!(!gather(&k).view.settled);
    }

    #[test]
    fn stop_at_leaves_the_drift_and_the_stop_bound() {
        assert_eq!(stop_at(1_000, 2_000, 100, 500), 1_000 + 1_800 - 500);
        assert_eq!(stop_at(0, 2_000, 0, 5_000), 0);
    }

    #[test]
    fn exit_at_leaves_the_drift_and_only_the_margin() {
        assert_eq!(exit_at(1_000, 2_000, 100, 150), 1_000 + 1_800 - 150);
        assert!(exit_at(1_000, 2_000, 100, 150) > stop_at(1_000, 2_000, 100, 500));
        assert_eq!(exit_at(0, 2_000, 0, 5_000), 0);
    }

    #[test]
    fn unowned_tasks_are_claimed_only_with_a_valid_lease_and_room() {
        let mut v = view();
        v.local = None;
        v.ownership = Ownership::Unowned;
        assert_eq!(decide(&v), Some(Action::Claim));
        v.capacity_left = false;
        assert_eq!(decide(&v), None);
        v.capacity_left = true;
        v.now = 1_000;
        assert_eq!(decide(&v), None, "claimed at the lease deadline");
        v.now = 100;
        v.settled = true;
        assert_eq!(decide(&v), None, "claimed a settled task");
        v.settled = false;
        v.ownership = Ownership::Other;
        assert_eq!(decide(&v), None);
        v.ownership = Ownership::Mine;
        assert_eq!(decide(&v), Some(Action::Build));
        v.desired = None;
        assert_eq!(decide(&v), None);
    }

    #[test]
    fn past_the_deadline_every_live_task_is_fenced_and_nothing_published() {
        for stage in Stage::ALL {
            for (now, stop_at, rejected, ownership) in [
                (1_000, Some(1_000), false, Ownership::Mine),
                (100, None, false, Ownership::Mine),
                (100, Some(1_000), true, Ownership::Mine),
                (100, Some(1_000), false, Ownership::Other),
                (100, Some(1_000), false, Ownership::Unowned),
            ] {
                let mut v = view();
                v.local = local(stage);
                v.now = now;
                v.stop_at = stop_at;
                v.fence_rejected = rejected;
                v.ownership = ownership;
                let expected = if stage.is_terminal() {
                    Some(Action::Drop)
                } else {
                    Some(Action::Fence)
                };
                assert_eq!(decide(&v), expected, "{stage} {v:?}");
                v.stopping = true;
                if !stage.is_terminal() {
                    assert_eq!(decide(&v), None, "fenced twice in {stage}");
                }
            }
        }
    }

    #[test]
    fn desired_running_resumes_once_per_revision() {
        let mut v = view();
        v.local = local(Stage::New);
        v.acted = None;
        assert_eq!(decide(&v), Some(Action::Resume { revision: 10 }));
        v.local = Some(Local {
            stage: Stage::Paused,
            failed: true,
            generation: 1,
        });
        v.acted = Some(10);
        let report = Report {
            stage: Stage::Paused,
            failed: true,
            generation: 1,
            desired_revision: 10,
        };
        assert_eq!(decide(&v), Some(Action::Publish(report)));
        v.acted = Some(9);
        assert_eq!(decide(&v), Some(Action::Resume { revision: 10 }));
    }

    #[test]
    fn desired_paused_pauses_live_runs_then_publishes() {
        let mut v = view();
        v.desired = Some((DesiredStage::Paused, 11));
        for stage in [Stage::Running, Stage::Resuming] {
            v.local = local(stage);
            assert_eq!(decide(&v), Some(Action::Pause { revision: 11 }));
        }
        v.local = local(Stage::Pausing);
        assert!(matches!(decide(&v), Some(Action::Publish(r)) if r.stage == Stage::Pausing));
        v.local = local(Stage::Paused);
        let report = Report {
            stage: Stage::Paused,
            failed: false,
            generation: 1,
            desired_revision: 11,
        };
        assert_eq!(decide(&v), Some(Action::Publish(report)));
        v.published = Some(report);
        assert_eq!(decide(&v), None);
    }

    #[test]
    fn a_task_stopped_by_a_fence_is_rebuilt_once_the_lease_is_back() {
        let mut v = view();
        v.local = local(Stage::Stopped);
        assert_eq!(decide(&v), Some(Action::Drop));
        v.local = None;
        assert_eq!(decide(&v), Some(Action::Build));
    }

    #[test]
    fn desired_stopped_stops_publishes_then_releases() {
        let mut v = view();
        v.desired = Some((DesiredStage::Stopped, 12));
        assert_eq!(decide(&v), Some(Action::Stop));
        v.stopping = true;
        assert!(matches!(decide(&v), Some(Action::Publish(_))));
        v.local = local(Stage::Stopped);
        let report = Report {
            stage: Stage::Stopped,
            failed: false,
            generation: 1,
            desired_revision: 12,
        };
        assert_eq!(decide(&v), Some(Action::Publish(report)));
        v.published = Some(report);
        assert_eq!(decide(&v), Some(Action::Release));
    }

    #[test]
    fn a_command_step_never_publishes() {
        // Invariant 3, over every stage and desired stage.
        for stage in Stage::ALL {
            for desired in [
                DesiredStage::Running,
                DesiredStage::Paused,
                DesiredStage::Stopped,
            ] {
                let mut v = view();
                v.local = local(stage);
                v.desired = Some((desired, 20));
                v.acted = None;
                match decide(&v) {
                    Some(Action::Drop) => {
                        assert!(stage == Stage::Stopped && desired != DesiredStage::Stopped)
                    }
                    Some(Action::Publish(r)) => assert_eq!(r.stage, stage),
                    Some(Action::Resume { .. }) => {
                        assert!(matches!(stage, Stage::New | Stage::Paused))
                    }
                    Some(Action::Pause { .. }) => assert!(stage.run_may_be_alive()),
                    Some(Action::Stop) => assert!(!stage.is_terminal()),
                    other => panic!("{stage} {desired}: unexpected {other:?}"),
                }
            }
        }
    }

    /// Invariant 6: a hand-over pauses the run, and only once it returned releases
    /// the key, with the report of its rest in the same write.
    #[test]
    fn a_hand_over_pauses_then_releases_with_its_rest() {
        let mut v = view();
        v.hand_over = true;
        v.local = local(Stage::Running);
        assert_eq!(
            decide(&v),
            Some(Action::Yield),
            "a running task is paused first"
        );
        v.local = local(Stage::Resuming);
        assert_eq!(decide(&v), Some(Action::Yield));
        v.local = local(Stage::Pausing);
        let pausing = Report {
            stage: Stage::Pausing,
            failed: false,
            generation: 1,
            desired_revision: 10,
        };
        assert_eq!(
            decide(&v),
            None,
            "a hand-over's Pausing is not published, nor the key released"
        );
        v.published = Some(Report {
            stage: Stage::Running,
            ..pausing
        });
        assert_eq!(decide(&v), None, "released while the run may be alive");
        v.local = local(Stage::Paused);
        let paused = Report {
            stage: Stage::Paused,
            ..pausing
        };
        assert_eq!(
            decide(&v),
            Some(Action::Hand(paused)),
            "the rest and the release go out together"
        );
        // Its answer lost, or the rest already published (a pause): the release.
        v.published = Some(paused);
        assert_eq!(decide(&v), Some(Action::Release));
        // Given up once Paused is published for this revision: carried through, a
        // resume would leave that report standing beside a live run.
        v.hand_over = false;
        v.yielded = true;
        assert_eq!(decide(&v), Some(Action::Release));
        // Given up before (no rest published for it): the paused task runs again.
        v.published = Some(pausing);
        assert_eq!(decide(&v), Some(Action::Resume { revision: 10 }));
        v.published = Some(Report {
            stage: Stage::Running,
            ..pausing
        });
        assert_eq!(decide(&v), Some(Action::Resume { revision: 10 }));
        v.yielded = false;
        v.published = Some(paused);
        assert_eq!(decide(&v), None, "acted for this revision, not yielded");
    }

    #[test]
    fn a_failed_or_stopping_task_is_not_handed_over() {
        let mut v = view();
        v.hand_over = true;
        v.yielded = true;
        v.local = Some(Local {
            stage: Stage::Paused,
            failed: true,
            generation: 1,
        });
        v.published = Some(Report {
            stage: Stage::Paused,
            failed: true,
            generation: 1,
            desired_revision: 10,
        });
        assert_eq!(
            decide(&v),
            None,
            "a failure is its answer: kept, not retried"
        );
        v.desired = Some((DesiredStage::Stopped, 11));
        v.local = local(Stage::Running);
        assert_eq!(decide(&v), Some(Action::Stop));
        // A task desired Paused is handed over at rest.
        v.desired = Some((DesiredStage::Paused, 12));
        v.local = local(Stage::Paused);
        v.published = Some(Report {
            stage: Stage::Paused,
            failed: false,
            generation: 1,
            desired_revision: 12,
        });
        assert_eq!(decide(&v), Some(Action::Release));
        v.hand_over = false;
        assert_eq!(
            decide(&v),
            None,
            "a yield of an earlier revision commits nothing"
        );
    }

    /// Invariant 7: a draining worker claims nothing, and hands over every task it
    /// holds by a pause, then the release with its rest: a failed one too, a stopping
    /// one not.
    #[test]
    fn a_drain_claims_nothing_and_hands_everything_over() {
        let mut v = view();
        v.draining = true;
        v.local = None;
        v.ownership = Ownership::Unowned;
        assert_eq!(decide(&v), None, "a draining worker claimed");

        let mut v = view();
        v.draining = true;
        assert_eq!(decide(&v), Some(Action::Yield), "the run is paused first");
        v.local = local(Stage::Pausing);
        assert_eq!(
            decide(&v).filter(|a| *a == Action::Release),
            None,
            "released while the run may be alive"
        );
        v.local = local(Stage::Paused);
        let rest = Report {
            stage: Stage::Paused,
            failed: false,
            generation: 1,
            desired_revision: 10,
        };
        assert_eq!(decide(&v), Some(Action::Hand(rest)));
        v.published = Some(rest);
        assert_eq!(decide(&v), Some(Action::Release));

        // A failed task is handed over too (not only under a drain: see invariant 6).
        let failed = Local {
            stage: Stage::Paused,
            failed: true,
            generation: 1,
        };
        let report = Report {
            failed: true,
            ..rest
        };
        let mut v = view();
        v.local = Some(failed);
        v.published = Some(report);
        assert_eq!(decide(&v), None, "a failure kept without a drain");
        v.draining = true;
        assert_eq!(decide(&v), Some(Action::Release));

        // Desired Stopped: stopped where it is, not handed over.
        let mut v = view();
        v.draining = true;
        v.desired = Some((DesiredStage::Stopped, 11));
        assert_eq!(decide(&v), Some(Action::Stop));
    }
}
