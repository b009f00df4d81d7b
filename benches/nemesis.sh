#!/usr/bin/env bash
# The nemesis, long (issue 33): tests/nemesis.rs's harness over the real
# `ticketing` binary for $SECS seconds of faults each, against every
# target in $TARGETS:
#
#   raft3   a replicated cluster of three members (13 kinds of fault)
#   raft5   the same with five
#   etcd    three nodes led through a real etcd (11 kinds; .ci/install-etcd
#           installs Debian's etcd-server if there is none)
#   single  one server with a state directory that restarts (6 kinds)
#
# Each run: eight library clients on four shared keys and private ones, an
# availability probe, probes of every member cut off into a minority, the
# history of every operation (JSON lines, under target/tmp/nemesis), and
# the report's table, which this script
# gathers into $OUT. A run with a violation fails the script, its history
# kept and named.
#
# The faults go through a fault proxy in front of every member's ports
# (tests/nemesis/net.rs): on loopback it is the only way to cut one
# direction of one link, and this machine's kernel has no netem for slow
# links.
#
# Environment: TARGETS ("raft3 etcd single") SECS (600) NEMESIS_SEED (2026)
#   OUT (target/nemesis-report.md) CARGO_TARGET_DIR
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=${TARGETS:-"raft3 etcd single"}
SECS=${SECS:-600}
OUT=${OUT:-target/nemesis-report.md}
export NEMESIS_SEED=${NEMESIS_SEED:-2026}

echo "building (release, --all-features)" >&2
cargo test --release --all-features --test nemesis --no-run --quiet

: > "$OUT"
status=0
for target in $TARGETS; do
  echo "== $target: $SECS s of faults, seed $NEMESIS_SEED" >&2
  log=$(mktemp)
  if NEMESIS_TARGET="$target" NEMESIS_SECS="$SECS" \
      cargo test --release --all-features --test nemesis --quiet -- \
      --ignored --exact long_run --nocapture > "$log" 2>&1; then
    verdict="passed"
  else
    verdict="FAILED"; status=1
  fi
  {
    echo "Command: \`TARGETS=$target SECS=$SECS NEMESIS_SEED=$NEMESIS_SEED benches/nemesis.sh\` ($verdict)"
    echo
    sed -n '/^### /,/^history: /p' "$log"
    echo
    echo "Faults by start time (s):"
    echo
    echo '```'
    grep '^nemesis ' "$log" | sed 's/^nemesis [^:]*: //'
    echo '```'
    echo
  } >> "$OUT"
  grep -q '^test long_run ... ok' "$log" || tail -30 "$log" >&2
  rm -f "$log"
done
cat "$OUT"
exit "$status"
