#!/usr/bin/env bash
# Mutation check: puts small, plausible bugs into the crate one at a time and runs the
# suite named for each. A mutant is CAUGHT when its suite fails (a suite that hangs
# past SUITE_TIMEOUT counts as failing, and says so) and SURVIVED when it passes.
# Prints a Markdown table; exits non-zero if any mutant survived, did not apply (its
# original text is gone: the mutant is stale), did not build, or its suite ran no test.
#
#   bash scripts/mutation-check.sh                # every mutant
#   MUTANTS="1 5 7" bash scripts/mutation-check.sh  # a subset
#
# Environment:
#   MUTANTS           numbers of the mutants to run (default: all)
#   BASELINE=0        skip the run of each needed suite on the unmutated tree
#   SUITE_TIMEOUT     seconds a suite may run before it counts as hung (default 600)
#   CARGO_TARGET_DIR  target dir of the normal builds (default: cargo's)
#   LOOM_TARGET_DIR   target dir of the loom builds (default: target/loom)
#   MUTANTS_LOG_DIR   where each suite's output is kept (default: a fresh temp dir)
#
# Every edit is an exact text replacement that must find its original text (once, or
# first after an anchor that occurs once), so a mutant whose code has moved fails
# loudly instead of silently testing the unmutated crate. Each mutated file is
# restored with `git checkout` after its run, and on any exit; the check refuses to
# start on a tree with uncommitted changes, so that restore can lose nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE_TIMEOUT=${SUITE_TIMEOUT:-600}
LOOM_TARGET_DIR=${LOOM_TARGET_DIR:-target/loom}
LOG_DIR=${MUTANTS_LOG_DIR:-$(mktemp -d)}
mkdir -p "$LOG_DIR"

if ! git diff --quiet HEAD --; then
  echo "mutation-check: the work tree has uncommitted changes; commit or stash them first" >&2
  exit 2
fi

# ---------------------------------------------------------------- the machinery

MUTATED=""
restore() {
  if [[ -n "$MUTATED" ]]; then
    git checkout -q -- "$MUTATED"
    MUTATED=""
  fi
  # Also whatever a mutant touched before it was recorded (an interrupt mid-edit).
  local touched
  touched=$(git diff --name-only -- src)
  if [[ -n "$touched" ]]; then
    # shellcheck disable=SC2086
    git checkout -q -- $touched
  fi
  # A failing property test saves its seed; the committed seed files stay as they are.
  git checkout -q -- proptest-regressions
}
trap restore EXIT
trap 'restore; exit 130' INT TERM

# Set by a mutant's definition.
WHERE="" MUTANT="" SUITE="" APPLY=0

# The replacement itself: argv = FILE ANCHOR, stdin = the mutant's definition.
read -r -d '' EDIT_PY <<'PY' || true
import sys

path, anchor = sys.argv[1], sys.argv[2]
parts = sys.stdin.read().split("\n@@@@\n")
if len(parts) != 2:
    sys.exit(f"{path}: a mutant needs one original and one mutated text")
old, new = parts
text = open(path, encoding="utf-8").read()
if anchor:
    if text.count(anchor) != 1:
        sys.exit(f"{path}: anchor {anchor!r} occurs {text.count(anchor)} times, not once")
    at = text.find(old, text.index(anchor) + len(anchor))
    if at < 0:
        sys.exit(f"{path}: the original text is not after {anchor!r}: {old!r}")
else:
    if text.count(old) != 1:
        sys.exit(f"{path}: the original text occurs {text.count(old)} times, not once: {old!r}")
    at = text.index(old)
open(path, "w", encoding="utf-8").write(text[:at] + new + text[at + len(old):])
PY

# edit FILE [ANCHOR] <<'EOF'
# original text
# @@@@
# mutated text
# EOF
# With APPLY=1 replaces the original text in FILE, which must occur exactly once (or,
# with ANCHOR, which must occur exactly once, first after ANCHOR). Otherwise only
# reads the definition.
edit() {
  local file=$1 anchor=${2-} spec
  spec=$(cat)
  [[ $APPLY == 1 ]] || return 0
  MUTATED=$file
  printf '%s' "$spec" | python3 -c "$EDIT_PY" "$file" "$anchor"
}

# The command a suite name stands for: `[FEATURES] --lib [FILTER]`,
# `[FEATURES] --test NAME [FILTER]` (FEATURES: `--all-features` or `--features LIST`,
# for the layers behind a feature), or `loom FILTER` (the loom models, built with their
# cfg in release mode).
suite_label() {
  case $1 in
    loom\ *) echo "\`cargo test --release --test loom ${1#loom } (loom-tests/, cfg taskstage_loom)\`" ;;
    *) echo "\`cargo test $1\`" ;;
  esac
}

# Fills CMD with the command that builds (MODE=build) or runs (MODE=run) SUITE.
suite_cmd() { # MODE SUITE
  local mode=$1 suite=$2 args
  case $suite in
    loom\ *)
      CMD=(env RUSTFLAGS="--cfg taskstage_loom" CARGO_TARGET_DIR="$LOOM_TARGET_DIR"
        cargo test --release --manifest-path loom-tests/Cargo.toml --test loom)
      if [[ $mode == build ]]; then
        CMD+=(--no-run)
      else
        read -r -a args <<<"${suite#loom }"
        CMD+=(-- --test-threads=1 "${args[@]}")
      fi ;;
    *)
      read -r -a args <<<"$suite"
      if [[ $mode == build ]]; then
        # The features and the target are build arguments; a test-name filter is not.
        local n=0
        case ${args[0]} in
          --all-features) n=1 ;;
          --features) n=2 ;;
        esac
        case ${args[n]} in
          --lib) n=$((n + 1)) ;;
          --test | --bin) n=$((n + 2)) ;;
        esac
        CMD=(cargo test "${args[@]:0:n}" --no-run)
      else
        CMD=(cargo test "${args[@]}")
      fi ;;
  esac
}

# Runs SUITE into LOG; prints PASS, FAIL, HUNG, NO-TESTS or BUILD-FAILED.
run_suite() { # SUITE LOG
  local suite=$1 log=$2 rc=0
  suite_cmd build "$suite"
  if ! "${CMD[@]}" >"$log" 2>&1; then
    echo BUILD-FAILED
    return 0
  fi
  suite_cmd run "$suite"
  timeout --kill-after=30 "$SUITE_TIMEOUT" "${CMD[@]}" >>"$log" 2>&1 || rc=$?
  # A filter that matches no test would make every mutant look like a survivor, and
  # the baseline look fine: say so instead.
  if ! grep -qE '^running [1-9]' "$log"; then
    echo NO-TESTS
    return 0
  fi
  case $rc in
    0) echo PASS ;;
    124 | 137) echo HUNG ;;
    *) echo FAIL ;;
  esac
}

# The failing tests named in a suite's output: "N failed: `a`, `b`, `c` …".
failures() {
  local names count
  names=$(grep -oE '^test [^ ]+ \.\.\. FAILED' "$1" | sed -E 's/^test ([^ ]+) .*/\1/' || true)
  [[ -n $names ]] || return 0
  count=$(wc -l <<<"$names")
  printf '%s failed: %s' "$count" "$(head -n3 <<<"$names" | sed 's/.*/`&`/' | paste -sd, - | sed 's/,/, /g')"
  ((count <= 3)) || printf ' …'
}

# ---------------------------------------------------------------- the mutants
# Each sets WHERE, MUTANT and SUITE, then makes its edit. Numbers are stable: a
# mutant that is retired keeps its number unused.

m1() {
  WHERE="lifecycle/driver.rs: run, check passed"
  MUTANT="the unit is not handed back in the PrepOk report (None instead of the held unit): it is not in its slot when Paused is published"
  SUITE="--test truth"
  edit src/lifecycle/driver.rs <<'EOF'
                let mut applied = driver.core.report_prepared(generation, Exit::Ok, held);
@@@@
                let mut applied = driver.core.report_prepared(generation, Exit::Ok, None);
EOF
}

m2() {
  WHERE="lifecycle/driver.rs: Closes::drop"
  MUTANT="a stop's units are reported closed (publishing Stopped) before close_all runs"
  SUITE="--test truth"
  edit src/lifecycle/driver.rs <<'EOF'
        close_all(std::mem::take(&mut self.units));
        let closed = self.driver.core.report_closed(self.generation);
@@@@
        let closed = self.driver.core.report_closed(self.generation);
        close_all(std::mem::take(&mut self.units));
EOF
}

m3() {
  WHERE="lifecycle/driver.rs: run, run completed"
  MUTANT="a completed unit is closed after report_exit (Finished, or the next unit's Running, is published before close returns)"
  SUITE="--test truth"
  edit src/lifecycle/driver.rs <<'EOF'
                close_one(&mut unit);
                drop(unit);
                let applied = driver.core.report_exit(generation, Exit::Ok, None);
@@@@
                let applied = driver.core.report_exit(generation, Exit::Ok, None);
                close_one(&mut unit);
                drop(unit);
EOF
}

m4() {
  WHERE="lifecycle/mod.rs: WaitUntil::poll"
  MUTANT="the wait_until predicate (user code) is evaluated while the core's lock is held, as Settled::poll does with its own check"
  SUITE="--test truth"
  edit src/lifecycle/mod.rs <<'EOF'
            state.snapshot()
        };
        // Invariant 7: the predicate is user code; no lock of ours is held here.
        if (this.predicate)(&snapshot) {
            lock(&this.core.state).waiters.remove(this.id.take());
            return Poll::Ready(snapshot);
        }
        Poll::Pending
@@@@
            let snapshot = state.snapshot();
            if (this.predicate)(&snapshot) {
                state.waiters.remove(this.id.take());
                return Poll::Ready(snapshot);
            }
            snapshot
        };
        let _ = snapshot;
        Poll::Pending
EOF
}

m5() {
  WHERE="lifecycle/mod.rs: Lifecycle::abort"
  MUTANT="an abort is sent only while the stage is Running (dropped in Stopping, where a stop escalates)"
  SUITE="--test runtime"
  edit src/lifecycle/mod.rs <<'EOF'
            (state.generation == generation)
                .then(|| state.cancel.clone())
@@@@
            (state.generation == generation && state.stage == Stage::Running)
                .then(|| state.cancel.clone())
EOF
}

m6() {
  WHERE="lifecycle/mod.rs: Settle::reached"
  MUTANT="a stop waits only while a run is named by the stage (Running, Pausing, Resuming): it settles at Stopping, so stop_within does not wait"
  SUITE="--test runtime"
  edit src/lifecycle/mod.rs <<'EOF'
            Command::Stop if !stage.is_terminal() => None,
@@@@
            Command::Stop if matches!(stage, Stage::Running | Stage::Pausing | Stage::Resuming) => None,
EOF
}

m7() {
  WHERE="lifecycle/waiters.rs: Waiters::register"
  MUTANT="a waiter polled again keeps the waker it registered first (no clone_from refresh)"
  SUITE="--lib"
  edit src/lifecycle/waiters.rs <<'EOF'
            Some(stored) => {
                #[cfg(taskstage_loom)]
                if super::prefix::on(super::prefix::Defect::StaleWaker) {
                    return;
                }
                // A future polled again may have moved to another task: the newest
                // waker is the one to wake.
                if !stored.will_wake(waker) {
                    stored.clone_from(waker);
                }
            }
@@@@
            // Already registered: the waker it registered with will do.
            Some(_) => {}
EOF
}

m8() {
  WHERE="lifecycle/mod.rs: Lifecycle::input"
  MUTANT="the generation fence is removed: a stale exit report reaches the table"
  SUITE="--lib"
  edit src/lifecycle/mod.rs <<'EOF'
            if generation != state.generation {
                return Ok(Applied::ignored_with(returned));
            }
@@@@
            let _ = generation;
EOF
}

