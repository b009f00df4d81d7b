#!/usr/bin/env bash
# End-to-end lock+unlock pairs/s over ONE loopback connection: the ticketing
# tokio adapter against `ticketing serve` in another process, right beside
# the Redis lock benchmark of shared/bench/redis-lock (SET NX PX + Lua
# compare-and-delete over one redis-rs multiplexed connection), on the same
# machine, in one run. Same methodology on both sides: try-lock (wait 0)
# with a 30 s lease, release by exact token, a random key among $KEYS,
# warm-up then a measured window, per concurrency level.
#
# Builds release, starts a private redis-server and `ticketing serve` on
# free loopback ports, runs each level on Redis then on ticketing (the two
# interleaved so that a busy machine hurts both alike), stops what it
# started, prints one comparison table per round.
#
# Environment: SECS (5) WARMUP (1) CONC (1,16,256) KEYS (1000) ROUNDS (1)
#   WINDOW (1024: the server's window; it must exceed the largest CONC or
#   the window, not the server, caps the requests in flight)
#   REDIS_BENCH_DIR (../../shared/bench/redis-lock beside this repo)
#   REDIS_TARGET_DIR (/tmp/redis-lock-bench-target)
#   CARGO_TARGET_DIR (target/ of this repo, as cargo has it)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

SECS="${SECS:-5}"
WARMUP="${WARMUP:-1}"
CONC="${CONC:-1,16,256}"
KEYS="${KEYS:-1000}"
ROUNDS="${ROUNDS:-1}"
WINDOW="${WINDOW:-1024}"
REDIS_BENCH_DIR="${REDIS_BENCH_DIR:-$ROOT/../shared/bench/redis-lock}"
REDIS_TARGET_DIR="${REDIS_TARGET_DIR:-/tmp/redis-lock-bench-target}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
WORK="$(mktemp -d /tmp/ticketing-e2e.XXXXXX)"
REDIS_PID=""
SERVE_PID=""

