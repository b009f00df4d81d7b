#!/usr/bin/env bash
# A replicated cluster (PROTOCOL.md 4.3, `ticketing serve --raft-id`),
# measured; not a test. Three parts, each skippable:
#
# 1. Throughput: the e2e bench (benches/e2e.rs: C tasks on one connection,
#    try-lock a random key among $KEYS, release by token) against a plain
#    `ticketing serve` and against the leaders of two 3-member clusters,
#    one with its state directories on tmpfs ($TMPFS_DIR) and one on disk
#    ($DISK_DIR), interleaved: at each level $ROUNDS rounds of the three in
#    turn, the medians reported and each round's ratios (the machine's
#    figures move by a fifth between runs of a few seconds). The disk's sync latency
#    (write + fdatasync of 4 KiB, as a member syncs a record) is measured
#    first, and with it the bound 256 / (2 x sync) pairs/s at 256 tasks if
#    every commit cost one sync and no batching (a pair is two commits).
#    The acquire p50/p99 of the e2e bench at each level give the latency
#    replication adds.
# 2. Failover: $KILLS times, SIGKILL of the leader (benches/failover.rs,
#    which probes every 5 ms) with --election-timeout-ms $TIMEOUT_MS: the
#    time from the kill to the new leader's `leading` line (its term's
#    first entry committed), to its first `W`, to the first grant of a
#    never-held key, to the first renewal (X) of a grant the old leader
#    made; and whether a `ticketing client` holding a key with `renew`
#    (lease $HOLD_LEASE_MS) was renewed after every kill with its token
#    and never told lease_lost/lease_expired. After each kill a raw
#    client acquires and releases `again` on the new leader: its tokens
#    must increase. The killed member is started again from its state
#    directory and follows before the next kill.
# 3. Soak: $SOAK_SECS of the e2e bench at $SOAK_CONC tasks in a loop
#    against the leader of a cluster on $SOAK_DIR; every minute each state
#    directory's peak size and the leader's peak RSS (one sample a second)
#    and the file count; the growth of the peaks from minute 2 to the last.
#
# Builds release, starts the members on free loopback ports, stops by pid
# what it started.
#
# Environment: TIMEOUT_MS (1000) KILLS (10) HOLD_LEASE_MS (8000) SECS (5)
#   WARMUP (1) ROUNDS (3) CONC (1,16,256) KEYS (1000) TMPFS_DIR (/dev/shm)
#   DISK_DIR (/tmp) SOAK_SECS (600) SOAK_CONC (64) SOAK_DIR ($DISK_DIR)
#   SKIP_THROUGHPUT / SKIP_FAILOVER / SKIP_SOAK (unset) CARGO_TARGET_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
TIMEOUT_MS="${TIMEOUT_MS:-1000}"
ROUNDS="${ROUNDS:-3}"
KILLS="${KILLS:-10}"
HOLD_LEASE_MS="${HOLD_LEASE_MS:-8000}"
SECS="${SECS:-5}"
WARMUP="${WARMUP:-1}"
CONC="${CONC:-1,16,256}"
KEYS="${KEYS:-1000}"
TMPFS_DIR="${TMPFS_DIR:-/dev/shm}"
DISK_DIR="${DISK_DIR:-/tmp}"
SOAK_SECS="${SOAK_SECS:-600}"
SOAK_CONC="${SOAK_CONC:-64}"
SOAK_DIR="${SOAK_DIR:-$DISK_DIR}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
WORK="$(mktemp -d /tmp/ticketing-raft.XXXXXX)"
SINGLE_PID=""
HOLDER_PID=""
LOAD_PID=""
# Clusters by name: members 0..2 of cluster NAME are NAME0..NAME2.
declare -A PID ADDR RAFT DIR
CLUSTER_DIRS=()

