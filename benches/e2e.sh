#!/usr/bin/env bash
# End-to-end lock+unlock pairs/s over ONE loopback connection: the ticketing
# tokio adapter against `ticketing serve` in another process, right beside
# the Redis lock benchmark of shared/bench/redis-lock (SET NX PX + Lua
# compare-and-delete over one redis-rs multiplexed connection), on the same
# machine, in one run. Same methodology on both sides: try-lock (wait 0)
# with a 30 s lease, release by exact token, a random key among $KEYS,
# warm-up then a measured window, per concurrency level.
#
# And the same ticketing benchmark over TLS (rustls, TLS 1.3, ring) against
# a second `ticketing serve --tls-cert --tls-key`, beside plain TCP, so that
# what TLS costs here is measured in the same run.
#
# Builds release, makes a CA and a server certificate (`e2e --make-certs`),
# starts a private redis-server and two `ticketing serve` (plain and TLS) on
# free loopback ports, runs each level on Redis, then ticketing, then
# ticketing over TLS (interleaved so that a busy machine hurts all alike),
# stops what it started, prints the comparison tables of each round.
#
# Environment: SECS (5) WARMUP (1) CONC (1,16,256) KEYS (1000) ROUNDS (1)
#   WINDOW (1024: the server's window; it must exceed the largest CONC or
#   the window, not the server, caps the requests in flight)
#   REDIS (1; 0 leaves Redis out, and needs neither redis-server nor its bench)
#   TLS (1; 0 leaves TLS out)
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
REDIS="${REDIS:-1}"
TLS="${TLS:-1}"
REDIS_BENCH_DIR="${REDIS_BENCH_DIR:-$ROOT/../shared/bench/redis-lock}"
REDIS_TARGET_DIR="${REDIS_TARGET_DIR:-/tmp/redis-lock-bench-target}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
WORK="$(mktemp -d /tmp/ticketing-e2e.XXXXXX)"
REDIS_PID=""
SERVE_PID=""
TLS_PID=""