m9() {
  WHERE="lifecycle/mod.rs: Lifecycle::input"
  MUTANT="the generation fence stops only older reports (<), not a report of a generation that is not current yet"
  SUITE="--lib"
  edit src/lifecycle/mod.rs <<'EOF'
            if generation != state.generation {
@@@@
            if generation < state.generation {
EOF
}

m10() {
  WHERE="table.rs: Paused × stop"
  MUTANT="stop in Paused goes straight to Stopped (with the close effect), not to Stopping until the closes are reported"
  SUITE="--test table"
  edit src/table.rs 'fn paused(' <<'EOF'
                .effects(|e| e.close_units = true)
                .to(TableState::stopping()),
@@@@
                .effects(|e| e.close_units = true)
                .to(TableState::stopped()),
EOF
}

m11() {
  WHERE="table.rs: Stopping × units closed"
  MUTANT="the report that every unit is closed is ignored in Stopping"
  SUITE="--test table"
  edit src/table.rs <<'EOF'
            Input::Closed => context.accept().to(TableState::stopped()),
@@@@
            Input::Closed => context.ignore(),
EOF
}

m12() {
  WHERE="table.rs: Pausing × run/prep cancelled"
  MUTANT="a pause that ends in a cancelled run does not set the user-paused mark"
  SUITE="--test table"
  edit src/table.rs <<'EOF'
                .outcome(OutcomeChange::Cancelled)
                .mark(MarkChange::Set)
@@@@
                .outcome(OutcomeChange::Cancelled)
EOF
}

m13() {
  WHERE="lifecycle/mod.rs: State::put_back"
  MUTANT="a unit handed back in a report is returned to the caller (as an orphan) instead of re-entering its slot"
  SUITE="--lib"
  edit src/lifecycle/mod.rs <<'EOF'
            (_, Some(unit)) => {
                *slot = Slot::Here(unit);
                None
            }
@@@@
            (_, Some(unit)) => Some(unit),
EOF
}

m14() {
  WHERE="lifecycle/mod.rs: close_units effect"
  MUTANT="the units a stop closes start after the current one (off by one): the current unit is never closed"
  SUITE="--lib"
  edit src/lifecycle/mod.rs <<'EOF'
            let remaining = state.unit.min(state.units)..state.units;
@@@@
            let remaining = (state.unit + 1).min(state.units)..state.units;
EOF
}

m15() {
  WHERE="lifecycle/mod.rs: Lifecycle::input, stage publication"
  MUTANT="the lock-free stage is stored with Relaxed instead of Release"
  SUITE="loom e_dropped_pause_future"
  edit src/lifecycle/mod.rs <<'EOF'
        self.stage.store(step.to as u8, Ordering::Release);
@@@@
        self.stage.store(step.to as u8, Ordering::Relaxed);
EOF
}

m16() {
  WHERE="lifecycle/mod.rs: Lifecycle::input, start effect"
  MUTANT="a start gets a fresh cancel handle instead of its generation's (made when the generation became current)"
  SUITE="--lib"
  edit src/lifecycle/mod.rs <<'EOF'
                cancel: state.current_cancel(from),
@@@@
                cancel: K::new_handle(),
EOF
}

m17() {
  WHERE="lifecycle/mod.rs: Lifecycle::input, wake-up"
  MUTANT="the condition variable is notified only when more than one thread is blocked on it (a single blocked thread is never woken)"
  SUITE="loom a_pause_vs_run_exit"
  edit src/lifecycle/mod.rs <<'EOF'
        let notify_threads = state.blocked > 0;
@@@@
        let notify_threads = state.blocked > 1;
EOF
}

m18() {
  WHERE="lifecycle/mod.rs: Lifecycle::input, wake-up"
  MUTANT="the async waiters' wakers are dropped instead of woken"
  SUITE="--lib"
  edit src/lifecycle/mod.rs "// Invariant 7: wake after the lock is released." <<'EOF'
            wakers.wake();
@@@@
            drop(wakers);
EOF
}

m19() {
  WHERE="lifecycle/mod.rs: Settled::drop"
  MUTANT="a dropped settle future unregisters its waker only when it never registered one (inverted check)"
  SUITE="--lib"
  edit src/lifecycle/mod.rs 'impl<K, C, U> Drop for Settled<' <<'EOF'
        if self.id.is_some() {
@@@@
        if self.id.is_none() {
EOF
}

m20() {
  WHERE="lifecycle/mod.rs: unit_done effect"
  MUTANT="moving to the next unit keeps unit_started: the next unit's first run is told it is a resume"
  SUITE="--test prop_core"
  edit src/lifecycle/mod.rs <<'EOF'
            state.unit += 1;
            state.unit_started = false;
@@@@
            state.unit += 1;
EOF
}

m21() {
  WHERE="lifecycle/mod.rs: Lifecycle::input, RunOk"
  MUTANT="the last unit is recognised one unit late (> instead of >=): its completion launches a unit that does not exist"
  SUITE="--test runtime"
  edit src/lifecycle/mod.rs <<'EOF'
                    last_unit: state.unit + 1 >= state.units,
@@@@
                    last_unit: state.unit + 1 > state.units,
EOF
}

m22() {
  WHERE="lifecycle/driver.rs: run, check passed"
  MUTANT="the exit guard is not re-armed for the launch that follows a passed check: a run dropped by its runtime is never reported"
  SUITE="--test runtime"
  edit src/lifecycle/driver.rs <<'EOF'
                        guard.kind = StartKind::Launch;
                        guard.armed = true;
@@@@
                        guard.kind = StartKind::Launch;
EOF
}

m23() {
  WHERE="lifecycle/driver.rs: run, exit guard"
  MUTANT="the exit guard starts disarmed: a check (or a next unit's run) dropped by its runtime is never reported"
  SUITE="--test runtime"
  edit src/lifecycle/driver.rs <<'EOF'
        armed: true,
@@@@
        armed: false,
EOF
}

m24() {
  WHERE="lifecycle/driver.rs: run, fast quit"
  MUTANT="only a resume's check is raced against the cancel: the first start's check is not dropped by a pause or a stop"
  SUITE="--test runtime"
  edit src/lifecycle/driver.rs <<'EOF'
            let interrupt = pin!(plan.cancel.interrupted(kind == StartKind::Prepare));
@@@@
            let interrupt =
                pin!(plan.cancel.interrupted(kind == StartKind::Prepare && plan.resume));
EOF
}

m25() {
  WHERE="runtime/handle.rs: Handle::stop_within"
  MUTANT="the stop escalation waits a second grace period without aborting the run"
  SUITE="--test runtime"
  edit src/runtime/handle.rs <<'EOF'
            shared.abort(settle.generation());
            match tokio::time::timeout(grace, shared.core().settled(settle)).await {
@@@@
            match tokio::time::timeout(grace, shared.core().settled(settle)).await {
EOF
}

m26() {
  WHERE="runtime/handle.rs: Owner::drop"
  MUTANT="dropping the last handle pauses the task instead of stopping it"
  SUITE="--test runtime"
  edit src/runtime/handle.rs <<'EOF'
        let Ok(settle) = Driver::command(shared, Command::Stop) else {
@@@@
        let Ok(settle) = Driver::command(shared, Command::Pause) else {
EOF
}

m27() {
  WHERE="runtime/handle.rs: Owner::drop"
  MUTANT="dropping the last handle leaves a task at rest (New, Paused) as it is: its units are never closed"
  SUITE="--test policy"
  edit src/runtime/handle.rs 'impl<C: Send + Sync + '"'"'static> Drop for Owner<C>' <<'EOF'
        if shared.core().stage().is_terminal() {
@@@@
        if shared.core().stage().is_at_rest() {
EOF
}

m28() {
  WHERE="runtime/shared.rs: Tokio::published"
  MUTANT="the sequence check is inverted: newer stage events are dropped, older ones kept"
  SUITE="--test runtime"
  edit src/runtime/shared.rs <<'EOF'
            if event.seq <= events.latest.seq {
@@@@
            if event.seq > events.latest.seq {
EOF
}

m29() {
  WHERE="runtime/shared.rs: Held::apply_config"
  MUTANT="the applied configuration is recorded before the comparison, so a new configuration is never applied"
  SUITE="--test runtime"
  edit src/runtime/shared.rs <<'EOF'
        if Arc::ptr_eq(&self.applied, config) {
            return Ok(());
        }
        self.unit.apply_config(config)?;
        self.applied = Arc::clone(config);
        Ok(())
@@@@
        self.applied = Arc::clone(config);
        if Arc::ptr_eq(&self.applied, config) {
            return Ok(());
        }
        self.unit.apply_config(config)?;
        Ok(())
EOF
}

m30() {
  WHERE="runtime/shared.rs: Tokio::subscribe"
  MUTANT="the first subscription's channel starts from the initial event (New) instead of the latest change"
  SUITE="--test runtime"
  edit src/runtime/shared.rs <<'EOF'
            .get_or_insert_with(|| watch::Sender::new(latest))
@@@@
            .get_or_insert_with(|| watch::Sender::new(StageEvent::initial()))
EOF
}

m31() {
  WHERE="runtime/handle.rs: Owner::drop"
  MUTANT="after the last handle is dropped, a run that ignores cancellation past the grace period is left running (no abort)"
  SUITE="--test runtime"
  edit src/runtime/handle.rs <<'EOF'
                {
                    reaper.abort(settle.generation());
                }
@@@@
                {
                    tracing::warn!("run ignored cancellation after the last handle was dropped");
                }
EOF
}

# ---- the cluster: lease, fence, keys, controller, worker, etcd coordinator

m32() {
  WHERE="cluster/worker/mod.rs: WorkerBuilder::check"
  MUTANT="the drift ρ is turned into parts per hundred instead of per thousand: the lease deadline leaves a tenth of the drift allowance"
  SUITE="--all-features --test cluster_promises the_lease_deadline"
  edit src/cluster/worker/mod.rs <<'EOF'
        let rho = (self.drift * 1000.0).ceil() as u64;
@@@@
        let rho = (self.drift * 100.0).ceil() as u64;
EOF
}

m33() {
  WHERE="cluster/worker/session.rs: Session::run"
  MUTANT="a keep-alive answer moves the deadline to sent + TTL − stop bound, without the drift allowance"
  SUITE="--all-features --test cluster_promises the_lease_deadline"
  edit src/cluster/worker/session.rs <<'EOF'
                        decide::stop_at(sent, ttl_ms, timing.rho_permille, timing.stop_bound_ms);
@@@@
                        decide::stop_at(sent, ttl_ms, 0, timing.stop_bound_ms);
EOF
}

m34() {
  WHERE="cluster/controller.rs: Controller::set"
  MUTANT="the desired stage is written unconditionally (no compare with the revision read): set_desired is no longer a compare-and-set"
  SUITE="--all-features --test cluster_promises set_desired"
  edit src/cluster/controller.rs <<'EOF'
            when: vec![Compare::ModRevision(key.clone(), status.desired_revision)],
@@@@
            when: vec![],
EOF
}

m35() {
  WHERE="cluster/worker/reconcile/mod.rs: Reconciler::capacity_left"
  MUTANT="a worker has room while it holds as many tasks as its capacity (<= for <): it claims one task too many"
  SUITE="--all-features --test cluster_promises capacity"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
        self.view.is_known() && held < self.inner.capacity.min(self.share)
@@@@
        self.view.is_known() && held <= self.inner.capacity.min(self.share)
EOF
}

m36() {
  WHERE="cluster/fence.rs: FenceToken::compares"
  MUTANT="a fenced write compares only the owner key's value (worker and lease), not its create revision: a stale token of the same worker under the same lease is accepted"
  SUITE="--all-features --lib cluster::fence"
  edit src/cluster/fence.rs <<'EOF'
            Compare::CreateRevision(owner.clone(), self.revision),
            Compare::Value(owner, owner_value(&self.worker, self.lease).into_bytes()),
@@@@
            Compare::Value(owner, owner_value(&self.worker, self.lease).into_bytes()),
EOF
}

m37() {
  WHERE="cluster/keys.rs: check_id"
  MUTANT="an id of exactly 128 bytes is refused (>= for >)"
  SUITE="--all-features --lib cluster::keys"
  edit src/cluster/keys.rs <<'EOF'
    if id.len() > MAX_ID_LEN {
@@@@
    if id.len() >= MAX_ID_LEN {
EOF
}

m38() {
  WHERE="cluster/etcd.rs: EtcdCoordinator::keep_alive"
  MUTANT="a keep-alive answered \"lease not found\" is read as an answer that keeps the lease alive"
  SUITE="--all-features --test cluster_etcd a_keep_alive_of_a_lease_that_no_longer_exists"
  edit src/cluster/etcd.rs <<'EOF'
                        Err(error) if lease_not_found(&error) => return Ok(None),
@@@@
                        Err(error) if lease_not_found(&error) => return Ok(Some(1)),
EOF
}

# ---- groups

m39() {
  WHERE="runtime/group.rs: GroupEvents::poll_next"
  MUTANT="the merged stream starts its next poll at the task that just yielded instead of the one after it: one task's backlog starves the others"
  SUITE="--test group the_merged_stream_takes_turns"
  edit src/runtime/group.rs <<'EOF'
                    this.next = (index + 1) % count;
@@@@
                    this.next = index;
EOF
}

m40() {
  WHERE="runtime/group.rs: TaskGroup::stop_all, all at once"
  MUTANT="each stop is given the whole deadline as its grace: a stubborn run is aborted only at the deadline, and stop_all overruns it"
  SUITE="--test group stop_all_aborts"
  edit src/runtime/group.rs <<'EOF'
                    .map(|task| task.stop_now_within(deadline / 2))
@@@@
                    .map(|task| task.stop_now_within(deadline))
EOF
}

m41() {
  WHERE="runtime/group.rs: TaskGroup::stop_all, reverse order"
  MUTANT="in reverse order each stop is given all that is left as its grace, not half: the first stubborn stop eats the whole deadline"
  SUITE="--test group stop_all_aborts"
  edit src/runtime/group.rs <<'EOF'
                    let result = match task.stop_now_within(left / 2) {
@@@@
                    let result = match task.stop_now_within(left) {
EOF
}

# ---- a unit's close

m42() {
  WHERE="lifecycle/driver.rs: close_one"
  MUTANT="a unit's close is called without catching its panic"
  SUITE="--test runtime a_close_that_panics"
  edit src/lifecycle/driver.rs <<'EOF'
    if catch_unwind(AssertUnwindSafe(|| unit.close())).is_err() {
        tracing::error!("a unit's close panicked");
    }
@@@@
    unit.close();
EOF
}

# ---- the testing kit

m43() {
  WHERE="testing/probe.rs: Watched::prepare"
  MUTANT="a pre-start check is not counted alive (only runs are)"
  SUITE="--all-features --lib testing::"
  edit src/testing/probe.rs <<'EOF'
        let _live = self.probe.enter(id);
        let probe = Arc::clone(&self.probe);
@@@@
        let _ = id;
        let probe = Arc::clone(&self.probe);
EOF
}

m44() {
  WHERE="testing/runner.rs: Driver::end"
  MUTANT="the end of a schedule checks for two live runs but not for a run still alive at the final rest stage"
  SUITE="--all-features --lib testing::"
  edit src/testing/runner.rs <<'EOF'
        self.overlap()?;
        self.nothing_live(Command::Resume, end.stage)?;
@@@@
        self.overlap()?;
EOF
}

m45() {
  WHERE="cluster/worker/session.rs: Session::run"
  MUTANT="a keep-alive answered Expired ends the session without clearing the deadline: the runs go on until the old deadline and the worker never reports LeaseLost"
  SUITE="--all-features --test cluster_promises a_worker_whose_lease_is_gone"
  edit src/cluster/worker/session.rs <<'EOF'
                    lease_tx.send_modify(|state| state.stop_at = None);
                    return;
@@@@
                    return;
EOF
}

m46() {
  WHERE="cluster/worker/reconcile/execute.rs: Reconciler::claim"
  MUTANT="a claim puts the owner key without comparing that it is absent: it overwrites another worker's claim"
  SUITE="--all-features --test cluster_promises a_claim_never_overwrites"
  edit src/cluster/worker/reconcile/execute.rs <<'EOF'
                Compare::Absent(owner.clone()),
@@@@
                // (no compare on the owner key)
EOF
}

m47() {
  WHERE="cluster/controller.rs: Controller::set"
  MUTANT="the Stopped-is-final check tests the new desired stage instead of the stored one: a stopped task can be resumed"
  SUITE="--all-features --test cluster_promises a_stopped_task_stays_stopped"
  edit src/cluster/controller.rs <<'EOF'
        if status.desired == DesiredStage::Stopped {
            if desired != DesiredStage::Stopped {
@@@@
        if desired == DesiredStage::Stopped {
            if status.desired != DesiredStage::Stopped {
EOF
}

m48() {
  WHERE="cluster/keys.rs: check_id"
  MUTANT="an id containing '@' (the owner value's separator) is accepted"
  SUITE="--all-features --lib cluster::keys"
  edit src/cluster/keys.rs <<'EOF'
    if id.contains('@') {
        return Err("it contains '@', which separates the owner value");
    }
@@@@
    // An '@' is left to the owner value's parser, which splits at the last one.
EOF
}

m49() {
  WHERE="cluster/fence.rs: FenceToken::compares"
  MUTANT="a fenced write compares only the owner key's create revision, not its value: a token naming another worker or lease is accepted"
  SUITE="--all-features --lib cluster::fence"
  edit src/cluster/fence.rs <<'EOF'
            Compare::CreateRevision(owner.clone(), self.revision),
            Compare::Value(owner, owner_value(&self.worker, self.lease).into_bytes()),
@@@@
            Compare::CreateRevision(owner, self.revision),
EOF
}

m50() {
  WHERE="cluster/fence.rs: Fencer::fenced"
  MUTANT="a rejected fenced write returns Fenced but does not mark the fencer rejected (the worker is not told to stop the run)"
  SUITE="--all-features --lib cluster::fence"
  edit src/cluster/fence.rs <<'EOF'
            self.mark_rejected();
            Err(ClusterError::Fenced {
@@@@
            Err(ClusterError::Fenced {
EOF
}

m51() {
  WHERE="cluster/decide.rs: lease_allows"
  MUTANT="the lease still allows runs at the deadline itself (<= for <)"
  SUITE="--all-features --lib cluster::decide"
  edit src/cluster/decide.rs <<'EOF'
    stop_at.is_some_and(|deadline| now < deadline)
@@@@
    stop_at.is_some_and(|deadline| now <= deadline)
EOF
}

m52() {
  WHERE="cluster/decide.rs: decide, desired Running"
  MUTANT="a task Paused by a failure is resumed again for the same desired revision (invariant 4 lost: a failing run is retried for ever)"
  SUITE="--all-features --lib cluster::decide"
  edit src/cluster/decide.rs <<'EOF'
            Stage::Paused if view.acted != Some(revision) || (view.yielded && !local.failed) => {
@@@@
            Stage::Paused => {
EOF
}

m53() {
  WHERE="cluster/decide.rs: decide, unowned task"
  MUTANT="a task whose terminal status answers its desired revision is claimed again"
  SUITE="--all-features --lib cluster::decide"
  edit src/cluster/decide.rs <<'EOF'
            Ownership::Unowned if view.capacity_left && !view.settled && !view.draining => {
@@@@
            Ownership::Unowned if view.capacity_left && !view.draining => {
EOF
}

m54() {
  WHERE="cluster/memory.rs: State::drop_lease"
  MUTANT="the in-memory store drops an expired lease but keeps the keys attached to it (etcd deletes them)"
  SUITE="--all-features --test cluster_promises a_worker_whose_lease_is_gone"
  edit src/cluster/memory.rs <<'EOF'
            for key in keys {
                self.kvs.remove(&key);
                self.record(WatchEvent::Delete { key, revision });
            }
@@@@
            let _ = (keys, revision);
EOF
}

m55() {
  WHERE="cluster/worker/guard.rs: guard"
  MUTANT="at the lease deadline the guard finds the local runs but does not stop them (it leaves them to the reconcile loop, which a blocking factory may hold up)"
  SUITE="--all-features --test cluster_promises the_guard_stops_runs_at_the_deadline"
  edit src/cluster/worker/guard.rs <<'EOF'
        drop(spawn_stop(inner, task, handle));
@@@@
        drop((task, handle));
EOF
}

m56() {
  WHERE="cluster/memory.rs: State::holds"
  MUTANT="the in-memory store's create-revision compare holds for any existing key (the fence's revision compare is void in every in-memory test)"
  SUITE="--all-features --lib cluster::fence"
  edit src/cluster/memory.rs <<'EOF'
                self.kvs.get(key).map(|kv| kv.create_revision) == Some(*rev)
@@@@
                self.kvs.get(key).is_some() || *rev == 0
EOF
}

m57() {
  WHERE="runtime/group.rs: TaskGroup::stop_all, reverse order"
  MUTANT="the reverse order stops the tasks in the order they were added"
  SUITE="--test group stop_all_in_reverse"
  edit src/runtime/group.rs <<'EOF'
                for (index, task) in self.tasks.iter().enumerate().rev() {
@@@@
                for (index, task) in self.tasks.iter().enumerate() {
EOF
}

m58() {
  WHERE="runtime/group.rs: TaskGroup::pause_all"
  MUTANT="each pause waits twice the deadline: pause_all overruns its one deadline"
  SUITE="--test group pause_all_names"
  edit src/runtime/group.rs <<'EOF'
            .map(|task| task.pause_now_within(deadline))
@@@@
            .map(|task| task.pause_now_within(deadline * 2))
EOF
}

m59() {
  WHERE="runtime/group.rs: GroupEvents::poll_next"
  MUTANT="a task's ended stream is counted as open: the merged stream never ends"
  SUITE="--test group the_merged_stream_carries"
  edit src/runtime/group.rs <<'EOF'
                Poll::Ready(None) => this.streams[index] = None,
@@@@
                Poll::Ready(None) => open = true,
EOF
}

m60() {
  WHERE="lifecycle/journal.rs: Journal::push"
  MUTANT="the journal drops its oldest change only once it holds more than its capacity: it keeps one change too many"
  SUITE="--test events a_reader_that_falls_behind"
  edit src/lifecycle/journal.rs <<'EOF'
        if self.entries.len() == self.capacity {
@@@@
        if self.entries.len() > self.capacity {
EOF
}

m61() {
  WHERE="lifecycle/journal.rs: Journal::read"
  MUTANT="a lagging reader is told one change fewer than it missed"
  SUITE="--test events a_reader_that_falls_behind"
  edit src/lifecycle/journal.rs <<'EOF'
                    missed: oldest - next,
@@@@
                    missed: oldest - next - 1,
EOF
}

m62() {
  WHERE="testing/runner.rs: Driver::start"
  MUTANT="a pipeline with one unit not passed through Watch::unit is accepted"
  SUITE="--all-features --lib testing::"
  edit src/testing/runner.rs <<'EOF'
        if watched < units {
@@@@
        if watched + 1 < units {
EOF
}

m63() {
  WHERE="testing/runner.rs: Driver::settled"
  MUTANT="the runner waits for a cancelled run as long as the table's own deadline (twice the bound): a unit that ignores its cancellation is a command timeout, not Unresponsive naming it"
  SUITE="--all-features --lib testing::"
  edit src/testing/runner.rs <<'EOF'
        let stage = match tokio::time::timeout(self.bound, settling).await {
@@@@
        let stage = match tokio::time::timeout(self.bound.saturating_mul(2), settling).await {
EOF
}

m64() {
  WHERE="testing/probe.rs: Probe::enter"
  MUTANT="an overlap is recorded only when two others are already alive (the second of two live runs is not an overlap)"
  SUITE="--all-features --lib testing::"
  edit src/testing/probe.rs <<'EOF'
            if let Some((_, other)) = state.live.first() {
@@@@
            if let Some((_, other)) = state.live.get(1) {
EOF
}

m65() {
  WHERE="testing/schedule.rs: Point's Display"
  MUTANT="a switch point prints without the word \"unit\": the printed schedule does not parse back"
  SUITE="--all-features --lib testing::"
  edit src/testing/schedule.rs <<'EOF'
            Point::Switch(unit) => write!(f, "at switch to unit {unit}"),
@@@@
            Point::Switch(unit) => write!(f, "at switch to {unit}"),
EOF
}

m66() {
  WHERE="policy/auto_resume.rs: Inner::classify"
  MUTANT="a classifier that panics counts the error as resumable"
  SUITE="--test policy a_panicking_classifier"
  edit src/policy/auto_resume.rs <<'EOF'
                tracing::error!(task, %error, "the classifier panicked; the error counts as not resumable");
                false
@@@@
                tracing::error!(task, %error, "the classifier panicked; the error counts as not resumable");
                true
EOF
}

m67() {
  WHERE="policy/auto_resume.rs: failed_not_user_paused"
  MUTANT="a failure is the policy's business even when the user paused the task afterwards"
  SUITE="--test policy user_paused"
  edit src/policy/auto_resume.rs <<'EOF'
    if snap.stage != Stage::Paused || snap.user_paused {
@@@@
    if snap.stage != Stage::Paused {
EOF
}

m68() {
  WHERE="policy/auto_resume.rs: Entry::resumed"
  MUTANT="an auto-resume does not step the backoff up: every wait is the first"
  SUITE="--test policy backoff_grows"
  edit src/policy/auto_resume.rs <<'EOF'
    fn resumed(&mut self, generation: u64) {
        self.backoff.advance();
@@@@
    fn resumed(&mut self, generation: u64) {
EOF
}

m69() {
  WHERE="policy/auto_resume.rs: Entry::observe_healthy"
  MUTANT="one step fewer is rolled back than healthy periods passed (off by one)"
  SUITE="--test policy one_step_is_rolled_back"
  edit src/policy/auto_resume.rs <<'EOF'
                for _ in 0..steps {
                    self.backoff.rollback();
@@@@
                for _ in 1..steps {
                    self.backoff.rollback();
EOF
}

m70() {
  WHERE="policy/auto_resume.rs: Entry::observe_healthy"
  MUTANT="a healthy streak carries on across a resume of the same unit (the task was at rest in between)"
  SUITE="--test policy a_healthy_streak"
  edit src/policy/auto_resume.rs <<'EOF'
            Some(h) if h.generation == snap.generation || h.unit != unit => Healthy {
@@@@
            Some(h) => Healthy {
EOF
}

m71() {
  WHERE="policy/auto_resume.rs: Entry::observe"
  MUTANT="a task that reached Stopped or Finished keeps its policy state"
  SUITE="--test policy stopped_finished_and_removed"
  edit src/policy/auto_resume.rs <<'EOF'
            Stage::Stopped | Stage::Finished => return Action::Forget,
@@@@
            Stage::Stopped | Stage::Finished => self.standing = Standing::Idle,
EOF
}

m72() {
  WHERE="policy/backoff.rs: Backoff::advance"
  MUTANT="the step keeps growing at the cap (<= for <): a rollback from there does not shorten the next wait"
  SUITE="--test policy backoff_steps"
  edit src/policy/backoff.rs <<'EOF'
        if self.current() < self.settings.max {
@@@@
        if self.current() <= self.settings.max {
EOF
}

m73() {
  WHERE="policy/backoff.rs: Backoff::delay"
  MUTANT="equal jitter fixes a quarter of the delay instead of half: a task may come back sooner than half its step"
  SUITE="--test policy equal_jitter"
  edit src/policy/backoff.rs <<'EOF'
                let fixed = base / 2;
@@@@
                let fixed = base / 4;
EOF
}

m74() {
  WHERE="policy/backoff.rs: BackoffSettings::new"
  MUTANT="a factor between 0 and 1 (a shrinking backoff) is accepted"
  SUITE="--test policy invalid_settings"
  edit src/policy/backoff.rs <<'EOF'
        if factor < 1.0 {
@@@@
        if factor <= 0.0 {
EOF
}

m75() {
  WHERE="runtime/events.rs: DEFAULT_EVENT_CAPACITY"
  MUTANT="the default event capacity is 1,000, not the documented 1,024"
  SUITE="--test events the_default_capacity"
  edit src/runtime/events.rs <<'EOF'
pub(crate) const DEFAULT_EVENT_CAPACITY: usize = 1024;
@@@@
pub(crate) const DEFAULT_EVENT_CAPACITY: usize = 1000;
EOF
}

m76() {
  WHERE="cluster/worker/mod.rs: Worker::shutdown"
  MUTANT="a clean shutdown does not revoke the lease (it is left to expire after its TTL)"
  SUITE="--all-features --test cluster_promises a_clean_shutdown"
  edit src/cluster/worker/mod.rs <<'EOF'
        let revoked = within(
            self.inner.op_timeout,
            "lease revoke",
            self.inner.coord.revoke(self.inner.lease),
        )
        .await;
@@@@
        let revoked: Result<(), ClusterError> = Ok(());
EOF
}

m77() {
  WHERE="cluster/worker/reconcile/mod.rs: Reconciler::wind_down"
  MUTANT="a clean shutdown withdraws the owner keys but leaves the reports"
  SUITE="--all-features --test cluster_promises a_clean_shutdown"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
                let ops = vec![
                    Op::Delete {
                        key: inner.keys.observed(&task),
                    },
                    Op::Delete {
                        key: inner.keys.owner(&task),
                    },
                ];
                // The semaphore is never closed.
@@@@
                let ops = vec![Op::Delete {
                    key: inner.keys.owner(&task),
                }];
                // The semaphore is never closed.
EOF
}

m78() {
  WHERE="cluster/controller.rs: TaskStatus::current_observed"
  MUTANT="a report counts when its writer is the owner key's worker, whatever its token: an earlier incarnation's report answers"
  SUITE="--all-features --test cluster_promises only_the_current_owners_report"
  edit src/cluster/controller.rs <<'EOF'
                (observed.owner == *owner && observed.owner_revision == rev).then_some(observed)
@@@@
                (observed.owner == *owner).then_some(observed)
EOF
}

m79() {
  WHERE="cluster/controller.rs: TaskStatus::current_observed"
  MUTANT="with no owner key, any report stands (a vanished owner's Paused or Running included)"
  SUITE="--all-features --test cluster_promises only_the_current_owners_report"
  edit src/cluster/controller.rs <<'EOF'
            _ => observed.stage.is_terminal().then_some(observed),
@@@@
            _ => Some(observed),
EOF
}

m80() {
  WHERE="cluster/controller.rs: Controller::create"
  MUTANT="a task is created without comparing that its keys are absent: creating it again overwrites its spec and desired stage"
  SUITE="--all-features --test cluster_promises creating_an_existing_task"
  edit src/cluster/controller.rs <<'EOF'
            when: vec![
                Compare::Absent(self.keys.spec(&task)),
                Compare::Absent(self.keys.desired(&task)),
            ],
@@@@
            when: vec![],
EOF
}

m81() {
  WHERE="runtime/group.rs: GroupReport::all_reached"
  MUTANT="a report says every task reached the stage when any one did"
  SUITE="--test group pause_all_names"
  edit src/runtime/group.rs <<'EOF'
        self.tasks
            .iter()
            .all(|t| matches!(t.result, Ok(s) if s == stage))
@@@@
        self.tasks
            .iter()
            .any(|t| matches!(t.result, Ok(s) if s == stage))
EOF
}

# Defects found from outside (issue 20), each with the mutant of its class.

m82() {
  WHERE="lifecycle/mod.rs: Lifecycle::subscribe_changes"
  MUTANT="a reader made on a terminal task starts at the current change without looking at the stage (its stream never ends)"
  SUITE="--test events a_stream_made_on_a_terminal_task"
  edit src/lifecycle/mod.rs <<'EOF'
        if state.stage.is_terminal() {
            return (state.seq, true);
        }
@@@@
        // (the stage is not looked at)
EOF
}

m83() {
  WHERE="runtime/shared.rs: Tokio::spawn_closes"
  MUTANT="a stop's closes run in the caller of the command (stop_now, stop_all, the last handle's drop), not on the blocking pool"
  SUITE="--test group closes"
  edit src/runtime/shared.rs <<'EOF'
        drop(
            self.runtime
                .spawn_blocking(move || tracing::dispatcher::with_default(&dispatch, closes)),
        );
@@@@
        tracing::dispatcher::with_default(&dispatch, closes);
EOF
}

m84() {
  WHERE="runtime/builder.rs: timers_enabled"
  MUTANT="spawn takes any runtime for one with timers (a later command panics inside tokio)"
  SUITE="--test runtime spawn_on_a_runtime_without_timers"
  edit src/runtime/builder.rs <<'EOF'
    std::panic::catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok()
@@@@
    true
EOF
}

m85() {
  WHERE="cluster/worker/mod.rs: Drop for Worker"
  MUTANT="dropping a worker ends its loops (the lease guard with them) without stopping its runs first"
  SUITE="--all-features --test cluster_prop dropping_a_worker"
  edit src/cluster/worker/mod.rs <<'EOF'
        self.shutdown.cancel();
        for handle in self.inner.handles() {
            handle.stop_aborting();
        }
        if let Some(task) = self.reconcile.take() {
@@@@
        self.shutdown.cancel();
        drop(self.inner.handles());
        if let Some(task) = self.reconcile.take() {
EOF
}

m86() {
  WHERE="cluster/keys.rs: Keys::worker"
  MUTANT="every incarnation of a worker id shares one membership key (the last to join moves it under its lease)"
  SUITE="--all-features --test cluster_prop a_worker_id_stays_listed"
  edit src/cluster/keys.rs <<'EOF'
        format!("{}/workers/{}", self.prefix, owner_value(worker, lease))
@@@@
        format!("{}/workers/{}", self.prefix, owner_value(worker, 0))
EOF
}

m87() {
  WHERE="cluster/etcd.rs: EtcdCoordinator::call"
  MUTANT="an Unreachable names only the last member's failure"
  SUITE="--all-features --test cluster_etcd an_unreachable_etcd"
  edit src/cluster/etcd.rs "async fn call<T, F, Fut>" <<'EOF'
            detail: failures.join("; "),
@@@@
            detail: failures.pop().unwrap_or_default(),
EOF
}

m88() {
  WHERE="runtime/shared.rs: Tokio::spawn_closes"
  MUTANT="a stop's closes run without the caller's tracing dispatcher (a scoped subscriber loses the Stopped event)"
  SUITE="--test tracing"
  edit src/runtime/shared.rs <<'EOF'
        let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
@@@@
        let dispatch = tracing::Dispatch::none();
EOF
}

m89() {
  WHERE="cluster/controller.rs: Controller::set"
  MUTANT="a stop of a task already desired Stopped writes a new desired revision (a worker rebuilds the released task to answer it)"
  SUITE="--all-features --test cluster_prop a_second_stop"
  edit src/cluster/controller.rs <<'EOF'
            return Ok(Set {
                revision: status.desired_revision,
                before: status,
                watch,
            });
@@@@
            // (a new revision is written)
EOF
}

# ---- the command line (feature cli), metrics, the unit adapter

m90() {
  WHERE="bin/taskstage/error.rs: CliError::code"
  MUTANT="an unreachable store exits 1 (refused) instead of 3, so a script cannot tell it from a refusal"
  SUITE="--all-features --test cli"
  edit src/bin/taskstage/error.rs <<'EOF'
            CliError::Unreachable { .. } => UNREACHABLE,
@@@@
            CliError::Unreachable { .. } => REFUSED,
EOF
}

m91() {
  WHERE="bin/taskstage/render.rs: answered"
  MUTANT="every task shows as answering its desired stage, whatever its owner reported"
  SUITE="--all-features --test cli"
  edit src/bin/taskstage/render.rs <<'EOF'
    status.answers(status.desired_revision)
@@@@
    let _ = status;
    true
EOF
}

m92() {
  WHERE="bin/taskstage/main.rs: the tasks a command acts on"
  MUTANT="--all on a cluster with no task succeeds with nothing done, instead of a bad-input error"
  SUITE="--all-features --test cli"
  edit src/bin/taskstage/main.rs <<'EOF'
        if chosen.iter().all(|(_, plan)| *plan == Plan::Skip) {
@@@@
        if !chosen.is_empty() && chosen.iter().all(|(_, plan)| *plan == Plan::Skip) {
EOF
}

m93() {
  WHERE="bin/taskstage/args.rs: parse_duration"
  MUTANT="a timeout in minutes is read as seconds"
  SUITE="--all-features --bin taskstage durations"
  edit src/bin/taskstage/args.rs <<'EOF'
        "m" => number * 60.0,
@@@@
        "m" => number,
EOF
}

m94() {
  WHERE="runtime/metrics.rs: retired"
  MUTANT="a task that is gone stays counted in the taskstage_tasks gauge of its last stage"
  SUITE="--features metrics --test metrics"
  edit src/runtime/metrics.rs "pub(crate) fn retired" <<'EOF'
            self.handles[stage as usize].decrement(1.0);
@@@@
            self.handles[stage as usize].decrement(0.0);
EOF
}

m95() {
  WHERE="runtime/unit.rs: DynUnit for a Unit"
  MUTANT="the object-safe adapter never calls the unit's own close()"
  SUITE="--test truth"
  edit src/runtime/unit.rs <<'EOF'
    fn close(&mut self) {
        Unit::close(self);
    }
@@@@
    fn close(&mut self) {}
EOF
}

m96() {
  WHERE="cluster/worker/view.rs: Entry::apply"
  MUTANT="the cache applies a change whatever its revision: a late or duplicated watch event undoes a newer one"
  SUITE="--features etcd --lib cluster::worker::view"
  edit src/cluster/worker/view.rs <<'EOF'
        if rev <= self.rev {
            return false;
        }
@@@@
        // (every change applied)
EOF
}

m97() {
  WHERE="cluster/worker/view.rs: View::feed, Listed"
  MUTANT="a listing after a lost watch adds what it finds but never removes what was deleted meanwhile"
  SUITE="--features etcd --lib cluster::worker::view"
  edit src/cluster/worker/view.rs <<'EOF'
                for key in gone {
                    self.apply(prefix, key, None, revision, &mut changes);
                }
@@@@
                let _ = gone;
EOF
}

m98() {
  WHERE="cluster/worker/queue.rs: WorkQueue::add"
  MUTANT="a task named while its action is in flight is queued at once: two actions of one task overlap"
  SUITE="--features etcd --lib cluster::worker::queue"
  edit src/cluster/worker/queue.rs <<'EOF'
        if self.in_flight.contains(&key) {
            self.again.insert(key);
        } else if self.queued.insert(key.clone()) {
@@@@
        if self.queued.insert(key.clone()) {
EOF
}

m99() {
  WHERE="cluster/worker/handover.rs: share"
  MUTANT="the remainder goes to every member (<= for <): the shares add up to more than the tasks and one worker never hands over"
  SUITE="--features etcd --lib cluster::worker::handover"
  edit src/cluster/worker/handover.rs <<'EOF'
    base + usize::from(index < tasks % count)
@@@@
    base + usize::from(index <= tasks % count)
EOF
}

m100() {
  WHERE="cluster/decide.rs: decide, hand-over"
  MUTANT="a task being handed over is released while its run may still be alive (Pausing)"
  SUITE="--features etcd --lib cluster::decide"
  edit src/cluster/decide.rs <<'EOF'
    let at_rest = matches!(local.stage, Stage::New | Stage::Paused);
@@@@
    let at_rest = matches!(local.stage, Stage::New | Stage::Paused | Stage::Pausing);
EOF
}

m101() {
  WHERE="cluster/keys.rs: Keys::checkpoints"
  MUTANT="checkpoints go back under the watched tasks/ prefix: every unit's write wakes every worker"
  SUITE="--features etcd --lib cluster::keys"
  edit src/cluster/keys.rs <<'EOF'
        format!("{}/checkpoints/{}/", self.prefix, task)
@@@@
        format!("{}/tasks/{}/checkpoint/", self.prefix, task)
EOF
}

m102() {
  WHERE="cluster/controller.rs: Controller::apply"
  MUTANT="the wait for an answer ignores watched owner changes: a report of an owner that has since lost the task answers"
  SUITE="--features etcd --lib cluster::controller"
  edit src/cluster/controller.rs <<'EOF'
            status.owner = owner.as_ref().map(|(w, _, _)| w.clone());
            status.owner_revision = owner.as_ref().map(|(_, r, _)| *r);
@@@@
            let _ = &owner;
EOF
}

m103() {
  WHERE="lifecycle/driver.rs: ExitGuard::drop"
  MUTANT="a start dropped unpolled (a spawn on a runtime that has shut down) loses its unit, which a later stop can no longer close"
  SUITE="--test runtime a_resume_after_the_runtime_shut_down"
  edit src/lifecycle/driver.rs <<'EOF'
            let held = self.held.take();
@@@@
            let held = self.held.take().and(None);
EOF
}

m104() {
  WHERE="cluster/worker/reconcile/execute.rs: Reconciler::claim"
  MUTANT="a claim compares the owner key alone, not the desired stage and report it was decided from: a late claim runs a task stopped meanwhile"
  SUITE="--all-features --test cluster_prop a_late_claim_never_runs"
  edit src/cluster/worker/reconcile/execute.rs <<'EOF'
                Compare::ModRevision(inner.keys.desired(task), desired_rev),
                Compare::ModRevision(inner.keys.observed(task), observed_rev),
@@@@
                // (no compare of what the claim was decided from)
EOF
}



m105() {
  WHERE="cluster/coord.rs: WatchEvent::revision"
  MUTANT="a watched deletion reports revision 0: the cache, which keeps the newest change of each key, ignores every deletion"
  SUITE="--features etcd --lib cluster::worker::view"
  edit src/cluster/coord.rs <<'EOF'
            WatchEvent::Delete { revision, .. } => *revision,
@@@@
            WatchEvent::Delete { .. } => 0,
EOF
}

m106() {
  WHERE="cluster/decide.rs: gather, hand_over"
  MUTANT="a task whose release was sent is resumed when its hand-over is given up: the release, its answer lost, lands late and another worker runs the task beside it"
  SUITE="--all-features --test cluster_promises a_hand_over_whose_release_was_sent"
  edit src/cluster/decide.rs <<'EOF'
            s.releasing
                || (s.rest.is_some()
@@@@
            (s.rest.is_some()
EOF
}

m107() {
  WHERE="cluster/worker/reconcile/complete.rs: Reconciler::confirmed"
  MUTANT="a key the store refused to confirm is adopted all the same: a cache that lags behind a lost release's answer runs the task beside its new owner"
  SUITE="--all-features --test cluster_promises a_key_the_store_refuses_to_confirm"
  edit src/cluster/worker/reconcile/complete.rs <<'EOF'
                self.dead.insert(task.clone(), token.revision);
                Next::OnChange // the watch shows whose it is
@@@@
                self.inner.view().insert(
                    task.clone(),
                    Held {
                        token: token.clone(),
                        handle: None,
                    },
                );
                self.slots.insert(task.clone(), Slot { token, task: None });
                Next::Now
EOF
}

m108() {
  WHERE="cluster/worker/keeper.rs: Keeper::start"
  MUTANT="the lease (and the worker's own store I/O) is kept on the joining runtime whatever was asked: units that block that runtime delay every keep-alive and the lease is lost"
  SUITE="--all-features --test cluster_overrun units_blocking_every_runtime_thread_cost_no_lease"
  edit src/cluster/worker/keeper.rs <<'EOF'
        match keeping {
            LeaseKeeping::SharedRuntime => Ok(Prepared {
@@@@
        let _ = keeping;
        match LeaseKeeping::SharedRuntime {
            LeaseKeeping::SharedRuntime => Ok(Prepared {
EOF
}

m110() {
  WHERE="cluster/worker/guard.rs: overrun"
  MUTANT="the default overrun policy only logs: a run that cannot be stopped outlives the lease"
  SUITE="--all-features --test cluster_overrun a_run_that_cannot_be_stopped"
  edit src/cluster/worker/guard.rs <<'EOF'
            std::process::exit(OVERRUN_EXIT_CODE);
@@@@
            let _ = OVERRUN_EXIT_CODE;
EOF
}

m111() {
  WHERE="cluster/worker/guard.rs: guard"
  MUTANT="past exit_at the guard stops runs again but does not check that they are gone: the overrun policy never acts while the worker runs"
  SUITE="--all-features --test cluster_overrun a_run_that_cannot_be_stopped"
  edit src/cluster/worker/guard.rs <<'EOF'
            if !alive.is_empty() {
                overrun(&inner, &alive);
@@@@
            if alive.is_empty() {
                overrun(&inner, &alive);
EOF
}

m112() {
  WHERE="cluster/worker/guard.rs: stop_the_rest"
  MUTANT="at the deadline the guard stops only Running tasks: New, Paused, Pausing and Resuming are left to the reconcile loop, which a blocking factory may hold up"
  SUITE="--all-features --test cluster_overrun the_guard_stops_every_stage"
  edit src/cluster/worker/guard.rs <<'EOF'
            decide::must_fence(stage) && stage != Stage::Stopping
@@@@
            stage == Stage::Running
EOF
}

m113() {
  WHERE="cluster/worker/mod.rs: WorkerBuilder::check"
  MUTANT="an overrun margin as large as the stop bound or larger is accepted: the overrun policy would act before a stop had its time"
  SUITE="--all-features --test cluster_overrun an_overrun_margin"
  edit src/cluster/worker/mod.rs <<'EOF'
        if self.margin() >= self.stop_bound {
@@@@
        if self.margin() > self.stop_bound * 100 {
EOF
}

m114() {
  WHERE="cluster/worker/session.rs: Session::run"
  MUTANT="a keep-alive answer moves the deadline from when the answer came, not from when the keep-alive was sent"
  SUITE="--all-features --test cluster_promises the_lease_deadline_counts_from"
  edit src/cluster/worker/session.rs <<'EOF'
                        decide::stop_at(sent, ttl_ms, timing.rho_permille, timing.stop_bound_ms);
@@@@
                        decide::stop_at(inner.now_ms(), ttl_ms, timing.rho_permille, timing.stop_bound_ms);
EOF
}

m115() {
  WHERE="cluster/worker/mod.rs: Worker::shutdown"
  MUTANT="a clean shutdown revokes the lease without waiting for the runs it stopped: another worker may start a task whose run is still alive here"
  SUITE="--all-features --test cluster_overrun a_shutdown_revokes_the_lease_only"
  edit src/cluster/worker/mod.rs <<'EOF'
        if let Some(keeper) = self.keeper.take() {
            keeper.ended().await;
        }
        if self.inner.runs_may_be_alive() {
@@@@
        drop(self.keeper.take());
        if self.inner.lease < 0 {
EOF
}

m116() {
  WHERE="cluster/worker/reconcile/execute.rs: Reconciler::build_task"
  MUTANT="a built task is not decided about again: it waits in New for an unrelated wake-up (a keep-alive, a resync) before it runs"
  SUITE="--all-features --test cluster_promises a_built_task_is_decided_at_once"
  edit src/cluster/worker/reconcile/execute.rs <<'EOF'
                self.queue.add(task.clone());
            }
@@@@
            }
EOF
}

m117() {
  WHERE="cluster/worker/reconcile/mod.rs: Reconciler::forget"
  MUTANT="what was sent about a task is forgotten with its local run: rebuilt under the same token after a fence, it runs again though its release, answer lost, may still land"
  SUITE="--all-features --test cluster_promises what_was_sent_under_a_token"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
        self.slots.remove(task);
        self.inner.view().remove(task);
@@@@
        self.slots.remove(task);
        self.sent.remove(task);
        self.inner.view().remove(task);
EOF
}

m118() {
  WHERE="cluster/worker/view.rs: reflect"
  MUTANT="a listing that missed its deadline is tried again with the same deadline: one that never fits leaves the cache blind for good"
  SUITE="--all-features --test cluster_promises a_listing_slower_than_the_call_deadline"
  edit src/cluster/worker/view.rs <<'EOF'
                list_deadline = (list_deadline * 2).min(op_timeout * LIST_DEADLINE_GROWTH);
@@@@
                let _ = LIST_DEADLINE_GROWTH;
EOF
}

m119() {
  WHERE="cluster/history.rs: History::check"
  MUTANT="an answer below the highest revision seen is taken as it is: after a restore the worker goes on deciding from the world before it"
  SUITE="--all-features --test cluster_promises a_store_restored_with_its_revision_going_back"
  edit src/cluster/history.rs <<'EOF'
        if found < floor {
@@@@
        if found < floor - i64::MAX / 2 {
EOF
}

m120() {
  WHERE="cluster/worker/view.rs: View::feed, Listed"
  MUTANT="a listing whose key went back to an older write is applied as an older change and ignored: a restore with a revision bump goes unnoticed"
  SUITE="--all-features --test cluster_promises a_store_restored_with_a_revision_bump"
  edit src/cluster/worker/view.rs <<'EOF'
                    if rev < held && held <= revision && changes.replaced.is_none() {
@@@@
                    if rev < held && held <= revision && changes.replaced.is_some() {
EOF
}

m121() {
  WHERE="cluster/worker/reconcile/mod.rs: after_replaced"
  MUTANT="the store's revision is not moved past the highest seen: tasks claimed after the restore get fence tokens below ones handed out before"
  SUITE="--all-features --test cluster_promises a_store_restored_with_its_revision_going_back"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
        if reached > target {
@@@@
        if reached > 0 {
EOF
}

m122() {
  WHERE="cluster/worker/reconcile/mod.rs: after_replaced"
  MUTANT="a worker that noticed the restore ends at once: its next incarnation claims tasks that a worker which has not noticed yet still runs"
  SUITE="--all-features --test cluster_promises after_a_restore_no_task_is_claimed"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
    tokio::time::sleep_until(until).await;
@@@@
    let _ = until;
EOF
}

m123() {
  WHERE="cluster/worker/reconcile/mod.rs: reconcile"
  MUTANT="a worker registers as a member before it has listed: one that cannot list counts in the fair shares and is handed tasks it never runs"
  SUITE="--all-features --test cluster_promises a_worker_that_cannot_list_is_handed_no_tasks"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
        if !state.registered && state.view.is_known() && Instant::now() >= state.register_at {
@@@@
        if !state.registered && Instant::now() >= state.register_at {
EOF
}

m126() {
  WHERE="runtime/unit.rs: ProgressCell::set"
  MUTANT="a progress report wakes nobody: a wait on progress returns only when the stage next changes (never, for a unit that runs until stopped)"
  SUITE="--test newcomer"
  edit src/runtime/unit.rs <<'EOF'
        self.changed.notify_waiters();
@@@@
        let _ = &self.changed;
EOF
}

m127() {
  WHERE="runtime/handle.rs: Handle::resume_within"
  MUTANT="a resume in Pausing is refused at once instead of waiting for the pause to settle: a group's resume after a dropped pause leaves every task Paused"
  SUITE="--test newcomer"
  edit src/runtime/handle.rs <<'EOF'
            }) => {}
            done => return done.map(drop),
@@@@
            }) => return Err(Error::Refused { command: Command::Resume, stage: Stage::Pausing, reason: crate::error::Refusal::StillRunning }),
            done => return done.map(drop),
EOF
}

m128() {
  WHERE="runtime/builder.rs: TaskBuilder::config"
  MUTANT="a configuration given after units drops them (the old footgun): .unit(a).config(c).unit(b) spawns a one-unit pipeline"
  SUITE="--test newcomer"
  edit src/runtime/builder.rs <<'EOF'
            units: self
                .units
                .into_iter()
@@@@
            units: Vec::<Box<dyn DynUnit<()>>>::new()
                .into_iter()
EOF
}

m129() {
  WHERE="runtime/group.rs: TaskGroup::remove_ended"
  MUTANT="ended tasks are kept: a long-lived group grows for ever"
  SUITE="--test newcomer"
  edit src/runtime/group.rs <<'EOF'
        self.tasks.retain(|task| !task.stage().is_terminal());
@@@@
        self.tasks.retain(|task| !task.stage().is_terminal() || true);
EOF
}

m130() {
  WHERE="error.rs: RunError::downcast_ref"
  MUTANT="an error that went through ? is no longer reachable by its type: a classifier cannot tell a blip from a fault"
  SUITE="--test newcomer"
  edit src/error.rs <<'EOF'
        self.inner.downcast_ref::<E>()
@@@@
        self.inner.downcast_ref::<E>().filter(|_| false)
EOF
}

m131() {
  WHERE="lifecycle/driver.rs: Driver::new"
  MUTANT="waiters judge a change as soon as the core makes it, before the runtime told it: stop() returns Stopped while subscribe() and the gauges still say Stopping"
  SUITE="--test channels"
  edit src/lifecycle/driver.rs <<'EOF'
        core.defer_waiters();
@@@@
        let _ = &core;
EOF
}

m132() {
  WHERE="lifecycle/driver.rs: Driver::carry_out_at"
  MUTANT="the run is cancelled before the pause is told: its Paused is logged before the Pausing that led to it"
  SUITE="--test channels"
  edit src/lifecycle/driver.rs <<'EOF'
        if let Some(t) = &transition {
            this.runtime.published(t);
@@@@
        if let Some(handle) = &cancel {
            handle.cancel();
        }
        if let Some(t) = &transition {
            this.runtime.published(t);
EOF
}

m124() {
  WHERE="cluster/worker/handover.rs: MAX_HANDING_OVER"
  MUTANT="a worker above its share hands the whole excess over at once: a member that joins costs as many pauses at once as it takes tasks"
  SUITE="--all-features --test cluster_promises a_worker_hands_over_at_most_sixteen"
  edit src/cluster/worker/handover.rs <<'EOF'
pub(super) const MAX_HANDING_OVER: usize = 16;
@@@@
pub(super) const MAX_HANDING_OVER: usize = 64;
EOF
}

m125() {
  WHERE="cluster/worker/reconcile/mod.rs: Reconciler::update_wanting"
  MUTANT="every task with a desired stage counts in the fair shares, stopped ones too: workers hand over running tasks to even out tasks that want no owner"
  SUITE="--all-features --test cluster_promises stopped_tasks_do_not_count"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
            desired.is_some() && (record.owner.kv.is_some() || !settled(report, desired))
@@@@
            desired.is_some() || (record.owner.kv.is_some() || !settled(report, desired))
EOF
}

m133() {
  WHERE="cluster/worker/reconcile/execute.rs: Reconciler::build_task"
  MUTANT="a task the factory cannot build is released and claimed again at once, for the same desired revision: the factory is asked in a tight loop"
  SUITE="--all-features --test cluster_promises a_task_the_factory_cannot_build"
  edit src/cluster/worker/reconcile/execute.rs <<'EOF'
                    self.unbuildable.insert(task.clone(), rev);
@@@@
                    let _ = rev;
EOF
}

m134() {
  WHERE="cluster/controller.rs: TaskStatus::answers"
  MUTANT="a report for a later desired revision answers an earlier command: a pause overtaken by a resume returns the resume's Running"
  SUITE="--all-features --test cluster_promises a_report_for_a_later_desired_revision"
  edit src/cluster/controller.rs <<'EOF'
        self.desired_revision == revision
@@@@
        self.desired_revision >= revision
EOF
}

m135() {
  WHERE="cluster/memory.rs: State::changes_since"
  MUTANT="the in-memory store serves a watch from exactly the compaction revision, whose changes it no longer holds: the watcher misses them silently"
  SUITE="--all-features --test cluster_promises a_watch_from_exactly_the_compaction_revision"
  edit src/cluster/memory.rs <<'EOF'
        if from <= self.compacted {
@@@@
        if from < self.compacted {
EOF
}

m136() {
  WHERE="cluster/controller.rs: Controller::create"
  MUTANT="a spec of any size is sent to the store: one larger than it accepts fails there, or blinds the workers' listings"
  SUITE="--all-features --test cluster_promises a_spec_larger_than_the_store_accepts"
  edit src/cluster/controller.rs <<'EOF'
        if spec.len() > self.max_spec_bytes {
@@@@
        if spec.len() > usize::MAX - 1 {
EOF
}

m137() {
  WHERE="cluster/controller.rs: Controller::command"
  MUTANT="a command gives up at once when the store is unreachable or electing, though its deadline leaves time to try again"
  SUITE="--all-features --test cluster_promises a_command_rides_out_an_unreachable_store"
  edit src/cluster/controller.rs <<'EOF'
                ) if Instant::now() + pause < deadline =>
@@@@
                ) if Instant::now() + pause < deadline && pause.is_zero() =>
EOF
}

m138() {
  WHERE="bin/taskstage/error.rs: CliError::code"
  MUTANT="a conflict (another controller changed the desired stage meanwhile) exits 2, as bad input, though docs/cli.md says 1"
  SUITE="--all-features --bin taskstage a_conflict_is_refused"
  edit src/bin/taskstage/error.rs <<'EOF'
            | CliError::Listen { .. } => BAD_INPUT,
@@@@
            | CliError::Listen { .. }
            | CliError::Conflict { .. } => BAD_INPUT,
EOF
}

m139() {
  WHERE="cluster/worker/reconcile/mod.rs: Reconciler::wind_down"
  MUTANT="a clean shutdown leaves the membership only when its lease is revoked: the others' shares stay as they were, and they claim its tasks only after every run of it is gone"
  SUITE="--all-features --test cluster_promises a_clean_shutdown_hands_each_task_over"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
        if self.registered {
            let leave = Txn {
@@@@
        if self.registered && self.me.is_empty() {
            let leave = Txn {
EOF
}

m190() {
  WHERE="lifecycle/driver.rs: race"
  MUTANT="the work is polled before its interrupt: a check paused before its first poll runs its code once"
  SUITE="--all-features --test runtime a_check_paused_before_its_first_poll"
  edit src/lifecycle/driver.rs <<'EOF'
    poll_fn(move |cx| {
        if let Poll::Ready(interrupt) = interrupt.as_mut().poll(cx) {
@@@@
    poll_fn(move |cx| {
        if let Poll::Ready(done) = work.as_mut().poll(cx) {
            return Poll::Ready(Ended::Done(done));
        }
        if let Poll::Ready(interrupt) = interrupt.as_mut().poll(cx) {
EOF
}

m191() {
  WHERE="testing/runner.rs: Driver::end"
  MUTANT="ends_with_stop is ignored at the end of a schedule: a pipeline whose last unit runs until stopped overruns every schedule"
  SUITE="--all-features --lib testing::tests::a_pipeline_whose_last_unit_runs_until_stopped"
  edit src/testing/runner.rs <<'EOF'
            if snapshot.stage == Stage::Running {
@@@@
            if snapshot.stage == Stage::Running && !self.ends_with_stop {
EOF
}

m192() {
  WHERE="testing/runner.rs: Runner::run"
  MUTANT="no limit on the paused clock: a schedule that never ends is caught only by the real-time limit, as Hung, after it"
  SUITE="--all-features --lib testing::tests::a_pipeline_that_never_ends_fails_on_the_paused_clock"
  edit src/testing/runner.rs <<'EOF'
                        tokio::time::timeout(limit, case)
@@@@
                        tokio::time::timeout(limit * 1_000_000, case)
EOF
}

m193() {
  WHERE="testing/runner.rs: Runner::check"
  MUTANT="a schedule that hung is shrunk like any other: each shrink step waits out the real-time limit again"
  SUITE="--all-features --lib testing::tests::a_schedule_that_hangs_in_real_time"
  edit src/testing/runner.rs <<'EOF'
                .is_some_and(|f| matches!(f.violation, Violation::Hung(_)))
            {
                return Ok(());
            }
@@@@
                .is_some_and(|f| matches!(f.violation, Violation::Crashed(_)))
            {
                return Ok(());
            }
EOF
}

m140() {
  WHERE="http/local.rs: LocalTasks::command, pause and stop"
  MUTANT="the seed's bug over HTTP: a pause answers 200 Paused once accepted, without waiting for the run to return"
  SUITE="--features http --test http_api"
  edit src/http/local.rs <<'EOF'
                    match tokio::time::timeout_at(deadline, settling).await {
@@@@
                    match tokio::time::timeout_at(deadline, async {
                        drop(settling);
                        Ok::<Stage, Error>(Stage::Paused)
                    })
                    .await
                    {
EOF
}

m141() {
  WHERE="http/auth.rs: Auth::check"
  MUTANT="a read-only token may command: every method needs only the read scope"
  SUITE="--features http --test http_api"
  edit src/http/auth.rs <<'EOF'
        } else {
            Scope::Admin
        };
@@@@
        } else {
            Scope::Read
        };
EOF
}

m142() {
  WHERE="http/routes.rs: stream"
  MUTANT="a client that fell behind the ring is moved on silently: no gap marker"
  SUITE="--features http --test http_api"
  edit src/http/routes.rs <<'EOF'
            if batch.missed > 0 {
@@@@
            if batch.missed > u64::MAX / 2 {
EOF
}

m143() {
  WHERE="bin/taskstage/main.rs: serve"
  MUTANT="serve listens beyond loopback without a token"
  SUITE="--features cli,http --test http_serve"
  edit src/bin/taskstage/main.rs <<'EOF'
        if !listen.ip().is_loopback() {
@@@@
        if listen.ip().is_unspecified() && listen.port() == 1 {
EOF
}

m144() {
  WHERE="http/page/app.js: row"
  MUTANT="the page's buttons work whatever the token's scope"
  SUITE="--features http --test http_browser"
  edit src/http/page/app.js <<'EOF'
          b.disabled = state.scope !== "admin" || !!pending;
@@@@
          b.disabled = !!pending;
EOF
}

m194() {
  WHERE="lifecycle/driver.rs: run, the race's end"
  MUTANT="an aborted run is reported as cancelled: its outcome says it returned when asked, though its code was cut off wherever it was"
  SUITE="--all-features --test runtime an_aborted_run_says_so"
  edit src/lifecycle/driver.rs <<'EOF'
                Ended::Aborted => Exit::Aborted,
@@@@
                Ended::Aborted => Exit::Cancelled,
EOF
}

m195() {
  WHERE="http/hub.rs: Hub::read"
  MUTANT="a reader behind the ring is not told how many changes it missed: the stream skips them silently"
  SUITE="--features http --lib http::hub"
  edit src/http/hub.rs <<'EOF'
            (oldest, oldest - next)
@@@@
            (oldest, 0)
EOF
}

m196() {
  WHERE="http/page.rs: html"
  MUTANT="the page's style is not inlined: under a mount prefix it would be fetched from a URL that does not resolve"
  SUITE="--features http --test http_api the_status_page_is_served"
  edit src/http/page.rs <<'EOF'
HTML.replace("/*STYLE*/", CSS)
@@@@
HTML.replace("/*STYLE-NOT*/", CSS)
EOF
}

m197() {
  WHERE="http/cluster.rs: item_of"
  MUTANT="the cluster's task list names no fence token"
  SUITE="--all-features --test http_cluster"
  edit src/http/cluster.rs <<'EOF'
        token: status.owner_revision,
@@@@
        token: None,
EOF
}

m198() {
  WHERE="runtime: the outcome an abort records"
  MUTANT="an aborted run is recorded as Cancelled: nobody can tell an abort"
  SUITE="--all-features --test runtime an_aborted_run_says_so"
  edit src/lifecycle/mod.rs <<'EOF'
                state.outcome = Some(if aborted {
@@@@
                state.outcome = Some(if false {
EOF
}

m199() {
  WHERE="typestate.rs: TaskBuilder::spawn_typed_paused"
  MUTANT="the typed paused spawn starts the task: its owner says New while the check already runs"
  SUITE="--all-features --test typestate"
  edit src/typestate.rs <<'EOF'
        self.spawn_paused().map(Task::typed)
@@@@
        self.spawn().map(Task::typed)
EOF
}

m220() {
  WHERE="cluster/worker/reconcile/mod.rs: after_replaced"
  MUTANT="a worker that could not move the store's revision past what it saw ends anyway: its next incarnation claims under lower tokens"
  SUITE="--all-features --test cluster_promises"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
        rounds += 1;
@@@@
        rounds += 1;
        break;
EOF
}

m200() {
  WHERE="cluster/worker/view.rs: View::members"
  MUTANT="a drained member still counts in the fair shares: the other workers leave its share of the tasks unclaimed"
  SUITE="--all-features --test cluster_drain"
  edit src/cluster/worker/view.rs <<'EOF'
            .filter(|(_, e)| e.kv.as_ref().is_some_and(|kv| !is_draining(&kv.value)))
@@@@
            .filter(|(_, e)| e.kv.is_some())
EOF
}

m201() {
  WHERE="cluster/decide.rs: decide"
  MUTANT="a draining worker with room claims a task (decide, invariant 7)"
  SUITE="--all-features --lib cluster::decide"
  edit src/cluster/decide.rs <<'EOF'
            Ownership::Unowned if view.capacity_left && !view.settled && !view.draining => {
@@@@
            Ownership::Unowned if view.capacity_left && !view.settled => {
EOF
}

m202() {
  WHERE="cluster/decide.rs: decide"
  MUTANT="a drain keeps a task whose run failed: the drained worker never holds nothing"
  SUITE="--all-features --test cluster_drain"
  edit src/cluster/decide.rs <<'EOF'
        && (!local.failed || view.draining);
@@@@
        && !local.failed;
EOF
}

m203() {
  WHERE="cluster/worker/reconcile/mod.rs: Reconciler::step"
  MUTANT="the reconcile loop does not tell decide that the worker is draining: only the fair-share hand-over runs"
  SUITE="--all-features --test cluster_drain"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
            draining: self.draining,
@@@@
            draining: false,
EOF
}

m204() {
  WHERE="cluster/controller.rs: Controller::drain"
  MUTANT="the drain is written under no lease: the membership key outlives its worker"
  SUITE="--all-features --test cluster_drain"
  edit src/cluster/controller.rs "value: DRAINING.to_vec()," <<'EOF'
                        lease: Some(lease),
@@@@
                        lease: None,
EOF
}

m205() {
  WHERE="cluster/controller.rs: Controller::drain_within"
  MUTANT="a drain answers at once, while the worker still holds tasks and runs them"
  SUITE="--all-features --test http_cluster a_drain_over_http"
  edit src/cluster/controller.rs <<'EOF'
            if held.is_empty() {
@@@@
            if held.len() < usize::MAX {
EOF
}

m206() {
  WHERE="http/cluster.rs: workers"
  MUTANT="GET /v1/workers shows no worker as draining"
  SUITE="--all-features --test http_cluster a_drain_over_http"
  edit src/http/cluster.rs <<'EOF'
                        "draining": w.draining,
@@@@
                        "draining": false,
EOF
}

m207() {
  WHERE="http/local.rs: LocalTasks::fresh"
  MUTANT="the cached listing is checked against the change counter only: a progress report is not in the next listing"
  SUITE="--features http --test http_api a_change_is_in_the_next_listing"
  edit src/http/local.rs <<'EOF'
                .all(|(entry, key)| key_of(entry) == *key);
@@@@
                .all(|(entry, key)| key_of(entry).0 == key.0);
EOF
}

m208() {
  WHERE="http/local.rs: LocalTasks::fresh"
  MUTANT="the cached listing ignores the change counter: a stage a command returned is served stale until its event reaches the API"
  SUITE="--features http --test http_api a_change_is_in_the_next_listing"
  edit src/http/local.rs <<'EOF'
                .all(|(entry, key)| key_of(entry) == *key);
@@@@
                .all(|(entry, key)| (key_of(entry).1, key_of(entry).2) == (key.1, key.2));
EOF
}

m209() {
  WHERE="http/cluster.rs: apply"
  MUTANT="a cluster's listing keeps the old text of a task that changed"
  SUITE="--all-features --test http_cluster a_change_on_the_stream"
  edit src/http/cluster.rs <<'EOF'
        if before == Some(&item) {
@@@@
        if before.is_some() {
EOF
}

m221() {
  WHERE="cluster/worker/reconcile/execute.rs: Reconciler::release, Hand"
  MUTANT="a hand-over releases the key without the report of its rest: the old owner's report of a live run stands with no owner"
  SUITE="--all-features --test cluster_handover"
  edit src/cluster/worker/reconcile/execute.rs <<'EOF'
        if let Some((observed, value)) = &rest {
@@@@
        if let Some((observed, value)) = rest.as_ref().filter(|_| false) {
EOF
}

m222() {
  WHERE="cluster/decide.rs: decide, hand-over"
  MUTANT="a hand-over publishes its Pausing again: one more store write between the old run's end and the new one's start"
  SUITE="--all-features --lib cluster::decide"
  edit src/cluster/decide.rs <<'EOF'
            Stage::Pausing if handing_over => None,
@@@@
            Stage::Pausing if handing_over => Some(Action::Publish(report)),
EOF
}

m223() {
  WHERE="http/listing.rs: Listing::reusing"
  MUTANT="a new listing serializes every item again, the text of the unchanged ones included"
  SUITE="--features http --lib http::listing"
  edit src/http/listing.rs <<'EOF'
            match reuse(i) {
@@@@
            match reuse(i).filter(|_| false) {
EOF
}

m224() {
  WHERE="http/listing.rs: Listing::page"
  MUTANT="a page of consecutive items starts one item after its offset"
  SUITE="--features http --test http_api the_list_filters_pages"
  edit src/http/listing.rs <<'EOF'
                    self.bounds.get(first),
@@@@
                    self.bounds.get(first + 1),
EOF
}

m225() {
  WHERE="outcome.rs: Outcome::error"
  MUTANT="a failed run's outcome carries no error: the worker's report never matches what it reads back, and it publishes in a loop"
  SUITE="--all-features --test cluster_promises a_failed_run"
  edit src/outcome.rs <<'EOF'
            Outcome::Failed(error) => Some(error),
@@@@
            Outcome::Failed(_) => None,
EOF
}

m226() {
  WHERE="cluster/decide.rs: decide, drain"
  MUTANT="a draining worker hands a task over while its run may still be alive (Pausing)"
  SUITE="--all-features --test cluster_model drains"
  edit src/cluster/decide.rs <<'EOF'
    let at_rest = matches!(local.stage, Stage::New | Stage::Paused);
@@@@
    let at_rest = matches!(local.stage, Stage::New | Stage::Paused) || view.draining;
EOF
}

m227() {
  WHERE="runtime/metrics.rs: TaskGauges::moved"
  MUTANT="a change moves the tasks gauges of the recorder current on the thread that makes it, not of the one the task was counted in at its spawn"
  SUITE="--features metrics --test gauges"
  edit src/runtime/metrics.rs "pub(crate) fn moved" <<'EOF'
            self.handles[to as usize].increment(1.0);
            self.handles[from as usize].decrement(1.0);
@@@@
            metrics::gauge!(names::TASKS, "stage" => to.name()).increment(1.0);
            metrics::gauge!(names::TASKS, "stage" => from.name()).decrement(1.0);
EOF
}

m228() {
  WHERE="runtime/handle.rs: Handle::resume_within"
  MUTANT="the wait ends only in Paused: a pause that ended in Finished or Stopped is met with a timeout, not the refusal naming the stage"
  SUITE="--test newcomer resume_within"
  edit src/runtime/handle.rs "pub async fn resume_within" <<'EOF'
            .wait_until(|s: &Snapshot| s.stage != Stage::Pausing);
@@@@
            .wait_until(|s: &Snapshot| s.stage == Stage::Paused);
EOF
}

m229() {
  WHERE="http/routes.rs: router"
  MUTANT="the event stream of every task (GET /v1/events) is routed outside the token check"
  SUITE="--features http --test http_api event_streams_need"
  edit src/http/routes.rs <<'EOF'
        .route("/v1/events", get(all_events))
        .route("/v1/workers", get(workers))
        .route("/v1/workers/{id}/drain", post(drain))
        .route("/v1/auth", get(whoami))
        // Applies to the routes above only: unknown routes are 404 without a token.
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&shared),
            authorize,
        ))
        .route("/v1/health", get(health))
@@@@
        .route("/v1/workers", get(workers))
        .route("/v1/workers/{id}/drain", post(drain))
        .route("/v1/auth", get(whoami))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&shared),
            authorize,
        ))
        .route("/v1/events", get(all_events))
        .route("/v1/health", get(health))
EOF
}

m230() {
  WHERE="http/cluster.rs: ClusterSource::drain"
  MUTANT="a drain whose wait ran out is answered 200 (done), with the count still held"
  SUITE="--all-features --test http_cluster drain"
  edit src/http/cluster.rs <<'EOF'
                Err(ClusterError::DrainTimeout { held, .. }) => Ok(Reached::Settling(body(held))),
@@@@
                Err(ClusterError::DrainTimeout { held, .. }) => Ok(Reached::Done(body(held))),
EOF
}

m231() {
  WHERE="cluster/controller.rs: Controller::command"
  MUTANT="a command that meets a replaced history answers it at once instead of trying again within its deadline"
  SUITE="--all-features --test cluster_promises replaced_history_is_tried"
  edit src/cluster/controller.rs "async fn command" <<'EOF'
                    error @ (ClusterError::Unreachable { .. }
                    | ClusterError::HistoryReplaced { .. }),
@@@@
                    error @ ClusterError::Unreachable { .. },
EOF
}

m232() {
  WHERE="cluster/worker/reconcile/mod.rs: reconcile, the loop's end"
  MUTANT="on a lost lease the loop ends (and closed() answers) before its local runs are gone"
  SUITE="--all-features --test cluster_promises ends_only_once"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
        if lease.stop_at.is_none() && state.slots.values().all(|s| s.task.is_none()) {
@@@@
        if lease.stop_at.is_none() {
EOF
}

m233() {
  WHERE="cluster/worker/guard.rs: watch_what_is_left"
  MUTANT="after a shutdown, a crash or a drop, a run still alive at the last instant the lease allows is let be (no overrun)"
  SUITE="--all-features --test cluster_overrun in_time"
  edit src/cluster/worker/guard.rs "async fn watch_what_is_left" <<'EOF'
        if now >= exit_at {
            overrun(inner, &alive);
            return;
        }
@@@@
        if now >= exit_at {
            return;
        }
EOF
}

m234() {
  WHERE="http/origin.rs: Browsers::check, Origin"
  MUTANT="a command carrying the Origin of another page is taken as the server's own"
  SUITE="--features http --test http_api open_api"
  edit src/http/origin.rs <<'EOF'
                if !same && !self.origins.contains(&origin) {
@@@@
                if !same && !self.origins.contains(&origin) && origin == "null" {
EOF
}

m235() {
  WHERE="http/origin.rs: Browsers::check, Host"
  MUTANT="with no token, a Host that is not a loopback name is served (a rebound name reads the list)"
  SUITE="--features http --test http_api open_api"
  edit src/http/origin.rs <<'EOF'
                if !is_loopback_host(host) && !self.allows_host(host) {
@@@@
                if !is_loopback_host(host) && !self.allows_host(host) && method != Method::GET {
EOF
}

m236() {
  WHERE="http/routes.rs: create"
  MUTANT="POST /v1/tasks parses a body of any content type as JSON (a form can create a task)"
  SUITE="--all-features --test http_cluster only_once_the_owners"
  edit src/http/routes.rs <<'EOF'
    if !json {
@@@@
    if false && !json {
EOF
}

m237() {
  WHERE="bin/taskstage/main.rs: serve"
  MUTANT="serve with no token given serves open, as --no-token does"
  SUITE="--all-features --test cli serve_needs"
  edit src/bin/taskstage/main.rs "async fn serve" <<'EOF'
        if no_token {
@@@@
        if no_token || admin.is_none() {
EOF
}

m238() {
  WHERE="bin/taskstage/serve.rs: serve, the connection limit"
  MUTANT="at the limit a new connection is closed even when an idle one could make room (idle connections keep every request out)"
  SUITE="--all-features --bin taskstage serve::"
  edit src/bin/taskstage/serve.rs <<'EOF'
                    .find(|(_, o)| o.in_flight.load(Ordering::SeqCst) == 0)
@@@@
                    .find(|(_, o)| o.in_flight.load(Ordering::SeqCst) == usize::MAX)
EOF
}

m239() {
  WHERE="bin/taskstage/serve.rs: serve, the header read"
  MUTANT="a request's head, or the next one on an idle connection, may take hyper's default 30 s"
  SUITE="--all-features --bin taskstage serve::"
  edit src/bin/taskstage/serve.rs <<'EOF'
                .header_read_timeout(limits.header_read)
@@@@
                .header_read_timeout(Duration::from_secs(30))
EOF
}

m240() {
  WHERE="cluster/worker/session.rs: Session::run, the stall check"
  MUTANT="a worker whose loop stopped turning keeps its lease, and its tasks, for ever"
  SUITE="--all-features --test cluster_promises a_worker_whose_loop_stalls"
  edit src/cluster/worker/session.rs <<'EOF'
            if stalled > timing.stall_bound_ms {
@@@@
            if stalled > timing.stall_bound_ms.saturating_mul(1000) {
EOF
}

m241() {
  WHERE="cluster/worker/reconcile/mod.rs: reconcile, the turn tick"
  MUTANT="a loop with nothing to learn of does not turn, and is taken for a stalled one"
  SUITE="--all-features --test cluster_promises a_quiet_loop_is_not_taken"
  edit src/cluster/worker/reconcile/mod.rs <<'EOF'
            _ = turn.tick() => {}
@@@@
            _ = std::future::pending::<()>() => {}
EOF
}

m242() {
  WHERE="cluster/worker/mod.rs: WorkerBuilder::check, the stall bound"
  MUTANT="a stall bound shorter than two store call deadlines is accepted"
  SUITE="--all-features --test cluster_overrun a_stall_bound_under"
  edit src/cluster/worker/mod.rs <<'EOF'
        if self.stall_bound < 2 * self.op_timeout {
@@@@
        if self.stall_bound < self.op_timeout / 2 {
EOF
}

m243() {
  WHERE="cluster/controller.rs: Controller::set, a command written without a read"
  MUTANT="a pause or resume written before its read replaces any desired stage"
  SUITE="--all-features --test cluster_promises a_command_written_without_a_read"
  edit src/cluster/controller.rs <<'EOF'
                    when: vec![Compare::Value(key.clone(), from.name().as_bytes().to_vec())],
@@@@
                    when: Vec::new(),
EOF
}

m244() {
  WHERE="cluster/controller.rs: Controller::set, the read after a write"
  MUTANT="the status is read before the command's watch is open"
  SUITE="--all-features --test cluster_promises a_pause_reads_after_its_watch_is_open"
  edit src/cluster/controller.rs <<'EOF'
                let (watch, written) = tokio::join!(
                    watching,
                    within(self.op_timeout, "set desired", self.coord.txn(txn))
                );
                let (watch, written) = (watch.ok(), written?);
                // The watch was open before this read: the read and the watch
                // together miss no change after the write.
                let status = self.status_of(&task).await?;
@@@@
                let written = within(self.op_timeout, "set desired", self.coord.txn(txn)).await?;
                let status = self.status_of(&task).await?;
                let watch = watching.await.ok();
EOF
}

m245() {
  WHERE="http/auth.rs: bearer_token, the scheme's case"
  MUTANT="the Bearer scheme is matched case-sensitively"
  SUITE="--features http --test http_api the_bearer_scheme"
  edit src/http/auth.rs <<'EOF'
        .eq_ignore_ascii_case(b"Bearer")
@@@@
        .eq(b"Bearer")
EOF
}

m246() {
  WHERE="http/routes.rs: forbid_framing"
  MUTANT="answers no longer forbid framing"
  SUITE="--features http --test http_api every_answer_forbids_framing"
  edit src/http/routes.rs <<'EOF'
    forbid_framing(response.headers_mut());
@@@@
    let _ = response.headers_mut();
EOF
}

m247() {
  WHERE="http/routes.rs: health, a caller without a token"
  MUTANT="health repeats the store's error text to anyone"
  SUITE="--all-features --test http_cluster health_without_a_token"
  edit src/http/routes.rs <<'EOF'
    let detailed = shared.auth.scope_of(&headers).is_ok();
@@@@
    let detailed = shared.auth.scope_of(&headers).is_ok() || !headers.is_empty() || headers.is_empty();
EOF
}

m248() {
  WHERE="cluster/decide.rs: gather, hand_over (the model runs the worker's own gathering)"
  MUTANT="what was sent about a task no longer commits its hand-over: a task whose release or rest report was sent is resumed when the hand-over is given up"
  SUITE="--all-features --test cluster_model hand_overs_keep_every_property"
  edit src/cluster/decide.rs <<'EOF'
            hand_over: known.picked_to_hand_over || committed,
@@@@
            hand_over: known.picked_to_hand_over,
EOF
}

m249() {
  WHERE="cluster/decide.rs: gather, published (the model runs the worker's own gathering)"
  MUTANT="a report this worker published under an earlier token is taken as published under the current one, so the current run's report is never written"
  SUITE="--all-features --test cluster_model the_protocol_keeps_every_property"
  edit src/cluster/decide.rs <<'EOF'
        .filter(|o| o.ours && Some(o.owner_revision) == token)
@@@@
        .filter(|o| o.ours)
EOF
}

ALL=$(declare -F | awk '$3 ~ /^m[0-9]+$/ { print substr($3, 2) }' | sort -n | tr '\n' ' ')
SELECTED=${MUTANTS:-$ALL}
for n in $SELECTED; do
  if ! declare -F "m$n" >/dev/null; then
    echo "mutation-check: no mutant $n (there are: $ALL)" >&2
    exit 2
  fi
done

# ---------------------------------------------------------------- baseline

declare -A NEEDED=()
for n in $SELECTED; do
  APPLY=0 "m$n"
  NEEDED["$SUITE"]=1
done

started=$(date +%s)
if [[ ${BASELINE:-1} != 0 ]]; then
  for suite in "${!NEEDED[@]}"; do
    echo "baseline: $(suite_label "$suite")" >&2
    result=$(run_suite "$suite" "$LOG_DIR/baseline-${suite//[^A-Za-z0-9_]/_}.log")
    if [[ $result != PASS ]]; then
      echo "mutation-check: $(suite_label "$suite") does not pass on the unmutated tree ($result); see $LOG_DIR" >&2
      exit 2
    fi
  done
fi

# ---------------------------------------------------------------- the run

failed=0
rows=()
for n in $SELECTED; do
  APPLY=0 "m$n"
  label=$(suite_label "$SUITE")
  log="$LOG_DIR/mutant-$n.log"
  t0=$(date +%s)
  if ! (APPLY=1 "m$n") 2>"$log"; then
    result="NOT APPLIED (stale mutant: $(tail -n1 "$log"))"
    failed=1
    MUTATED=$(git diff --name-only | head -n1)
  else
    MUTATED=$(git diff --name-only | head -n1)
    case $(run_suite "$SUITE" "$log") in
      PASS) result="**SURVIVED**"; failed=1 ;;
      FAIL)
        why=$(failures "$log")
        result="CAUGHT${why:+ ($why)}" ;;
      HUNG) result="CAUGHT (the suite hung; killed after ${SUITE_TIMEOUT} s)" ;;
      BUILD-FAILED) result="BUILD FAILED (the mutant does not compile)"; failed=1 ;;
      NO-TESTS) result="NO TESTS RAN (the suite's filter matches nothing)"; failed=1 ;;
    esac
  fi
  restore
  echo "mutant $n: $result ($(($(date +%s) - t0)) s)" >&2
  rows+=("| $n | $WHERE | $MUTANT | $label | $result |")
done

if ! git diff --quiet HEAD --; then
  echo "mutation-check: the tree is not clean after the run" >&2
  git status --short >&2
  failed=1
fi

echo "| # | where | mutant | caught by | result |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "Mutants run: $(wc -w <<<"$SELECTED"); wall time $(($(date +%s) - started)) s (baseline included); logs in $LOG_DIR"
exit "$failed"
