#!/usr/bin/env bash
# The round trip of an established TLS connection to `ticketing serve`,
# alone and under a flood of TLS handshakes against an RSA-4096 certificate
# (issue 20; the method is in benches/tls_flood.rs): what handshake crypto
# costs the connections that are already up.
#
# Builds release (the binary and the bench), makes an RSA-4096 CA and server
# certificate with openssl, starts `ticketing serve --tls-cert --tls-key` on
# a free loopback port and runs tls_flood against it. With OLD_BIN set to an
# older build of the binary, each round runs against both, one after the
# other on fresh servers, so that the two are compared in one run.
#
# Environment: SECS (5, each phase) ROUNDS (2) FLOODERS (4)
#   BIN (the release build of this tree) OLD_BIN (none)
#   CARGO_TARGET_DIR (target/ of this repo, as cargo has it)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

SECS="${SECS:-5}"
ROUNDS="${ROUNDS:-2}"
FLOODERS="${FLOODERS:-4}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="${BIN:-$TARGET_DIR/release/ticketing}"
OLD_BIN="${OLD_BIN:-}"
WORK="$(mktemp -d /tmp/ticketing-tls-flood.XXXXXX)"
SERVE_PID=""

# shellcheck source=benches/common.sh
source "$ROOT/benches/common.sh"
cleanup() {
  stop_pid "$SERVE_PID"; SERVE_PID=""
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

command -v openssl >/dev/null || { echo "openssl missing: it makes the RSA-4096 certificate" >&2; exit 1; }

echo "== build (release)"
cargo build --release --quiet --features cli --bin ticketing --bench tls_flood
FLOOD_BIN=$(cargo build --release --quiet --features cli --bench tls_flood --message-format=json \
  | grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//' | grep '/tls_flood-' | tail -1)
[[ -x "$FLOOD_BIN" ]] || { echo "cannot find the tls_flood bench binary" >&2; exit 1; }

echo "== certificates (RSA-4096)"
openssl req -x509 -newkey rsa:4096 -nodes -days 2 -subj "/CN=tls-flood CA" \
  -keyout "$WORK/ca.key" -out "$WORK/ca.pem" 2>/dev/null
openssl req -newkey rsa:4096 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$WORK/server.key" -out "$WORK/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
  > "$WORK/server.ext"
openssl x509 -req -in "$WORK/server.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" \
  -CAcreateserial -days 2 -extfile "$WORK/server.ext" -out "$WORK/server.pem" 2>/dev/null

# Runs round $3 against the binary $1, labelled $2.
round() {
  local bin="$1" label="$2" log="$WORK/serve-$2-$3.log" port
  port=$(free_port)
  "$bin" serve --listen "127.0.0.1:$port" --tls-cert "$WORK/server.pem" \
    --tls-key "$WORK/server.key" 2>"$log" &
  SERVE_PID=$!
  for _ in $(seq 100); do grep -q "listening on" "$log" && break; sleep 0.05; done
  grep -q "listening on" "$log" || { echo "the $label server did not start:" >&2; cat "$log" >&2; exit 1; }
  "$FLOOD_BIN" --addr "127.0.0.1:$port" --tls-ca "$WORK/ca.pem" --secs "$SECS" \
    --flooders "$FLOODERS" --rounds 1 --first-round "$3" --label "$label" \
    | tee -a "$WORK/results"
  stop_pid "$SERVE_PID"; SERVE_PID=""
}

for r in $(seq "$ROUNDS"); do
  echo "== round $r of $ROUNDS"
  round "$BIN" new "$r"
  if [[ -n "$OLD_BIN" ]]; then round "$OLD_BIN" old "$r"; fi
done

echo "== p50 / p99 round trip in µs, and handshakes/s answered, per build and phase"
grep '^RESULT' "$WORK/results" | awk '
  { key = $2 " " $3; n[key]++; p50[key] = p50[key] " " $6; p99[key] = p99[key] " " $7; hs[key] = hs[key] " " $9 }
  END { for (k in n) printf "%-12s p50%s | p99%s | handshakes/s%s\n", k, p50[k], p99[k], hs[k] }' | sort