# shellcheck source=benches/common.sh
source "$ROOT/benches/common.sh"
cleanup() {
  exec 7>&- 2>/dev/null || true
  stop_pid "$LOAD_PID"
  stop_pid "$HOLDER_PID"
  for pid in "${PID[@]:-}"; do stop_pid "$pid"; done
  stop_pid "$SINGLE_PID"
  for d in "${CLUSTER_DIRS[@]:-}"; do [[ -n "$d" ]] && rm -rf "$d"; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM


echo "== build (release)"
cargo build --release --quiet --features cli --bin ticketing
E2E_BIN=$(bench_bin e2e)
FAILOVER_BIN=$(bench_bin failover)
TICKETING="$TARGET_DIR/release/ticketing"
echo "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

hello() { # $1: addr; the first line a version 2 handshake gets
  timeout 2 bash -c "exec 3<>/dev/tcp/${1/:/\/}; printf 'H 2 bench -\n' >&3; head -1 <&3" 2>/dev/null || true
}
# again ADDR: acquire `again` (wait 0) and release it on ADDR; prints its
# token, or nothing.
again() {
  timeout 3 bash -c '
    exec 3<>/dev/tcp/'"${1/:/\/}"'
    printf "H 2 bench-again -\nA 1 again bench 0 5000\n" >&3
    read -r w <&3; read -r g <&3
    case "$g" in "G 1 A again "*) ;; *) exit 1 ;; esac
    t=$(echo "$g" | cut -d" " -f5)
    printf "R 2 again %s\n" "$t" >&3; read -r d <&3
    [[ "$d" == "D 2 R again" ]] && echo "$t"' 2>/dev/null || true
}

# A port for a member: free (common.sh), below the kernel's ephemeral
# range (the members' own outgoing peer links take ports there, and one
# may take a port chosen for a member not started yet), and not chosen
# before in this run.
USED_PORTS=" "
EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
member_port() {
  local p
  for _ in $(seq 500); do
    p=$(free_port)
    if (( p < EPHEMERAL_LOW )) && [[ "$USED_PORTS" != *" $p "* ]]; then
      USED_PORTS+="$p "
      echo "$p"
      return 0
    fi
  done
  echo "no free port below $EPHEMERAL_LOW" >&2; return 1
}

# new_cluster NAME BASEDIR: addresses and empty state directories for
# members NAME0..NAME2 under BASEDIR.
new_cluster() {
  local name="$1" base i p
  base=$(mktemp -d "$2/ticketing-raft-$name.XXXXXX")
  CLUSTER_DIRS+=("$base")
  for i in 0 1 2; do
    # Not in a command substitution: USED_PORTS must keep what it adds.
    member_port >"$WORK/port"; p=$(cat "$WORK/port"); ADDR[$name$i]="127.0.0.1:$p"
    member_port >"$WORK/port"; p=$(cat "$WORK/port"); RAFT[$name$i]="127.0.0.1:$p"
    DIR[$name$i]="$base/n$i"
  done
}
# Members authenticate each other always: by a credential drawn for the
# run (which main's builds take too, for side-by-side runs).
TICKETING_RAFT_CREDENTIAL="bench-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
export TICKETING_RAFT_CREDENTIAL

