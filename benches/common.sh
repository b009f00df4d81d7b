# Shell helpers of the benchmark scripts (sourced by each of them).

# Stops process $1 (TERM, then KILL after 5 s) and reaps it.
stop_pid() {
  local pid="$1"
  [[ -n "$pid" ]] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

# A loopback port nobody listens on (bash's /dev/tcp: a refused connect).
free_port() {
  local p
  for _ in $(seq 200); do
    p=$(( 20000 + RANDOM % 30000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  echo "no free port found" >&2; return 1
}

# The address `ticketing serve` said on its stderr, file $1 ("listening on
# ADDR"), waited for up to 5 s; nothing if it did not say it.
listening_addr() {
  local addr=""
  for _ in $(seq 100); do
    addr=$(sed -n 's/^listening on //p' "$1"); [[ -n "$addr" ]] && break; sleep 0.05
  done
  echo "$addr"
}

bench_bin() { # the executable of release bench $1
  cargo build --release --quiet --features cli --bench "$1" --message-format=json \
    | grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//' | grep "/$1-" | tail -1
}
