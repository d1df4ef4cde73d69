#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration, property, compile-fail, doc tests,
# the examples' own tests, the benchmarks in test mode, the testing kit's dogfood, the
# cluster's etcd integration, fault, hand-over and nemesis suites, the command line's
# tests, the cluster's scale run at 1,000 tasks under overload, and the loom models.
#
# On two cores the suites run side by side where they can (three lanes, below): the
# suites on the real clock at normal priority, the others and the loom models at a
# lower one, in the time the first leave the cores idle waiting on etcd's timers.
# Every suite runs; the script fails if any failed, after printing each one's output.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs protoc, etcd (and what the fault suite injects faults with) when missing,
# or fails saying what to install. The etcd tests start their own 3-member etcd on
# 127.0.0.1; under CI=true a missing tool fails them instead of skipping.
bash scripts/etcd-setup.sh
# Installs headless Chromium and chromedriver when missing, for the status page's
# browser test (crates/http/tests/http_browser.rs; under CI=true it fails without them).
bash scripts/browser-setup.sh

echo "== build every target of every crate with every feature (etcd, cluster, metrics, testing, http) =="
# One build for all of them: the features only add code, and each test file that
# needs one says so with `required-features`. Cargo's list of what it built is kept:
# the suites run from it below, as `cargo test` would run them, in its order. The
# loom models are built apart (below): without their cfg they are an empty crate.
# The examples are built as programs too (the scale run below runs one), with the
# same features, so that only they compile again.
built=$(mktemp)
{
  cargo test --workspace --exclude taskstage-loom-tests --all-targets --all-features --no-run \
    --message-format=json-render-diagnostics
  cargo build --workspace --exclude taskstage-loom-tests --all-features --examples \
    --message-format=json-render-diagnostics
} | python3 scripts/test-binaries.py >"$built"

# The suites split in three lanes that run side by side once everything is built.
#  - main, at normal priority: the suites that run on the real clock against etcd
#    and processes they start (their timers, leases and deadlines are real), then
#    the scale run under overload. Most of their time they wait on etcd's timers
#    and leave the cores idle; the two lanes below use that time.
#  - side, at a lower CPU priority (nice 5): the doc tests (every crate, every
#    feature), then every other suite: on tokio's paused clock or no clock at all
#    (the core, the runtime, the property tests, the compile-fail proofs, the
#    in-memory cluster's promises), whose verdicts do
#    not depend on how fast they run. They run their built binaries directly,
#    without cargo, as the main lane does.
#  - loom: the loom models, in a separate target dir (the cfg changes RUSTFLAGS,
#    which would otherwise force the normal build to be redone on the next run),
#    release mode, at the lowest CPU priority (nice 19: it has no clock to keep and
#    runs last of all, in what the others leave). Each model sets its own preemption bound
#    in code (two-party models: none, so they are exhaustive; three-party models: 3,
#    and their comments say why).
# Every suite runs; the script fails if any failed, after printing each lane's output.
#
# The suites of the main lane: every other one is the side lane's. The cluster's
# model checker (no clock: a search of every state, one core) runs here too, where
# it balances the two lanes (the side lane's compile-fail proofs build the crate's
# dependencies again); the suites of one lane run one at a time.
realtime=(
  crates/cli/tests/cli.rs
  crates/cluster/tests/cluster_model.rs
  crates/cluster/tests/cluster_etcd.rs
  crates/cluster/tests/cluster_faults.rs
  crates/cluster/tests/cluster_handover.rs
  crates/cluster/tests/cluster_nemesis.rs
  crates/cluster/tests/cluster_overrun.rs
  examples/tests/migrate_cluster.rs
  crates/http/tests/http_browser.rs
  crates/http/tests/http_etcd.rs
  crates/cli/tests/http_serve.rs
  crates/http/tests/http_soak.rs
)
main_list=$(mktemp)
side_list=$(mktemp)
cluster_scale=
while IFS=$'\t' read -r label exe dir; do
  if [[ $label == "example cluster_scale" ]]; then
    cluster_scale=$exe
  elif [[ $label == example\ * ]]; then
    continue
  elif [[ " ${realtime[*]} " == *" $label "* ]]; then
    printf '%s\t%s\t%s\n' "$label" "$exe" "$dir" >>"$main_list"
  else
    printf '%s\t%s\t%s\n' "$label" "$exe" "$dir" >>"$side_list"
  fi
done <"$built"
rm -f "$built"

