#!/usr/bin/env bash
# Runs every test of the crate: unit, integration, property, compile-fail, doc tests,
# the examples' own tests, the benchmarks in test mode, the testing kit's dogfood, the
# cluster's etcd integration, fault, hand-over and nemesis suites, the command line's
# tests, the cluster's scale run at 1,000 tasks under overload, and the loom models.
#
# On two cores the suites run side by side where they can: once every test target is
# built, the loom models (their own cfg and target dir, release mode) build and run in
# the background, at a lower CPU priority, while the other suites run; most of those
# wait on etcd's timers and leave the cores idle. Every suite runs; the script fails if
# any failed, after printing each one's output.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs protoc, etcd (and what the fault suite injects faults with) when missing,
# or fails saying what to install. The etcd tests start their own 3-member etcd on
# 127.0.0.1; under CI=true a missing tool fails them instead of skipping.
bash scripts/etcd-setup.sh
# Installs headless Chromium and chromedriver when missing, for the status page's
# browser test (tests/http_browser.rs; under CI=true it fails without them).
bash scripts/browser-setup.sh

echo "== build every target with every feature (etcd, metrics, testing, cli, http) =="
# One build for all of them: the features only add code, and each test file that
# needs one says so with `required-features`. Cargo's list of what it built is kept:
# the suites run from it below, as `cargo test` would run them, in its order.
built=$(mktemp)
cargo test --all-targets --all-features --no-run --message-format=json-render-diagnostics \
  | python3 scripts/test-binaries.py >"$built"

# Two lanes run in the background, at a lower CPU priority, while the suites run:
# most of those wait on etcd's timers and leave the cores idle.
#  - side: the compile-fail proofs (default features: the saved errors are theirs),
#    then the doc tests (every feature). The suites below run their built binaries
#    directly, without cargo, so this lane's builds never wait for them.
#  - loom: the loom models, in a separate target dir (the cfg changes RUSTFLAGS,
#    which would otherwise force the normal build to be redone on the next run),
#    release mode. Each model sets its own preemption bound in code (two-party
#    models: none, so they are exhaustive; three-party models: 3, and their comments
#    say why).
logs=$(mktemp -d)
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
  set -e
  echo "== compile-fail proofs of the typestate API (default features: the saved errors are theirs) =="
  nice -n 10 cargo test --test compile_fail
  echo "== doc tests (every feature) =="
  nice -n 10 cargo test --doc --all-features
) >"$logs/side" 2>&1 &
lanes+=($!)
(
  RUSTFLAGS="--cfg taskstage_loom" CARGO_TARGET_DIR=target/loom \
    nice -n 10 cargo test --release --test loom -- --test-threads=1 --nocapture
) >"$logs/loom" 2>&1 &
lanes+=($!)
set +m
echo "== in the background: compile-fail and doc tests; loom models (output below, at the end) =="

failed=()
echo "== every target with every feature =="
# Among them: the metrics test (a recording backend checks the values), the testing
# kit's tests and the migrate example under generated schedules, the cluster's unit,
# property, model and etcd tests, the fault suite (worker processes under SIGSTOP,
# kill -9, cuts to etcd, the etcd leader lost, two controllers racing, 100 tasks, CPU
# overload; each merged history checked), the randomized nemesis (60 s, a fresh seed printed first;
# its unfenced control must fail the checker), the `taskstage` command (feature cli)
# run as a binary against etcd and worker processes, and the migrate example's cluster
# mode at small scale. Each runs as `cargo test` runs it: from the package's root,
# with the package's directory in CARGO_MANIFEST_DIR.
export CARGO_MANIFEST_DIR=$PWD
while IFS=$'\t' read -r label exe; do
  echo "     Running $label ($exe)"
  "$exe" || failed+=("$label")
done <"$built"
rm -f "$built"

echo "== the scale run under overload: 1,000 tasks, 3 worker processes (examples/cluster_scale.rs, debug) =="
# Built with the features of the build above, so only the example itself compiles.
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
cargo run --all-features --example cluster_scale -- --tasks 1000 --workers 3 --overload \
  || failed+=("the scale run under overload (examples/cluster_scale.rs)")

names=("compile-fail and doc tests" "loom models")
logs_of=("$logs/side" "$logs/loom")
for i in 0 1; do
  if ! wait "${lanes[$i]}"; then
    failed+=("${names[$i]}")
  fi
  if ((i == 1)); then
    echo "== loom models (--cfg taskstage_loom, release; run beside the suites above) =="
  fi
  cat "${logs_of[$i]}"
done
lanes=()
rm -rf "$logs"

if ((${#failed[@]} > 0)); then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "every suite passed"
