#!/usr/bin/env bash
# Mutation check: puts small, plausible bugs into the crate one at a time and runs the
# suite named for each. The mutants are data: tests/mutants/NNN.patch, a patch with
# three header lines before its diff:
#
#   # where: cluster/fence.rs: Fencer::fenced
#   # mutant: what the bug does, and why it would matter
#   # suite: --all-features --test cluster_promises a_claim_never_overwrites
#
# A mutant is CAUGHT when its suite fails (a suite that hangs past SUITE_TIMEOUT
# counts as failing, and says so) and SURVIVED when it passes. Prints a Markdown
# table; exits non-zero if any mutant survived, does not apply (its code has changed
# under it: the mutant is stale), did not build, or its suite ran no test.
#
#   bash scripts/mutation-check.sh                    # every mutant
#   MUTANTS="1 5 7" bash scripts/mutation-check.sh    # a subset
#   bash scripts/mutation-check.sh --refresh          # rewrite the patches' context
#
# Environment:
#   MUTANTS           numbers of the mutants to run (default: all)
#   BASELINE=0        skip the run of each needed suite on the unmutated tree
#   SUITE_TIMEOUT     seconds a suite may run before it counts as hung (default 600)
#   CARGO_TARGET_DIR  target dir of the normal builds (default: cargo's)
#   LOOM_TARGET_DIR   target dir of the loom builds (default: target/loom)
#   MUTANTS_LOG_DIR   where each suite's output is kept (default: a fresh temp dir)
#
# A patch applies where its context still stands, moved or not (git apply finds it at
# another line); one whose context is gone fails loudly instead of testing the
# unmutated crate. --refresh applies each mutant that still applies and writes its
# diff back with today's line numbers and context, so that moved code does not age
# the patches; one that no longer applies is named, to be ported by hand. Each mutant
# is reverted after its run, and on any exit; the check refuses to start on a tree
# with uncommitted changes, so that the revert can lose nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE_TIMEOUT=${SUITE_TIMEOUT:-600}
LOOM_TARGET_DIR=${LOOM_TARGET_DIR:-target/loom}
DIR=tests/mutants

if ! git diff --quiet HEAD --; then
  echo "mutation-check: the work tree has uncommitted changes; commit or stash them first" >&2
  exit 2
fi

# ---------------------------------------------------------------- the machinery

restore() {
  # Whatever a mutant touched: the crate's code, never the mutants themselves.
  local touched
  touched=$(git diff --name-only -- src tests examples loom-tests benches crates ':!tests/mutants')
  if [[ -n "$touched" ]]; then
    # shellcheck disable=SC2086
    git checkout -q -- $touched
  fi
  # A failing property test saves its seed; the committed seed files stay as they are.
  git checkout -q -- proptest-regressions crates/cluster/proptest-regressions
}
trap restore EXIT
trap 'restore; exit 130' INT TERM

patch_of() { printf '%s/%03d.patch' "$DIR" "$1"; }

# header FILE FIELD: the value of one header line.
header() { sed -n "s/^# $2: //p" "$1" | head -n1; }

# The command a suite name stands for: `[-p PACKAGE] [FEATURES] --lib [FILTER]`,
# `[-p PACKAGE] [FEATURES] --test NAME [FILTER]` (PACKAGE: a crate of the workspace,
# the core when none is named; FEATURES: `--all-features` or `--features LIST`), or `loom FILTER` (the loom models, built with their
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
        cargo test --release -p taskstage-loom-tests --test loom)
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
        if [[ ${args[0]} == -p ]]; then n=2; fi
        case ${args[n]} in
          --all-features) n=$((n + 1)) ;;
          --features) n=$((n + 2)) ;;
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

# ---------------------------------------------------------------- which mutants

ALL=$(find "$DIR" -name '[0-9]*.patch' -printf '%f\n' | sed 's/\.patch$//; s/^0*//' | sort -n | tr '\n' ' ')
SELECTED=${MUTANTS:-$ALL}
for n in $SELECTED; do
  f=$(patch_of "$n")
  if [[ ! -f $f ]]; then
    echo "mutation-check: no mutant $n (there are: $ALL)" >&2
    exit 2
  fi
  for field in where mutant suite; do
    if [[ -z $(header "$f" "$field") ]]; then
      echo "mutation-check: $f has no '# $field:' line" >&2
      exit 2
    fi
  done
done

# ---------------------------------------------------------------- refresh

if [[ ${1-} == --refresh ]]; then
  stale=0
  for n in $SELECTED; do
    f=$(patch_of "$n")
    if ! git apply "$f" 2>/dev/null; then
      echo "mutant $n: does not apply; port it by hand ($f)" >&2
      stale=1
      continue
    fi
    # The mutant's own diff: not the patches this loop has already written back.
    { grep -E '^# (where|mutant|suite): ' "$f"; git diff --no-color --no-ext-diff -- . ':!tests/mutants'; } >"$f.tmp"
    restore
    mv "$f.tmp" "$f"
  done
  git diff --stat -- "$DIR"
  exit "$stale"
fi

# ---------------------------------------------------------------- baseline

LOG_DIR=${MUTANTS_LOG_DIR:-$(mktemp -d)}
mkdir -p "$LOG_DIR"
declare -A NEEDED=()
for n in $SELECTED; do
  NEEDED["$(header "$(patch_of "$n")" suite)"]=1
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
  f=$(patch_of "$n")
  suite=$(header "$f" suite)
  log="$LOG_DIR/mutant-$n.log"
  t0=$(date +%s)
  if ! git apply "$f" 2>"$log"; then
    result="NOT APPLIED (stale mutant: $(tail -n1 "$log"))"
    failed=1
  else
    case $(run_suite "$suite" "$log") in
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
  rows+=("| $n | $(header "$f" where) | $(header "$f" mutant) | $(suite_label "$suite") | $result |")
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
