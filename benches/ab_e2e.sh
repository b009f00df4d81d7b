#!/usr/bin/env bash
# Two builds of the end-to-end bench client (benches/e2e.rs) against one
# `ticketing serve`, alternated round by round, so that both see the same
# machine: what a change to the client side (the core, an adapter) costs
# end to end. Not a test.
#
#   OLD=<e2e executable> NEW=<e2e executable> bash benches/ab_e2e.sh
#
# Build each with `cargo bench --features cli --bench e2e --no-run` in its
# own checkout (it prints the executable). The server is this checkout's
# release `ticketing`. Prints every round's pairs/s, then per level the
# median of each build and their ratio NEW/OLD.
#
# Environment: OLD, NEW (required) ROUNDS (5) SECS (5) WARMUP (1)
#   CONC (1,16,256) KEYS (1000) CARGO_TARGET_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
: "${OLD:?the old e2e executable}" "${NEW:?the new e2e executable}"
ROUNDS="${ROUNDS:-5}"
SECS="${SECS:-5}"
WARMUP="${WARMUP:-1}"
CONC="${CONC:-1,16,256}"
KEYS="${KEYS:-1000}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
WORK="$(mktemp -d /tmp/ticketing-ab.XXXXXX)"
SERVE_PID=""
# shellcheck source=benches/common.sh
source "$ROOT/benches/common.sh"
cleanup() { stop_pid "$SERVE_PID"; rm -rf "$WORK"; }
trap cleanup EXIT INT TERM

cargo build --release --quiet --features cli --bin ticketing
"$TARGET_DIR/release/ticketing" serve --listen 127.0.0.1:0 --window 1024 2>"$WORK/serve.err" &
SERVE_PID=$!
ADDR=$(listening_addr "$WORK/serve.err")
[[ -n "$ADDR" ]] || { echo "the server did not start" >&2; exit 1; }

IFS=',' read -r -a LEVELS <<<"$CONC"
run() { # $1: executable, $2: concurrency
  "$1" --addr "$ADDR" --secs "$SECS" --warmup "$WARMUP" --conc "$2" --keys "$KEYS" \
    | awk '$1=="RESULT" { print $4 }'
}
for round in $(seq "$ROUNDS"); do
  for c in "${LEVELS[@]}"; do
    # Which build goes first alternates from round to round.
    if (( round % 2 )); then order="OLD NEW"; else order="NEW OLD"; fi
    for which in $order; do
      pairs=$(run "${!which}" "$c")
      echo "round $round C=$c $which $pairs"
      echo "$pairs" >>"$WORK/$which.$c"
    done
  done
done
median() { sort -n "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
printf '| %4s | %14s | %14s | %6s |\n' C "old pairs/s" "new pairs/s" "new/old"
printf '|------|----------------|----------------|--------|\n'
for c in "${LEVELS[@]}"; do
  old=$(median "$WORK/OLD.$c"); new=$(median "$WORK/NEW.$c")
  printf '| %4s | %14s | %14s | %5.2fx |\n' "$c" "$old" "$new" \
    "$(awk -v a="$new" -v b="$old" 'BEGIN { print (b > 0) ? a / b : 0 }')"
done
