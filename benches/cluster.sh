#!/usr/bin/env bash
# A cluster on etcd (PROTOCOL.md 4.2), measured; not a test. Two parts:
#
# 1. Throughput through the leader beside a single server: the e2e bench
#    (benches/e2e.rs: C tasks on one connection, try-lock a random key
#    among $KEYS, release by token) against the leader of a 3-node cluster
#    and against a plain `ticketing serve`, interleaved level by level.
# 2. Failover: $KILLS times, SIGKILL of the leader (benches/failover.rs),
#    the time from the kill to a new leader (the first `W` from another
#    node), to the first grant by the new leader, to the first successful
#    reclaim (X, hammered by a raw client) of a grant the old one made, and
#    to the first `renewed` of a grant that a `ticketing client` holds with
#    automatic renewal (a lease of $MAX_LEASE_MS ms, renewed a third of the
#    way through: this one is the client core's own rounds and backoff, as
#    an embedder meets them); the killed node is started again and waits
#    as a follower before the next kill. Median and worst.
#
# Builds release, starts etcd (Debian's etcd-server: .ci/install-etcd) and
# the nodes on free loopback ports, stops by pid what it started.
#
# Environment: TTL_MS (5000: the default election TTL) MAX_LEASE_MS (15000:
#   three TTLs, the rule of thumb of PROTOCOL.md 4.2) MARGIN_MS (1000)
#   KILLS (10) SECS (5) WARMUP (1) CONC (1,16,256) KEYS (1000)
#   SKIP_THROUGHPUT / SKIP_FAILOVER (unset) CARGO_TARGET_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
TTL_MS="${TTL_MS:-5000}"
MAX_LEASE_MS="${MAX_LEASE_MS:-15000}"
MARGIN_MS="${MARGIN_MS:-1000}"
KILLS="${KILLS:-10}"
SECS="${SECS:-5}"
WARMUP="${WARMUP:-1}"
CONC="${CONC:-1,16,256}"
KEYS="${KEYS:-1000}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
WORK="$(mktemp -d /tmp/ticketing-cluster.XXXXXX)"
ETCD_PID=""
SINGLE_PID=""
HOLDER_PID=""
declare -a NODE_PID NODE_ADDR

# shellcheck source=benches/common.sh
source "$ROOT/benches/common.sh"
cleanup() {
  exec 7>&- 2>/dev/null || true
  stop_pid "$HOLDER_PID"
  for pid in "${NODE_PID[@]:-}"; do stop_pid "$pid"; done
  stop_pid "$SINGLE_PID"
  stop_pid "$ETCD_PID"
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

ETCD="${ETCD:-$(command -v etcd || echo /usr/bin/etcd)}"
[[ -x "$ETCD" ]] || { echo "no etcd: bash .ci/install-etcd" >&2; exit 1; }



echo "== build (release)"
cargo build --release --quiet --features cli --bin ticketing
E2E_BIN=$(bench_bin e2e)
FAILOVER_BIN=$(bench_bin failover)
TICKETING="$TARGET_DIR/release/ticketing"

echo "== start etcd"
ETCD_CLIENT="127.0.0.1:$(free_port)"
ETCD_PEER="127.0.0.1:$(free_port)"
"$ETCD" --name bench --data-dir "$WORK/etcd" \
  --listen-client-urls "http://$ETCD_CLIENT" --advertise-client-urls "http://$ETCD_CLIENT" \
  --listen-peer-urls "http://$ETCD_PEER" --initial-advertise-peer-urls "http://$ETCD_PEER" \
  --initial-cluster "bench=http://$ETCD_PEER" >"$WORK/etcd.log" 2>&1 &
ETCD_PID=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/${ETCD_CLIENT/:/\/}") 2>/dev/null && break; sleep 0.05; done
echo "etcd pid $ETCD_PID on $ETCD_CLIENT, $("$ETCD" --version | head -1)"

start_node() { # $1: index
  local i="$1"
  "$TICKETING" serve --listen "${NODE_ADDR[$i]}" --node-id "n$i" --window 1024 \
    --etcd "http://$ETCD_CLIENT" --cluster bench --advertise "${NODE_ADDR[$i]}" \
    --election-ttl-ms "$TTL_MS" --max-lease-ms "$MAX_LEASE_MS" --grace-margin-ms "$MARGIN_MS" \
    2>>"$WORK/n$i.err" &
  NODE_PID[$i]=$!
  # Killed on purpose: no job-control message when it dies.
  disown "${NODE_PID[$i]}"
}
hello() { # $1: addr; the first line a version 2 handshake gets
  timeout 2 bash -c "exec 3<>/dev/tcp/${1/:/\/}; printf 'H 2 bench -\n' >&3; head -1 <&3" 2>/dev/null || true
}
leader_index() { # waits for a leader; prints its index
  for _ in $(seq 1200); do
    for i in 0 1 2; do
      case "$(hello "${NODE_ADDR[$i]}")" in W*) echo "$i"; return 0 ;; esac
    done
    sleep 0.1
  done
  echo "no leader" >&2; return 1
}

echo "== start 3 nodes (election TTL $TTL_MS ms, leases up to $MAX_LEASE_MS ms, grace margin $MARGIN_MS ms)"
for i in 0 1 2; do NODE_ADDR[$i]="127.0.0.1:$(free_port)"; start_node "$i"; done
LEADER=$(leader_index)
echo "n$LEADER leads at ${NODE_ADDR[$LEADER]}"

