#!/usr/bin/env bash
# Runs every test of the crate: unit, integration, property, compile-fail, doc tests,
# the examples' own tests, the benchmarks in test mode, and the loom models.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== unit, integration, property, compile-fail, examples, benches (test mode) =="
cargo test --all-targets
echo "== doc tests =="
cargo test --doc

echo "== loom models (--cfg taskstage_loom, release) =="
# A separate target dir: the cfg changes RUSTFLAGS, which would otherwise force the
# normal build to be redone on the next run.
# LOOM_MAX_PREEMPTIONS bounds only the three-party models (each says why); the
# two-party models set no bound and are explored exhaustively.
RUSTFLAGS="--cfg taskstage_loom" CARGO_TARGET_DIR=target/loom \
  LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
  cargo test --release --test loom -- --test-threads=1 --nocapture
