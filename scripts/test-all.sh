#!/usr/bin/env bash
# Runs every test of the crate: unit, integration, property, compile-fail, doc tests,
# the examples' own tests, the benchmarks in test mode, and the loom models.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== unit, integration, property, compile-fail, examples, benches (test mode) =="
cargo test --all-targets
echo "== the metrics feature (a recording backend checks the values) =="
cargo test --features metrics --test metrics
echo "== doc tests =="
cargo test --doc
echo "== the testing kit (--features testing): its tests, the migrate example under generated schedules, its doc tests =="
cargo test --features testing --lib --test migrate_kit
cargo test --features testing --doc -- testing Testing

echo "== loom models (--cfg taskstage_loom, release) =="
# A separate target dir: the cfg changes RUSTFLAGS, which would otherwise force the
# normal build to be redone on the next run.
# Each model sets its own preemption bound in code (two-party models: none, so they
# are exhaustive; three-party models: 3, and their comments say why).
RUSTFLAGS="--cfg taskstage_loom" CARGO_TARGET_DIR=target/loom \
  cargo test --release --test loom -- --test-threads=1 --nocapture

echo "== cluster (--features etcd): unit, property, model, doc and etcd integration tests =="
# Installs protoc and etcd when missing (or fails saying what to install). The
# integration tests start their own 3-member etcd on 127.0.0.1; under CI=true a
# missing etcd binary fails them instead of skipping.
bash scripts/etcd-setup.sh
cargo test --features etcd --lib cluster::
cargo test --features etcd --doc cluster
cargo test --features etcd --test cluster_prop --test cluster_model --test cluster_etcd -- --nocapture
# Worker processes under SIGSTOP, kill -9, a cut to etcd, the etcd leader lost, two
# controllers racing, 100 tasks: each scenario's merged history is checked; and the
# migrate example's cluster mode (--workers 3) at small scale.
cargo test --features etcd --test cluster_faults --test migrate_cluster -- --nocapture