# start_member NAME I [--raft-new-cluster]
start_member() {
  local name="$1" i="$2" peers=() j
  shift 2
  for j in 0 1 2; do peers+=(--raft-peer "$((j + 1))=${ADDR[$name$j]}/${RAFT[$name$j]}"); done
  "$TICKETING" serve --listen "${ADDR[$name$i]}" --window 1024 --raft-id "$((i + 1))" \
    --raft-listen "${RAFT[$name$i]}" "${peers[@]}" --state-dir "${DIR[$name$i]}" \
    --election-timeout-ms "$TIMEOUT_MS" "$@" 2>>"$WORK/$name$i.err" &
  PID[$name$i]=$!
  # Killed on purpose: no job-control message when it dies.
  disown "${PID[$name$i]}"
}
start_cluster() { # NAME: every member, as a new cluster
  for i in 0 1 2; do start_member "$1" "$i" --raft-new-cluster; done
}
stop_cluster() { # NAME
  for i in 0 1 2; do stop_pid "${PID[$1$i]}"; unset "PID[$1$i]"; done
}
leader_index() { # NAME: waits for a leader that the others name; prints its index
  local name="$1" i j lead ok
  for _ in $(seq 600); do
    lead=""
    for i in 0 1 2; do
      if ! kill -0 "${PID[$name$i]}" 2>/dev/null; then
        echo "member $name$i is not running:" >&2; cat "$WORK/$name$i.err" >&2; return 1
      fi
    done
    for i in 0 1 2; do
      case "$(hello "${ADDR[$name$i]}")" in W*) lead="$i" ;; esac
    done
    if [[ -n "$lead" ]]; then
      ok=1
      for j in 0 1 2; do
        [[ "$j" == "$lead" ]] && continue
        [[ "$(hello "${ADDR[$name$j]}")" == "M ${ADDR[$name$lead]}" ]] || ok=""
      done
      [[ -n "$ok" ]] && { echo "$lead"; return 0; }
    fi
    sleep 0.1
  done
  echo "no leader in cluster $name" >&2; return 1
}
median() { sort -n "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
worst() { sort -n "$1" | tail -1; }

# sync_us DIR: microseconds per write of 4 KiB + fdatasync in DIR, as
# "p50 p99" over 300 syncs (python3, else dd oflag=dsync's average).
sync_us() {
  if command -v python3 >/dev/null; then
    python3 - "$1" <<'EOF'
import os, sys, time
path = os.path.join(sys.argv[1], "ticketing-sync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
block, samples = b"x" * 4096, []
for _ in range(300):
    t = time.perf_counter()
    os.write(fd, block)
    os.fdatasync(fd)
    samples.append((time.perf_counter() - t) * 1e6)
os.close(fd)
os.unlink(path)
samples.sort()
print(f"{samples[len(samples) // 2]:.0f} {samples[len(samples) * 99 // 100]:.0f}")
EOF
  else
    local f="$1/ticketing-sync-probe" s
    s=$(dd if=/dev/zero of="$f" bs=4k count=300 oflag=dsync 2>&1 | awk '/copied/ { print $(NF-3) }')
    rm -f "$f"
    awk -v s="$s" 'BEGIN { printf "%.0f %.0f\n", s / 300 * 1e6, s / 300 * 1e6 }'
  fi
}

if [[ -z "${SKIP_THROUGHPUT:-}" ]]; then
  echo "== sync latency (4 KiB write + fdatasync, 300 times)"
  read -r DISK_P50 DISK_P99 <<<"$(sync_us "$DISK_DIR")"
  read -r TMPFS_P50 TMPFS_P99 <<<"$(sync_us "$TMPFS_DIR")"
  echo "disk  $DISK_DIR ($(df --output=source,fstype "$DISK_DIR" | tail -1 | tr -s ' ')): p50 $DISK_P50 us, p99 $DISK_P99 us"
  echo "tmpfs $TMPFS_DIR ($(df --output=source,fstype "$TMPFS_DIR" | tail -1 | tr -s ' ')): p50 $TMPFS_P50 us, p99 $TMPFS_P99 us"
  awk -v s="$DISK_P50" 'BEGIN { printf "bound at 256 tasks, one sync per commit and no batching: 256 / (2 x %d us) = %.0f pairs/s\n", s, 256 / (2 * s / 1e6) }'

  echo "== throughput: a single server and the leaders (tmpfs, disk), ${SECS}s per level, K=$KEYS, election timeout $TIMEOUT_MS ms"
  "$TICKETING" serve --listen 127.0.0.1:0 --window 1024 2>"$WORK/single.err" &
  SINGLE_PID=$!
  SINGLE_ADDR=$(listening_addr "$WORK/single.err")
  new_cluster tmpfs "$TMPFS_DIR"; start_cluster tmpfs
  new_cluster disk "$DISK_DIR"; start_cluster disk
  TL=$(leader_index tmpfs); DL=$(leader_index disk)
  echo "single on $SINGLE_ADDR; tmpfs leader n$TL on ${ADDR[tmpfs$TL]} (${DIR[tmpfs$TL]}); disk leader n$DL on ${ADDR[disk$DL]} (${DIR[disk$DL]})"
  IFS=',' read -r -a LEVELS <<<"$CONC"
  : >"$WORK/tput.txt"
  for c in "${LEVELS[@]}"; do
    for round in $(seq "$ROUNDS"); do
      for target in single tmpfs disk; do
        case "$target" in
          single) addr="$SINGLE_ADDR" ;;
          tmpfs) addr="${ADDR[tmpfs$TL]}" ;;
          disk) addr="${ADDR[disk$DL]}" ;;
        esac
        "$E2E_BIN" --addr "$addr" --secs "$SECS" --warmup "$WARMUP" --conc "$c" --keys "$KEYS" \
          | awk -v t="$target" -v r="$round" '$1=="RESULT" { $2 = t; print $0, r }' >>"$WORK/tput.txt"
      done
    done
  done
  # RESULT NAME C pairs acq_p50 acq_p99 pair_p50 pair_p99 A/s contended
  # busy errors ROUND; f: the median over the rounds of column $3.
  f() {
    awk -v t="$1" -v c="$2" -v k="$3" '$1=="RESULT" && $2==t && $3==c { print $k }' "$WORK/tput.txt" \
      | sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
  }
  # ratios TARGET C: the target's pairs/s over the single server's, round by round.
  ratios() {
    awk -v t="$1" -v c="$2" '$1=="RESULT" && $3==c && $2=="single" { s[$13] = $4 }
      $1=="RESULT" && $3==c && $2==t { v[$13] = $4 }
      END { for (r = 1; r in v; r++) printf "%s%.2fx", (r > 1 ? " " : ""), (s[r] > 0 ? v[r] / s[r] : 0) }' "$WORK/tput.txt"
  }
  printf '| %4s | %14s | %14s | %14s | %6s | %6s | %22s | %22s | %22s |\n' C "single pairs/s" "tmpfs pairs/s" "disk pairs/s" "tmpfs" "disk" "single acq p50/p99 us" "tmpfs acq p50/p99 us" "disk acq p50/p99 us"
  printf '|------|----------------|----------------|----------------|--------|--------|------------------------|------------------------|------------------------|\n'
  for c in "${LEVELS[@]}"; do
    s=$(f single "$c" 4); t=$(f tmpfs "$c" 4); d=$(f disk "$c" 4)
    printf '| %4s | %14s | %14s | %14s | %5.2fx | %5.2fx | %22s | %22s | %22s |\n' "$c" "$s" "$t" "$d" \
      "$(awk -v a="$t" -v b="$s" 'BEGIN { print (b > 0) ? a / b : 0 }')" \
      "$(awk -v a="$d" -v b="$s" 'BEGIN { print (b > 0) ? a / b : 0 }')" \
      "$(f single "$c" 5)/$(f single "$c" 6)" "$(f tmpfs "$c" 5)/$(f tmpfs "$c" 6)" "$(f disk "$c" 5)/$(f disk "$c" 6)"
  done
  echo "(medians over $ROUNDS rounds, each round single, tmpfs, disk in turn; the ratios are the leader's pairs/s over the single server's; acquire latency added by replication = leader p50/p99 - single p50/p99)"
  for c in "${LEVELS[@]}"; do
    echo "C=$c round by round: tmpfs $(ratios tmpfs "$c"); disk $(ratios disk "$c")"
  done
  echo "errors (busy, errors+release misses): $(awk '$1=="RESULT" && ($11 || $12) { n++; printf "%s C=%s round %s: %s %s; ", $2, $3, $13, $11, $12 } END { if (!n) print "none" }' "$WORK/tput.txt")"
  # A commit as the disk leader's clients see it: its acquire p50 at the
  # lowest level (one task: nothing to batch with).
  commit_us=$(f disk "${LEVELS[0]}" 5)
  awk -v s="$commit_us" -v d="$(f disk 256 4)" 'BEGIN { if (s > 0) printf "bound at 256 tasks with a commit of %.0f us (the disk leader'"'"'s acquire p50 at C=1), no batching: 256 / (2 x %.0f us) = %.0f pairs/s; measured at 256: %s\n", s, s, 256 / (2 * s / 1e6), d }'
  awk -v s="$(f disk "${LEVELS[0]}" 5)" -v t="$(f single "${LEVELS[0]}" 5)" -v s9="$(f disk "${LEVELS[0]}" 6)" -v t9="$(f single "${LEVELS[0]}" 6)" \
    -v m="$(f tmpfs "${LEVELS[0]}" 5)" -v m9="$(f tmpfs "${LEVELS[0]}" 6)" \
    'BEGIN { printf "acquire latency added by replication at C=%s: tmpfs p50 +%.0f us, p99 +%.0f us; disk p50 +%.0f us, p99 +%.0f us\n", "'"${LEVELS[0]}"'", m - t, m9 - t9, s - t, s9 - t9 }'
  stop_pid "$SINGLE_PID"; SINGLE_PID=""
  stop_cluster tmpfs; stop_cluster disk
