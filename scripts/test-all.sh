#!/usr/bin/env bash
# Runs every test of the crate: unit, integration, property, compile-fail, doc tests,
# the examples' own tests, the benchmarks in test mode, the testing kit's dogfood, the
# cluster's etcd integration, fault and nemesis suites, the command line's tests, and
# the loom models.
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

echo "== build every target with every feature (etcd, metrics, testing, cli) =="
# One build for all of them: the features only add code, and each test file that
# needs one says so with `required-features`.
cargo test --all-targets --all-features --no-run

loom_log=$(mktemp)
loom_pid=""
stop_loom() {
  if [[ -n $loom_pid ]]; then
    kill -- "-$loom_pid" 2>/dev/null || kill "$loom_pid" 2>/dev/null || true
  fi
}
trap stop_loom EXIT
echo "== loom models: building and running in the background (output below, at the end) =="
# A separate target dir: the cfg changes RUSTFLAGS, which would otherwise force the
# normal build to be redone on the next run. Each model sets its own preemption bound
# in code (two-party models: none, so they are exhaustive; three-party models: 3, and
# their comments say why). `nice`: the timing-sensitive cluster suites keep the CPU.
set -m
(
  RUSTFLAGS="--cfg taskstage_loom" CARGO_TARGET_DIR=target/loom \
    nice -n 10 cargo test --release --test loom -- --test-threads=1 --nocapture
) >"$loom_log" 2>&1 &
loom_pid=$!
set +m

failed=()
echo "== every target with every feature =="
# Among them: the metrics test (a recording backend checks the values), the testing
# kit's tests and the migrate example under generated schedules, the cluster's unit,
# property, model and etcd tests, the fault suite (worker processes under SIGSTOP,
# kill -9, cuts to etcd, the etcd leader lost, two controllers racing, 100 tasks; each
# merged history checked), the randomized nemesis (60 s, a fresh seed printed first;
# its unfenced control must fail the checker), the `taskstage` command (feature cli)
# run as a binary against etcd and worker processes, and the migrate example's cluster
# mode at small scale.
cargo test --all-targets --all-features || failed+=("every target")
echo "== compile-fail proofs of the typestate API (default features: the saved errors are theirs) =="
cargo test --test compile_fail || failed+=("compile-fail")
echo "== doc tests (every feature) =="
cargo test --doc --all-features || failed+=("doc tests")

echo "== loom models (--cfg taskstage_loom, release; run beside the suites above) =="
if ! wait "$loom_pid"; then
  failed+=("loom models")
fi
loom_pid=""
cat "$loom_log"
rm -f "$loom_log"

if ((${#failed[@]} > 0)); then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "every suite passed"