# shellcheck source=benches/common.sh
source "$ROOT/benches/common.sh"
cleanup() {
  stop_pid "$TLS_PID"; TLS_PID=""
  stop_pid "$SERVE_PID"; SERVE_PID=""
  stop_pid "$REDIS_PID"; REDIS_PID=""
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

if [[ "$REDIS" == 1 ]]; then
  command -v redis-server >/dev/null || { echo "redis-server missing: apt-get install -y redis-server (or REDIS=0)" >&2; exit 1; }
  [[ -f "$REDIS_BENCH_DIR/Cargo.toml" ]] || { echo "no redis-lock bench at $REDIS_BENCH_DIR (set REDIS_BENCH_DIR, or REDIS=0)" >&2; exit 1; }
fi


echo "== build (release)"
b0=$(date +%s%N)
cargo build --release --quiet --features cli --bin ticketing --bench e2e
E2E_BIN=$(cargo build --release --quiet --features cli --bench e2e --message-format=json \
  | grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//' | grep '/e2e-' | tail -1)
[[ -x "$E2E_BIN" ]] || { echo "cannot find the e2e bench binary" >&2; exit 1; }
if [[ "$REDIS" == 1 ]]; then
  # shared/ may be read-only: build the Redis bench outside it, lock file as is.
  CARGO_TARGET_DIR="$REDIS_TARGET_DIR" cargo build --release --quiet --locked \
    --manifest-path "$REDIS_BENCH_DIR/Cargo.toml"
fi
REDIS_BIN="$REDIS_TARGET_DIR/release/redis-lock-bench"
b1=$(date +%s%N)
echo "build took $(( (b1 - b0) / 1000000 )) ms"

if [[ "$REDIS" == 1 ]]; then
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
fi

# start_serve NAME ARGS...: `ticketing serve` on a free port; sets
# STARTED_PID and STARTED_ADDR (from its `listening on ADDR`).
start_serve() {
  local name="$1"; shift
  "$TARGET_DIR/release/ticketing" serve --listen 127.0.0.1:0 --window "$WINDOW" "$@" \
    2>"$WORK/$name.err" &
  STARTED_PID=$!
  STARTED_ADDR=""
  for _ in $(seq 100); do
    STARTED_ADDR=$(sed -n 's/^listening on //p' "$WORK/$name.err")
    [[ -n "$STARTED_ADDR" ]] && break
    kill -0 "$STARTED_PID" 2>/dev/null || break
    sleep 0.05
  done
  [[ -n "$STARTED_ADDR" ]] || { echo "ticketing serve ($name) did not come up:" >&2; cat "$WORK/$name.err" >&2; exit 1; }
  echo "ticketing serve ($name) pid $STARTED_PID on $STARTED_ADDR (--window $WINDOW $*)"
}

echo "== start ticketing serve"
start_serve plain
SERVE_PID=$STARTED_PID; SERVE_ADDR=$STARTED_ADDR
if [[ "$TLS" == 1 ]]; then
  "$E2E_BIN" --make-certs "$WORK/tls"
  start_serve tls --tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key"
  TLS_PID=$STARTED_PID; TLS_ADDR=$STARTED_ADDR
fi

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== benchmarks: ${SECS}s window (+${WARMUP}s warm-up) per level, K=$KEYS random keys, rounds $ROUNDS, $(nproc) cores"
IFS=',' read -r -a LEVELS <<<"$CONC"
for round in $(seq "$ROUNDS"); do
  : >"$WORK/r$round.txt"
  for c in "${LEVELS[@]}"; do
    if [[ "$REDIS" == 1 ]]; then
      "$REDIS_BIN" --port "$REDIS_PORT" --secs "$SECS" --warmup "$WARMUP" --conc "$c" \
        --keys "$KEYS" --only redis | grep '^redis-lock C=' | tee -a "$WORK/r$round.txt"
    fi
    "$E2E_BIN" --addr "$SERVE_ADDR" --secs "$SECS" --warmup "$WARMUP" --conc "$c" \
      --keys "$KEYS" | grep -E '^(ticketing|RESULT) ' | tee -a "$WORK/r$round.txt" | grep -v '^RESULT'
    if [[ "$TLS" == 1 ]]; then
      "$E2E_BIN" --addr "$TLS_ADDR" --tls-ca "$WORK/tls/ca.pem" --secs "$SECS" --warmup "$WARMUP" \
        --conc "$c" --keys "$KEYS" | grep -E '^(ticketing-tls|RESULT) ' | tee -a "$WORK/r$round.txt" \
        | grep -v '^RESULT'
    fi
  done
done

LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
stop_pid "$TLS_PID"; TLS_PID=""
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
tick_field() { # $1 file, $2 C, $3 column of the RESULT line; $4 its name (ticketing)
  awk -v c="$2" -v k="$3" -v n="${4:-ticketing}" '$1=="RESULT" && $2==n && $3==c { print $k }' "$1"
}
lat() { # $1 file, $2 C, $3 name, $4 column of p50 (5: acquire, 7: pair): "p50/p99 us"
  printf '%.0f/%.0f us' "$(tick_field "$1" "$2" "$4" "$3")" "$(tick_field "$1" "$2" $(( $4 + 1 )) "$3")"
}

echo
for round in $(seq "$ROUNDS"); do
  f="$WORK/r$round.txt"
  [[ "$REDIS" == 1 ]] || continue
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
for round in $(seq "$ROUNDS"); do
  f="$WORK/r$round.txt"
  [[ "$TLS" == 1 ]] || continue
  echo "===== round $round: ticketing over TLS beside plain TCP, pairs/s over one loopback connection ($(nproc) cores) ====="
  fmt='| %4s | %13s | %13s | %7s | %17s | %17s | %18s | %18s |\n'
  # shellcheck disable=SC2059
  printf "$fmt" C "TCP pairs/s" "TLS pairs/s" TLS/TCP "TCP acq p50/p99" "TLS acq p50/p99" \
    "TCP pair p50/p99" "TLS pair p50/p99"
  # shellcheck disable=SC2059
  printf "$fmt" "" "" "" "" "" "" "" "" | tr ' ' '-'
  for c in "${LEVELS[@]}"; do
    t_ops=$(tick_field "$f" "$c" 4); s_ops=$(tick_field "$f" "$c" 4 ticketing-tls)
    ratio=$(awk -v a="$s_ops" -v b="$t_ops" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }')
    # shellcheck disable=SC2059
    printf "$fmt" "$c" "$t_ops" "$s_ops" "$ratio" "$(lat "$f" "$c" ticketing 5)" \
      "$(lat "$f" "$c" ticketing-tls 5)" "$(lat "$f" "$c" ticketing 7)" "$(lat "$f" "$c" ticketing-tls 7)"
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
TLS: the same ticketing benchmark against a second ticketing serve with
--tls-cert/--tls-key (an ECDSA P-256 certificate made by e2e --make-certs),
TLS 1.3 as rustls negotiates it on the ring provider, server authentication
only; the one handshake per level happens before the clock starts.
TLS/TCP = ticketing-over-TLS pairs/s / ticketing-over-TCP pairs/s.
Load average (1/5/15 min) before the runs: $LOAD_BEFORE; after: $LOAD_AFTER.
EOF
