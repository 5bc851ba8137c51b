#!/usr/bin/env bash
# Two toolgate instances on one PostgreSQL, the way a team runs them behind a load balancer: a throwaway PostgreSQL
# from the machine's own packages (initdb into a temporary directory, listening on a unix socket there), then the
# built binary twice, each started by serve.sh, on PORT_A and PORT_B. Everything stops with this
# script when a signal it can catch ends it (the browser tests send SIGTERM); after a SIGKILL the next run removes
# what is left.
#   serve-two.sh BINARY PORT_A PORT_B [toolgate options...]
set -euo pipefail
here=$(dirname "$(realpath "$0")")
binary=$(realpath "$1")
port_a=$2
port_b=$3
shift 3

pg_bin=${TOOLGATE_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$pg_bin/initdb" ] || { echo "serve-two.sh: no PostgreSQL server under /usr/lib/postgresql (scripts/bootstrap.sh installs it)" >&2; exit 1; }

# An earlier run ended by SIGKILL (as the browser tests end their servers) could not clean up: its directory goes.
rm -rf "${TMPDIR:-/tmp}"/toolgate-e2e-pg-"$port_a".*
dir=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-e2e-pg-$port_a.XXXXXX")
as_server=()
if [ "$(id -u)" = 0 ]; then
  # initdb and postgres refuse to run as root.
  chown postgres: "$dir"
  as_server=(runuser -u postgres --)
fi

postgres_pid=
toolgate_pids=()
# The instances first (SIGTERM: they hand their waiting runs over), then PostgreSQL (SIGINT: its fast shutdown,
# which does not wait for clients), each given a few seconds before SIGKILL.
stop() {
  local pid killer
  for pid in "${toolgate_pids[@]}" $postgres_pid; do
    if [ "$pid" = "$postgres_pid" ]; then kill -INT "$pid" 2>/dev/null || true; else kill "$pid" 2>/dev/null || true; fi
    (sleep 5; kill -KILL "$pid" 2>/dev/null) &
    killer=$!
    wait "$pid" 2>/dev/null || true
    kill "$killer" 2>/dev/null || true
  done
  rm -rf "$dir"
}
trap stop EXIT
trap 'exit 143' TERM INT

"${as_server[@]}" "$pg_bin/initdb" -D "$dir/data" -U toolgate --auth=trust -E UTF8 >/dev/null
# No TCP: the socket in the directory only. -c keeps the cluster small for a test.
"${as_server[@]}" "$pg_bin/postgres" -D "$dir/data" -k "$dir" -c listen_addresses= -c fsync=off \
  -c max_connections=60 >"$dir/postgres.log" 2>&1 &
postgres_pid=$!
for _ in $(seq 100); do
  "$pg_bin/pg_isready" -q -h "$dir" -U toolgate && break
  sleep 0.1
done
"$pg_bin/pg_isready" -q -h "$dir" -U toolgate || { cat "$dir/postgres.log" >&2; exit 1; }

url="postgres://toolgate@localhost/postgres?host=$dir"
instance() {
  local port=$1
  shift
  # As every browser-test server starts: copied alone into an empty directory (serve.sh execs the binary).
  "$here/serve.sh" "$binary" "$port" --database-url "$url" "$@" &
  toolgate_pids+=($!)
  for _ in $(seq 600); do
    curl -fsS -m 2 "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "serve-two.sh: the instance on port $port did not start" >&2
  exit 1
}
# One after the other: the first applies the migrations.
instance "$port_a" "$@"
instance "$port_b" "$@"
wait
