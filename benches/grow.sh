#!/usr/bin/env bash
# A replicated cluster grown from 3 members to 5 and shrunk back to 3
# under load (PROTOCOL.md 4.4, `ticketing cluster add|remove`), measured;
# not a test. Throughput of the e2e bench (benches/e2e.rs) at $CONC tasks
# through the leader, at 3 members, at 5 and at 3 again, each phase's
# rounds alternated with a single `ticketing serve` in the same run; and
# how long each change took while the load ran (add: until the member
# votes; remove: until it is out).
#
#   bash benches/grow.sh
#
# Environment: SECS (5) WARMUP (1) ROUNDS (3) CONC (256) KEYS (1000)
#   TIMEOUT_MS (1000) STATE_DIR (/dev/shm) CARGO_TARGET_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
SECS="${SECS:-5}"
WARMUP="${WARMUP:-1}"
ROUNDS="${ROUNDS:-3}"
CONC="${CONC:-256}"
KEYS="${KEYS:-1000}"
TIMEOUT_MS="${TIMEOUT_MS:-1000}"
STATE_DIR="${STATE_DIR:-/dev/shm}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
WORK="$(mktemp -d /tmp/ticketing-grow.XXXXXX)"
BASE="$(mktemp -d "$STATE_DIR/ticketing-grow.XXXXXX")"
# shellcheck source=benches/common.sh
source "$ROOT/benches/common.sh"
declare -A ADDR RAFT PID
SINGLE_PID=""
LOAD_PID=""
cleanup() {
  stop_pid "$LOAD_PID"
  stop_pid "$SINGLE_PID"
  for i in "${!PID[@]}"; do stop_pid "${PID[$i]}"; done
  rm -rf "$WORK" "$BASE"
}
trap cleanup EXIT INT TERM

cargo build --release --quiet --features cli --bin ticketing
TICKETING="$TARGET_DIR/release/ticketing"
E2E="$(bench_bin e2e)"

for i in 1 2 3 4 5; do
  ADDR[$i]="127.0.$i.1:$(free_port)"
  RAFT[$i]="127.0.$i.1:$(free_port)"
done
peers() { # the --raft-peer options of members $@
  local i
  for i in "$@"; do printf -- '--raft-peer %s=%s/%s ' "$i" "${ADDR[$i]}" "${RAFT[$i]}"; done
}
start_member() { # ID START-FLAG PEER-IDS...
  local id="$1" flag="$2"
  shift 2
  # shellcheck disable=SC2046
  "$TICKETING" serve --listen "${ADDR[$id]}" --window 1024 --raft-id "$id" \
    --raft-listen "${RAFT[$id]}" $(peers "$@") --state-dir "$BASE/n$id" --raft-insecure \
    --election-timeout-ms "$TIMEOUT_MS" "$flag" 2>>"$WORK/n$id.err" &
  PID[$id]=$!
  disown "${PID[$id]}"
}
cluster() { # ticketing cluster ARGS... through every member started
  local args=() i
  for i in "${!PID[@]}"; do args+=(--endpoint "${ADDR[$i]}"); done
  "$TICKETING" cluster "$@" "${args[@]}"
}
leader_addr() {
  local json
  for _ in $(seq 100); do
    json=$(cluster status 2>/dev/null || true)
    addr=$(python3 -c '
import json, sys
s = json.loads(sys.argv[1])
lead = [m["client"] for m in s["members"] if m["id"] == s.get("leader") and m["role"] == "leader"]
print(lead[0] if lead else "")' "$json" 2>/dev/null || true)
    [[ -n "$addr" ]] && { echo "$addr"; return 0; }
    sleep 0.1
  done
  echo "no leader" >&2; return 1
}
run_e2e() { # ADDR: pairs/s
  "$E2E" --addr "$1" --secs "$SECS" --warmup "$WARMUP" --conc "$CONC" --keys "$KEYS" \
    | awk '$1=="RESULT" { print $4 }'
}
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

"$TICKETING" serve --listen 127.0.0.1:0 --window 1024 2>"$WORK/single.err" &
SINGLE_PID=$!
SINGLE=$(listening_addr "$WORK/single.err")
for i in 1 2 3; do start_member "$i" --raft-new-cluster 1 2 3; done
leader_addr >/dev/null

phase() { # NAME: ROUNDS alternated rounds of the single server and the leader
  local r s l
  for r in $(seq "$ROUNDS"); do
    if (( r % 2 )); then
      s=$(run_e2e "$SINGLE"); l=$(run_e2e "$(leader_addr)")
    else
      l=$(run_e2e "$(leader_addr)"); s=$(run_e2e "$SINGLE")
    fi
    echo "$1 round $r: single $s, leader $l pairs/s"
    echo "$s" >>"$WORK/$1.single"; echo "$l" >>"$WORK/$1.leader"
  done
}
median() { sort -n "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
load() { # the e2e bench through the leader, for the length of a change
  "$E2E" --addr "$(leader_addr)" --secs 60 --warmup 0 --conc "$CONC" --keys "$KEYS" >/dev/null 2>&1 &
  LOAD_PID=$!
}

phase three
load
for i in 4 5; do
  start_member "$i" --raft-join 1 2 3 4 5
  t=$(date +%s%N)
  cluster add "$i=${ADDR[$i]}/${RAFT[$i]}" >"$WORK/add$i.json" || { cat "$WORK/add$i.json" "$WORK/n$i.err" >&2; exit 1; }
  echo "add member $i (under load): $(ms_since "$t") ms until it voted: $(cat "$WORK/add$i.json")"
done
stop_pid "$LOAD_PID"; LOAD_PID=""
phase five
load
for i in 4 5; do
  t=$(date +%s%N)
  cluster remove "$i" >"$WORK/remove$i.json"
  echo "remove member $i (under load): $(ms_since "$t") ms until out: $(cat "$WORK/remove$i.json")"
  stop_pid "${PID[$i]}"; unset "PID[$i]"
done
stop_pid "$LOAD_PID"; LOAD_PID=""
phase three-again

echo
printf '| %-11s | %14s | %14s | %6s |\n' members "single pairs/s" "leader pairs/s" ratio
printf '|-------------|----------------|----------------|--------|\n'
for p in three five three-again; do
  s=$(median "$WORK/$p.single"); l=$(median "$WORK/$p.leader")
  printf '| %-11s | %14s | %14s | %5.2fx |\n' "$p" "$s" "$l" "$(awk -v l="$l" -v s="$s" 'BEGIN { print l / s }')"
done