if [[ -z "${SKIP_THROUGHPUT:-}" ]]; then
  echo "== throughput: the leader beside a single server (${SECS}s per level, K=$KEYS)"
  "$TICKETING" serve --listen 127.0.0.1:0 --window 1024 2>"$WORK/single.err" &
  SINGLE_PID=$!
  SINGLE_ADDR=$(listening_addr "$WORK/single.err")
  IFS=',' read -r -a LEVELS <<<"$CONC"
  printf '| %4s | %16s | %16s | %6s |\n' C "single pairs/s" "leader pairs/s" ratio
  printf '|------|------------------|------------------|--------|\n'
  for c in "${LEVELS[@]}"; do
    single=$("$E2E_BIN" --addr "$SINGLE_ADDR" --secs "$SECS" --warmup "$WARMUP" --conc "$c" --keys "$KEYS" \
      | awk '$1=="RESULT" { print $4 }')
    leader=$("$E2E_BIN" --addr "${NODE_ADDR[$LEADER]}" --secs "$SECS" --warmup "$WARMUP" --conc "$c" --keys "$KEYS" \
      | awk '$1=="RESULT" { print $4 }')
    printf '| %4s | %16s | %16s | %5.2fx |\n' "$c" "$single" "$leader" \
      "$(awk -v a="$leader" -v b="$single" 'BEGIN { print (b > 0) ? a / b : 0 }')"
  done
  stop_pid "$SINGLE_PID"; SINGLE_PID=""
fi

if [[ -z "${SKIP_FAILOVER:-}" ]]; then
  echo "== failover: $KILLS kills of the leader (SIGKILL)"
  : >"$WORK/failover.txt"
  : >"$WORK/renewed"
  # The holder: a `ticketing client` renewing one grant, its input kept
  # open, every output line stamped with the wall clock in ms.
  mkfifo "$WORK/holder.in"
  endpoints=()
  for a in "${NODE_ADDR[@]}"; do endpoints+=(--endpoint "$a"); done
  (
    "$TICKETING" client --seed 1 "${endpoints[@]}" <"$WORK/holder.in" \
      | while IFS= read -r line; do printf '%s %s\n' "$(date +%s%3N)" "$line"; done >"$WORK/holder.out"
  ) &
  HOLDER_PID=$!
  exec 7>"$WORK/holder.in"
  echo "acquire held k-held holder 5000 $MAX_LEASE_MS renew" >&7
  for _ in $(seq 200); do grep -q '"outcome":"granted"' "$WORK/holder.out" 2>/dev/null && break; sleep 0.05; done
  grep -q '"outcome":"granted"' "$WORK/holder.out" || { echo "the holder was not granted" >&2; exit 1; }
  for round in $(seq "$KILLS"); do
    line=$("$FAILOVER_BIN" --addrs "$(IFS=,; echo "${NODE_ADDR[*]}")" \
      --pids "$(IFS=,; echo "${NODE_PID[*]}")" --lease-ms "$MAX_LEASE_MS" --round "$round")
    echo "$line" | tee -a "$WORK/failover.txt"
    old=$(echo "$line" | awk '{ print $4 }')
    killed_at=$(echo "$line" | awk '{ print $7 }')
    # The first `renewed` the holder printed after the kill.
    renewed=""
    for _ in $(seq 600); do
      renewed=$(awk -v k="$killed_at" '$1 > k && /"event":"renewed"/ { print $1 - k; exit }' "$WORK/holder.out")
      [[ -n "$renewed" ]] && break
      sleep 0.05
    done
    echo "${renewed:-999999}" >>"$WORK/renewed"
    while kill -0 "${NODE_PID[$old]}" 2>/dev/null; do sleep 0.05; done
    start_node "$old"
    # The next kill once the restarted node follows (it names a leader).
    for _ in $(seq 600); do
      case "$(hello "${NODE_ADDR[$old]}")" in M*) break ;; esac
      sleep 0.1
    done
  done
  awk '$1=="FAILOVER" { print $6 }' "$WORK/failover.txt" | sort -n >"$WORK/leader"
  awk '$1=="FAILOVER" { print $2 }' "$WORK/failover.txt" | sort -n >"$WORK/grant"
  awk '$1=="FAILOVER" { print $3 }' "$WORK/failover.txt" | sort -n >"$WORK/reclaim"
  median() { awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }' "$1"; }
  sort -n "$WORK/renewed" -o "$WORK/renewed"
  lost=$(grep -c -E '"event":"lease_(lost|expired)"' "$WORK/holder.out" || true)
  echo
  echo "kill to a new leader (first W):              median $(median "$WORK/leader") ms, worst $(tail -1 "$WORK/leader") ms"
  echo "kill to the holder's first renewed on it:    median $(median "$WORK/renewed") ms, worst $(tail -1 "$WORK/renewed") ms ($lost lease_lost or lease_expired)"
  echo "kill to the first grant by the new leader:   median $(median "$WORK/grant") ms, worst $(tail -1 "$WORK/grant") ms"
  echo "kill to the first reclaim at the new leader: median $(median "$WORK/reclaim") ms, worst $(tail -1 "$WORK/reclaim") ms"
  echo "(TTL $TTL_MS ms: etcd drops the old leader's key up to a TTL after its last keep-alive;"
  echo " the new leader grants after its grace of $MAX_LEASE_MS + $MARGIN_MS ms; reclaims come in the grace)"
fi