# shellcheck source=benches/common.sh
source "$ROOT/benches/common.sh"
cleanup() {
  stop_pid "$SERVE_PID"; SERVE_PID=""
  stop_pid "$REDIS_PID"; REDIS_PID=""
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

command -v redis-server >/dev/null || { echo "redis-server missing: apt-get install -y redis-server" >&2; exit 1; }
[[ -f "$REDIS_BENCH_DIR/Cargo.toml" ]] || { echo "no redis-lock bench at $REDIS_BENCH_DIR (set REDIS_BENCH_DIR)" >&2; exit 1; }


echo "== build (release)"
b0=$(date +%s%N)
cargo build --release --quiet --features cli --bin ticketing --bench e2e
E2E_BIN=$(cargo build --release --quiet --features cli --bench e2e --message-format=json \
  | grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//' | grep '/e2e-' | tail -1)
[[ -x "$E2E_BIN" ]] || { echo "cannot find the e2e bench binary" >&2; exit 1; }
# shared/ may be read-only: build the Redis bench outside it, lock file as is.
CARGO_TARGET_DIR="$REDIS_TARGET_DIR" cargo build --release --quiet --locked \
  --manifest-path "$REDIS_BENCH_DIR/Cargo.toml"
REDIS_BIN="$REDIS_TARGET_DIR/release/redis-lock-bench"
b1=$(date +%s%N)
echo "build took $(( (b1 - b0) / 1000000 )) ms"

echo "== start redis-server"
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize no --dir "$WORK" --logfile "$WORK/redis.log" &
REDIS_PID=$!
for _ in $(seq 100); do
  redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
  sleep 0.05
done
redis-cli -p "$REDIS_PORT" ping | grep -q PONG || { echo "redis did not come up" >&2; exit 1; }
echo "redis pid $REDIS_PID on 127.0.0.1:$REDIS_PORT, $(redis-server --version | awk '{print $3}')"

echo "== start ticketing serve"
"$TARGET_DIR/release/ticketing" serve --listen 127.0.0.1:0 --window "$WINDOW" 2>"$WORK/serve.err" &
SERVE_PID=$!
SERVE_ADDR=""
for _ in $(seq 100); do
  SERVE_ADDR=$(sed -n 's/^listening on //p' "$WORK/serve.err")
  [[ -n "$SERVE_ADDR" ]] && break
  kill -0 "$SERVE_PID" 2>/dev/null || break
  sleep 0.05
done
[[ -n "$SERVE_ADDR" ]] || { echo "ticketing serve did not come up:" >&2; cat "$WORK/serve.err" >&2; exit 1; }
echo "ticketing serve pid $SERVE_PID on $SERVE_ADDR (--window $WINDOW)"

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== benchmarks: ${SECS}s window (+${WARMUP}s warm-up) per level, K=$KEYS random keys, rounds $ROUNDS, $(nproc) cores"
IFS=',' read -r -a LEVELS <<<"$CONC"
for round in $(seq "$ROUNDS"); do
  : >"$WORK/r$round.txt"
  for c in "${LEVELS[@]}"; do
    "$REDIS_BIN" --port "$REDIS_PORT" --secs "$SECS" --warmup "$WARMUP" --conc "$c" \
      --keys "$KEYS" --only redis | grep '^redis-lock C=' | tee -a "$WORK/r$round.txt"
    "$E2E_BIN" --addr "$SERVE_ADDR" --secs "$SECS" --warmup "$WARMUP" --conc "$c" \
      --keys "$KEYS" | grep -E '^(ticketing|RESULT) ' | tee -a "$WORK/r$round.txt" | grep -v '^RESULT'
  done
done

LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
stop_pid "$SERVE_PID"; SERVE_PID=""
stop_pid "$REDIS_PID"; REDIS_PID=""
echo "== servers stopped"

# redis line: redis-lock C=N X/s acq p50 Aus p99 Bus | pair p50/p99 P/Q us; SET/s ...
redis_field() { # $1 file, $2 C, $3 field: ops|p50|p99|pp50|pp99
  awk -v c="C=$2" -v f="$3" '$1=="redis-lock" && $2==c {
    ops=$3; sub("/s","",ops); p50=$6; sub("us","",p50); p99=$8; sub("us","",p99)
    split($12, pp, "/")
    if (f=="ops") print ops; else if (f=="p50") print p50; else if (f=="p99") print p99;
    else if (f=="pp50") print pp[1]; else print pp[2] }' "$1"
}
tick_field() { # $1 file, $2 C, $3 column of the RESULT line
  awk -v c="$2" -v k="$3" '$1=="RESULT" && $3==c { print $k }' "$1"
}

echo
for round in $(seq "$ROUNDS"); do
  f="$WORK/r$round.txt"
  echo "===== round $round: lock+unlock pairs/s over one loopback connection ($(nproc) cores) ====="
  fmt='| %4s | %13s | %15s | %6s | %19s | %20s | %20s | %21s |\n'
  # shellcheck disable=SC2059
  printf "$fmt" C "redis pairs/s" "ticket. pairs/s" ratio "redis acq p50/p99" \
    "ticket. acq p50/p99" "redis pair p50/p99" "ticket. pair p50/p99"
  # shellcheck disable=SC2059
  printf "$fmt" "" "" "" "" "" "" "" "" | tr ' ' '-'
  for c in "${LEVELS[@]}"; do
    r_ops=$(redis_field "$f" "$c" ops); t_ops=$(tick_field "$f" "$c" 4)
    ratio=$(awk -v a="$t_ops" -v b="$r_ops" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }')
    # shellcheck disable=SC2059
    printf "$fmt" "$c" "$r_ops" "$t_ops" "$ratio" \
      "$(redis_field "$f" "$c" p50)/$(redis_field "$f" "$c" p99) us" \
      "$(printf '%.0f/%.0f us' "$(tick_field "$f" "$c" 5)" "$(tick_field "$f" "$c" 6)")" \
      "$(redis_field "$f" "$c" pp50)/$(redis_field "$f" "$c" pp99) us" \
      "$(printf '%.0f/%.0f us' "$(tick_field "$f" "$c" 7)" "$(tick_field "$f" "$c" 8)")"
  done
  echo
done
cat <<EOF
What is measured, the same on both sides: C tasks share ONE client connection
(redis-rs multiplexed / ticketing tokio adapter) on a multi-threaded tokio
runtime; each loops: random key among $KEYS, try-lock (Redis: SET NX PX 30000;
ticketing: acquire wait 0, lease 30 s), and if granted release by exact token
(Redis: EVALSHA compare-and-delete; ticketing: R by token). pairs/s = granted
acquires whose release succeeded, acquire started within the ${SECS}s window
(after ${WARMUP}s warm-up), per second. acq p50/p99 = latency of every acquire
attempt in the window (granted or not); pair p50/p99 = acquire call to release
reply. ratio = ticketing pairs/s / Redis pairs/s. Each side's server is a
separate process on the same machine; both benchmark clients and both servers
share its $(nproc) cores. ticketing serve runs with --window $WINDOW.
Load average (1/5/15 min) before the runs: $LOAD_BEFORE; after: $LOAD_AFTER.
EOF
