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
# Two networks (NETS):
#
#   proxy   a fault proxy in front of every member's ports on loopback
#           (tests/nemesis/net.rs), as in CI: it cuts one way or both,
#           slows links (this machine's kernel has no netem) and resets
#           connections;
#   netns   every member in a network namespace of its own on a bridge,
#           mutual TLS between members and with clients (certificates for
#           the members' addresses), faults as nftables rules in the
#           members' namespaces, one way by connection direction
#           (tests/nemesis/netns.rs); no slow links, no resets, no etcd.
#           Needs root, iproute2 and nftables (installed with apt if
#           missing). Namespaces are named tkn<pid>-..., deleted at the end,
#           and those of a run that died are deleted by the next.
#
# Environment: TARGETS ("raft3 etcd single") NETS ("proxy") SECS (600)
#   NEMESIS_SEED (2026) OUT (target/nemesis-report.md) CARGO_TARGET_DIR
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=${TARGETS:-"raft3 etcd single"}
NETS=${NETS:-proxy}
SECS=${SECS:-600}
OUT=${OUT:-target/nemesis-report.md}
export NEMESIS_SEED=${NEMESIS_SEED:-2026}

if [[ " $NETS " == *" netns "* ]] && ! command -v nft >/dev/null; then
  echo "installing nftables" >&2
  apt-get install -y nftables >/dev/null || { echo "no nft, and apt could not install it" >&2; exit 1; }
fi
echo "building (release, --all-features)" >&2
cargo test --release --all-features --test nemesis --no-run --quiet

: > "$OUT"
status=0
for net in $NETS; do
for target in $TARGETS; do
  if [[ $net == netns && $target == etcd ]]; then continue; fi
  echo "== $target on $net: $SECS s of faults, seed $NEMESIS_SEED" >&2
  log=$(mktemp)
  if NEMESIS_NET="$net" NEMESIS_TARGET="$target" NEMESIS_SECS="$SECS" \
      cargo test --release --all-features --test nemesis --quiet -- \
      --ignored --exact long_run --nocapture > "$log" 2>&1; then
    verdict="passed"
  else
    verdict="FAILED"; status=1
  fi
  {
    echo "Command: \`NETS=$net TARGETS=$target SECS=$SECS NEMESIS_SEED=$NEMESIS_SEED benches/nemesis.sh\` ($verdict)"
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
done
cat "$OUT"
exit "$status"