fi

if [[ -z "${SKIP_FAILOVER:-}" ]]; then
  echo "== failover: $KILLS SIGKILLs of the leader, election timeout $TIMEOUT_MS ms, state on $DISK_DIR"
  new_cluster fo "$DISK_DIR"; start_cluster fo
  lead=$(leader_index fo)
  : >"$WORK/failover.txt"; : >"$WORK/leading"; : >"$WORK/renewed"; : >"$WORK/tokens"
  # The holder: a `ticketing client` renewing one grant, its input kept
  # open, every output line stamped with the wall clock in ms.
  mkfifo "$WORK/holder.in"
  endpoints=()
  for i in 0 1 2; do endpoints+=(--endpoint "${ADDR[fo$i]}"); done
  (
    "$TICKETING" client --seed 1 "${endpoints[@]}" <"$WORK/holder.in" \
      | while IFS= read -r line; do printf '%s %s\n' "$(date +%s%3N)" "$line"; done >"$WORK/holder.out"
  ) &
  HOLDER_PID=$!
  exec 7>"$WORK/holder.in"
  echo "acquire held k-held holder 5000 $HOLD_LEASE_MS renew" >&7
  for _ in $(seq 200); do grep -q '"outcome":"granted"' "$WORK/holder.out" 2>/dev/null && break; sleep 0.05; done
  grep -q '"outcome":"granted"' "$WORK/holder.out" || { echo "the holder was not granted" >&2; exit 1; }
  HOLD_TOKEN=$(grep -o '"outcome":"granted".*' "$WORK/holder.out" | grep -o '"token":[0-9]*' | head -1 | cut -d: -f2)
  echo "holder granted k-held with token $HOLD_TOKEN"
  again "${ADDR[fo$lead]}" >>"$WORK/tokens"
  kept=0
  for round in $(seq "$KILLS"); do
    lead=$(leader_index fo)
    line=$("$FAILOVER_BIN" --addrs "${ADDR[fo0]},${ADDR[fo1]},${ADDR[fo2]}" \
      --pids "${PID[fo0]},${PID[fo1]},${PID[fo2]}" --lease-ms "$HOLD_LEASE_MS" --round "$round")
    old=$(echo "$line" | awk '{ print $4 }')
    new=$(echo "$line" | awk '{ print $5 }')
    killed_at=$(echo "$line" | awk '{ print $7 }')
    # The new leader's `leading` line of this failover.
    leading=""
    for _ in $(seq 100); do
      leading=$(sed -n 's/^leading (term \([0-9]*\), from entry [0-9]*; unix ms \([0-9]*\))$/\2 \1/p' "$WORK/fo$new.err" \
        | awk -v k="$killed_at" '$1 >= k { print $1 - k, $2; exit }')
      [[ -n "$leading" ]] && break
      sleep 0.05
    done
    echo "${leading%% *}" >>"$WORK/leading"
    # The holder's first `renewed` after the kill, and its token.
    renewed=""
    for _ in $(seq 400); do
      renewed=$(awk -v k="$killed_at" '$1 > k && /"event":"renewed"/ { print $1 - k, $0; exit }' "$WORK/holder.out")
      [[ -n "$renewed" ]] && break
      sleep 0.05
    done
    rtoken=$(echo "$renewed" | grep -o '"token":[0-9]*' | cut -d: -f2 || true)
    echo "${renewed%% *}" >>"$WORK/renewed"
    [[ -n "$renewed" && "$rtoken" == "$HOLD_TOKEN" ]] && kept=$((kept + 1))
    while kill -0 "${PID[fo$old]}" 2>/dev/null; do sleep 0.05; done
    start_member fo "$old"
    # `again` on whoever leads once the killed member follows (another
    # election may have followed the measured one).
    tok=""
    for _ in 1 2 3; do
      lead=$(leader_index fo)
      tok=$(again "${ADDR[fo$lead]}")
      [[ -n "$tok" ]] && break
    done
    echo "${tok:-missing}" >>"$WORK/tokens"
    echo "$line | leading after ${leading%% *} ms (term ${leading##* }) | holder renewed after ${renewed%% *} ms, token ${rtoken:-none} | again token ${tok:-none} on n$lead" \
      | tee -a "$WORK/failover.txt"
  done
  # FAILOVER grant_ms reclaim_ms old new W_ms killed_at
  awk '$1=="FAILOVER" { print $6 }' "$WORK/failover.txt" >"$WORK/w"
  awk '$1=="FAILOVER" { print $2 }' "$WORK/failover.txt" >"$WORK/grant"
  awk '$1=="FAILOVER" { print $3 }' "$WORK/failover.txt" >"$WORK/reclaim"
  lost=$(grep -c -E '"event":"lease_(lost|expired)"' "$WORK/holder.out" || true)
  # Compared as decimal strings: tokens are u64, beyond a double's 53 bits.
  increasing=$(awk 'function gt(a, b) { return length(a) != length(b) ? length(a) > length(b) : (a "") > (b "") }
    $1 == "missing" { miss++; next } n++ && !gt($1, prev) { bad = 1 } { prev = $1 }
    END { printf "%s%s", bad ? "NO" : "yes", miss ? " (" miss " missing)" : "" }' "$WORK/tokens")
  echo
  echo "kill to the new leader's leading line:      median $(median "$WORK/leading") ms, worst $(worst "$WORK/leading") ms"
  echo "kill to its first W:                        median $(median "$WORK/w") ms, worst $(worst "$WORK/w") ms"
  echo "kill to the first grant of a fresh key:     median $(median "$WORK/grant") ms, worst $(worst "$WORK/grant") ms (probed every 5 ms)"
  echo "kill to the first renewal (X) of a grant:   median $(median "$WORK/reclaim") ms, worst $(worst "$WORK/reclaim") ms"
  echo "kill to the holder's first renewed:         median $(median "$WORK/renewed") ms, worst $(worst "$WORK/renewed") ms (it renews a third of the way through its lease of $HOLD_LEASE_MS ms)"
  echo "holder kept k-held with token $HOLD_TOKEN after $kept of $KILLS kills; lease_lost or lease_expired: $lost"
  echo "tokens of \`again\` ($(wc -l <"$WORK/tokens") given, one before the kills and one after each): increasing: $increasing ($(tr '\n' ' ' <"$WORK/tokens"))"
  echo "bound 2 x election timeout + 0.5 s = $((2 * TIMEOUT_MS + 500)) ms"
  exec 7>&-
  stop_pid "$HOLDER_PID"; HOLDER_PID=""
  stop_cluster fo
fi

if [[ -z "${SKIP_SOAK:-}" ]]; then
  echo "== soak: ${SOAK_SECS}s of the e2e bench at $SOAK_CONC tasks against the leader, state on $SOAK_DIR, election timeout $TIMEOUT_MS ms"
  new_cluster soak "$SOAK_DIR"; start_cluster soak
  lead=$(leader_index soak)
  echo "leader n$lead pid ${PID[soak$lead]}"
  start_s=$(date +%s)
  end=$(( start_s + SOAK_SECS ))
  : >"$WORK/soak-load.txt"
  # The load: runs of at most 30 s, each against whoever leads when it
  # starts (a run whose leader steps down ends with an error, counted).
  (
    trap 'kill "$e2e" 2>/dev/null; exit 0' TERM
    e2e=""
    while (( $(date +%s) < end - 1 )); do
      left=$(( end - $(date +%s) )); (( left > 30 )) && left=30
      l=$(leader_index soak 2>/dev/null) || { sleep 0.2; continue; }
      "$E2E_BIN" --addr "${ADDR[soak$l]}" --secs "$left" --warmup 0 --conc "$SOAK_CONC" --keys "$KEYS" \
        >"$WORK/soak-run.txt" 2>"$WORK/soak-run.err" &
      e2e=$!
      if wait "$e2e"; then
        grep '^RESULT' "$WORK/soak-run.txt" | sed "s/^/$(date +%s) n$l /" >>"$WORK/soak-load.txt"
      else
        echo "$(date +%s) n$l FAILED $(grep -m1 -o 'reason: [A-Za-z]*' "$WORK/soak-run.err" || true)" >>"$WORK/soak-load.txt"
      fi
    done
  ) &
  LOAD_PID=$!
  # Each minute's peak of samples taken every second: a directory's size
  # is a sawtooth (a log segment fills, then a snapshot lets it go), so
  # one sample a minute says where the tooth was, not whether it grows.
  echo "(each column: the minute's peak of one sample a second; files: at the minute's end)"
  printf '| %3s | %12s | %12s | %12s | %14s | %12s | %s |\n' min "n0 bytes" "n1 bytes" "n2 bytes" "files n0/n1/n2" "leader RSS" "leader"
  printf '|-----|--------------|--------------|--------------|----------------|--------------|--------|\n'
  : >"$WORK/soak.txt"
  minute=0
  lead_now="$lead"
  while (( $(date +%s) < end )); do
    next=$(( start_s + 60 * (minute + 1) )); (( next > end )) && next=$end
    peak=(0 0 0); rss_peak=0
    while (( $(date +%s) < next )); do
      sleep 1 & wait $!
      for i in 0 1 2; do
        size=$(du -sb "${DIR[soak$i]}" 2>/dev/null | cut -f1); size=${size:-0}
        (( size > peak[i] )) && peak[i]=$size
      done
      rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/${PID[soak$lead_now]:-0}/status" 2>/dev/null || echo 0)
      (( ${rss:-0} > rss_peak )) && rss_peak=$rss
    done
    minute=$((minute + 1))
    files=()
    for i in 0 1 2; do
      files+=("$(find "${DIR[soak$i]}" -maxdepth 1 -name 'raft-*' | wc -l)")
    done
    lead_now=$(leader_index soak 2>/dev/null || echo "$lead_now")
    echo "$minute ${peak[*]} $rss_peak $lead_now" >>"$WORK/soak.txt"
    printf '| %3s | %12s | %12s | %12s | %14s | %9s kB | %s |\n' "$minute" "${peak[0]}" "${peak[1]}" "${peak[2]}" \
      "${files[0]}/${files[1]}/${files[2]}" "$rss_peak" "n$lead_now"
  done
  stop_pid "$LOAD_PID"; LOAD_PID=""
  for i in 0 1 2; do echo "files in n$i: $(cd "${DIR[soak$i]}" && ls | tr '\n' ' ')"; done
  awk '$1 == 2 { for (i = 2; i <= 5; i++) base[i] = $i } { for (i = 2; i <= 5; i++) last[i] = $i; m = $1 }
    function pct(a, b) { return b > 0 ? 100 * (a - b) / b : 0 }
    END { if (m > 2) printf "growth of the peaks from minute 2 to %d: n0 %+d B (%+.1f%%), n1 %+d B (%+.1f%%), n2 %+d B (%+.1f%%), RSS of the leader %+d kB (%+.1f%%) (the member that led: last column)\n", m, last[2] - base[2], pct(last[2], base[2]), last[3] - base[3], pct(last[3], base[3]), last[4] - base[4], pct(last[4], base[4]), last[5] - base[5], pct(last[5], base[5]) }' "$WORK/soak.txt"
  # RESULT lines: unix_s member RESULT NAME C pairs ...
  awk '$3 == "RESULT" { n++; p += $6; e += $14 } $3 == "FAILED" { f++ } END { printf "load: %d runs of up to 30 s, mean %.0f pairs/s, %d errors; %d runs ended by a leader change or an error\n", n, n ? p / n : 0, e, f }' "$WORK/soak-load.txt"
  echo "leading lines in the soak, the first election included (no fault injected): $(cat "$WORK"/soak?.err | grep -c '^leading')"
  for i in 0 1 2; do
    grep -E '^(leading|following|no leader)' "$WORK/soak$i.err" | sed "s/^/  n$i: /"
  done
  stop_cluster soak
fi