# Runs each suite of a list as `cargo test` runs it: from its package's root, with
# the package's directory in CARGO_MANIFEST_DIR; prints each one's time; the names
# of those that failed go to the file named second.
run_list() {
  local list=$1 failures=$2 label exe dir began
  while IFS=$'\t' read -r label exe dir; do
    began=$SECONDS
    echo "     Running $label ($exe)"
    if ! (cd "$dir" && CARGO_MANIFEST_DIR=$dir "$exe"); then
      echo "$label" >>"$failures"
    fi
    echo "     ($label: $((SECONDS - began)) s)"
  done <"$list"
}

logs=$(mktemp -d)
touch "$logs/side.failed"
lanes=()
stop_lanes() {
  local pid
  for pid in "${lanes[@]}"; do
    kill -- "-$pid" 2>/dev/null || true
  done
}
trap stop_lanes EXIT
set -m
(
  # This lane and all it starts run at a lower priority than the main lane's, and
  # a higher one than the loom models'.
  renice -n 5 -p "$BASHPID" >/dev/null
  echo "== doc tests (every crate, every feature) =="
  cargo test --workspace --exclude taskstage-loom-tests --doc --all-features \
    || echo "doc tests" >>"$logs/side.failed"
  echo "== the suites on tokio's paused clock or none (every feature) =="
  run_list "$side_list" "$logs/side.failed"
) >"$logs/side" 2>&1 &
lanes+=($!)
(
  RUSTFLAGS="--cfg taskstage_loom" CARGO_TARGET_DIR=target/loom \
    nice -n 19 cargo test --release -p taskstage-loom-tests --test loom \
      -- --test-threads=1 --nocapture
) >"$logs/loom" 2>&1 &
lanes+=($!)
set +m
echo "== in the background: doc tests, the suites on the paused clock (the compile-fail proofs among them); loom models (output below, at the end) =="

failed=()
echo "== the suites on the real clock (every feature) =="
# Among them: the cluster's etcd tests, the fault suite (worker processes under
# SIGSTOP, kill -9, cuts to etcd, the etcd leader lost, two controllers racing, 100
# tasks, CPU overload, a restore from a backup; each merged history checked), the
# randomized nemesis (60 s, a fresh seed printed first; its unfenced control must
# fail the checker), the `taskstage` command (feature cli) run as a binary against
# etcd and worker processes, the migrate example's cluster mode at small scale, the
# status page in a real browser and the HTTP API under load.
touch "$logs/main.failed"
run_list "$main_list" "$logs/main.failed"
rm -f "$main_list"
while read -r label; do failed+=("$label"); done <"$logs/main.failed"

echo "== the scale run under overload: 1,000 tasks, 3 worker processes (examples/examples/cluster_scale.rs, debug) =="
# Built by the build above, and run from there: a `cargo run -p` would resolve the
# features of one package alone and build its dependencies again.
# With --overload the run is the cluster's nemesis for a busy machine: two CPU-bound
# processes per core beside it for the whole writes phase (children of the run,
# killed by pid when the phase ends or fails), one worker whose units block both of
# its runtime's threads (150 ms of every 2 s), and one worker frozen 90 ms of every
# 100 ms for two TTLs; a worker that ends itself on an overrun (status 75) is
# restarted under its id. The background lanes above run at a lower priority: if
# they still run, they wait for the hogs meanwhile. The run prints its figures last, with the lease losses,
# overrun exits and restarts; it fails only when a rule of the history checker broke
# (two runs of a task alive at once, a stale write accepted, among others), a worker
# exited otherwise, or a phase did not complete within its bound, never because a
# figure is slow. About 2.5 min in debug on two cores. Without etcd it fails (it
# never skips).
# Its hogs would starve the side lane, some of whose suites wait on the real clock
# with deadlines (a browser, an HTTP client): it has ended by now, or is waited for.
waited=$SECONDS
side_ok=1
wait "${lanes[0]}" || side_ok=0
echo "     (waited $((SECONDS - waited)) s for the side lane)"
began=$SECONDS
[[ -n $cluster_scale ]] || { echo "the build made no cluster_scale example" >&2; exit 1; }
"$cluster_scale" --tasks 1000 --workers 3 --overload \
  || failed+=("the scale run under overload (examples/examples/cluster_scale.rs)")
echo "     (the scale run: $((SECONDS - began)) s)"

((side_ok)) || failed+=("the side lane")
echo "== the side lane: doc tests, the suites on the paused clock (run beside the main lane) =="
cat "$logs/side"
waited=$SECONDS
wait "${lanes[1]}" || failed+=("loom models")
echo "== loom models (--cfg taskstage_loom, release; run beside the lanes above; waited $((SECONDS - waited)) s for them) =="
cat "$logs/loom"
while read -r label; do failed+=("$label"); done <"$logs/side.failed"
rm -f "$side_list"
lanes=()
rm -rf "$logs"

if ((${#failed[@]} > 0)); then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "every suite passed"
