#!/usr/bin/env bash
# Runs every test of the crate: unit, integration, property, compile-fail, doc tests,
# the examples' own tests, the benchmarks in test mode, the testing kit's dogfood, the
# cluster's etcd integration and fault suites, and the loom models.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs protoc, etcd (and what the fault suite injects faults with) when missing,
# or fails saying what to install. The etcd tests start their own 3-member etcd on
# 127.0.0.1; under CI=true a missing tool fails them instead of skipping.
bash scripts/etcd-setup.sh

echo "== every target with every feature (etcd, metrics, testing) =="
# One build for all of them: the features only add code, and each test file that
# needs one says so with `required-features`. Among them: the metrics test (a
# recording backend checks the values), the testing kit's tests and the migrate
# example under generated schedules, the cluster's unit, property, model and etcd
# tests, the fault suite (worker processes under SIGSTOP, kill -9, cuts to etcd, the
# etcd leader lost, two controllers racing, 100 tasks; each merged history checked),
# the randomized nemesis (60 s, a fresh seed printed first; its unfenced control must
# fail the checker) and the migrate example's cluster mode at small scale.
cargo test --all-targets --all-features
echo "== compile-fail proofs of the typestate API (default features: the saved errors are theirs) =="
cargo test --test compile_fail
echo "== doc tests (every feature) =="
cargo test --doc --all-features

echo "== loom models (--cfg taskstage_loom, release) =="
# A separate target dir: the cfg changes RUSTFLAGS, which would otherwise force the
# normal build to be redone on the next run.
# Each model sets its own preemption bound in code (two-party models: none, so they
# are exhaustive; three-party models: 3, and their comments say why).
RUSTFLAGS="--cfg taskstage_loom" CARGO_TARGET_DIR=target/loom \
  cargo test --release --test loom -- --test-threads=1 --nocapture
