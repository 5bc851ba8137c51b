#!/bin/bash
# Side by side, in one time window: server CPU per verified AG-UI approval round trip of toolgate, of TanStack AI 0.58
# on Node (the peer: tanstack/server.mjs) and of the transport floor (floor/: a minimal hyper server that speaks the
# same exchange with the least honest work). load.mjs drives each in turn, A B C A B C..., and reads server CPU from
# /proc/PID/stat. Machines are noisy: compare only figures from one run of this script.
#
#   side-by-side.sh TOOLGATE_BINARY [extra toolgate flags...]
#   env: PAIRS=3 DURATION=5 WARMUP=2 C=32 OUT=<temp dir> MEMORY=1
# toolgate runs with its default store (a SQLite file in its temporary directory, on the disk); with MEMORY=1 (the
# default) a second toolgate with `--database-url memory` joins the rotation, so durability's cost is measured in
# the same window.
# Needs node and cargo; installs the peer's npm packages (tanstack/package-lock.json) and builds the floor on first use.
# Last line: "side-by-side: toolgate X ms CPU/trip, tanstack Y ms, floor F ms; tanstack/toolgate R, toolgate/floor Q".
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${1:?usage: side-by-side.sh TOOLGATE_BINARY [toolgate flags...]}; shift
# Absolute: each server starts from a temporary directory of its own.
[ -x "$BIN" ] || { echo "side-by-side: no toolgate binary at $BIN"; exit 1; }
BIN=$(realpath "$BIN")
PAIRS=${PAIRS:-3}; DURATION=${DURATION:-5}; WARMUP=${WARMUP:-2}; C=${C:-32}; MEMORY=${MEMORY:-1}
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM
die() { echo "side-by-side: $*"; exit 1; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 1 150); do curl -fsS "$1/healthz" >/dev/null 2>&1 && return 0; sleep 0.1; done; return 1; }

[ -d "$HERE/tanstack/node_modules/@tanstack/ai" ] || (cd "$HERE/tanstack" && npm ci --no-audit --no-fund >"$OUT/npm-ci.log" 2>&1) || die "npm ci failed; see $OUT/npm-ci.log"
(cd "$HERE/floor" && cargo build --release --quiet >"$OUT/floor-build.log" 2>&1) || die "the floor did not build; see $OUT/floor-build.log"

TS_PORT=$(port); (cd "$HERE/tanstack" && PORT=$TS_PORT HOST=127.0.0.1 exec node server.mjs >"$OUT/tanstack.log" 2>&1) & TS_PID=$!; PIDS+=("$TS_PID")
FL_PORT=$(port); (PORT=$FL_PORT exec "$HERE/floor/target/release/agui-floor" >"$OUT/floor.log" 2>&1) & FL_PID=$!; PIDS+=("$FL_PID")
# The load client opens a new thread (session) for every trip: at the `memory` store's pace the default bound of
# 100,000 sessions is passed within one run, and every later trip is refused with SERVER_FULL. Flags given to this
# script come after, so they win.
BOUNDS=(--max-sessions 100000000)
TG_PORT=$(port); TG_DIR=$(mktemp -d); mkdir -p "$TG_DIR/ws"
(cd "$TG_DIR" && exec "$BIN" --addr "127.0.0.1:$TG_PORT" --workspace "$TG_DIR/ws" "${BOUNDS[@]}" "$@" >"$OUT/toolgate.log" 2>&1) & TG_PID=$!; PIDS+=("$TG_PID")
if [ "$MEMORY" = 1 ]; then
  TM_PORT=$(port); TM_DIR=$(mktemp -d); mkdir -p "$TM_DIR/ws"
  (cd "$TM_DIR" && exec "$BIN" --addr "127.0.0.1:$TM_PORT" --workspace "$TM_DIR/ws" --database-url memory "${BOUNDS[@]}" "$@" >"$OUT/toolgate-memory.log" 2>&1) & TM_PID=$!; PIDS+=("$TM_PID")
  wait_up "http://127.0.0.1:$TM_PORT" || die "toolgate (memory) did not start; see $OUT/toolgate-memory.log"
fi
wait_up "http://127.0.0.1:$TS_PORT" || die "the TanStack peer did not start; see $OUT/tanstack.log"
wait_up "http://127.0.0.1:$FL_PORT" || die "the floor did not start; see $OUT/floor.log"
wait_up "http://127.0.0.1:$TG_PORT" || die "toolgate did not start; see $OUT/toolgate.log"
sleep 1 # the peer's devtools middleware retries a bus connection for about 1.8 s after start
echo "results in $OUT; $PAIRS rounds, ${WARMUP}s warm-up + ${DURATION}s measured, C=$C"

load() { # NAME PROFILE URL PID ROUND EXTRA...
  local name=$1 profile=$2 url=$3 pid=$4 i=$5; shift 5
  kill -0 "$pid" 2>/dev/null || { echo "$name (pid $pid) is not running"; return 3; }
  node "$HERE/load.mjs" --profile "$profile" --url "$url" -c "$C" -d "$DURATION" -w "$WARMUP" --server-pid "$pid" \
    --json "$OUT/$name-$i.json" --label "$name $i/$PAIRS" "$@"
}
for i in $(seq 1 "$PAIRS"); do
  load toolgate toolgate "http://127.0.0.1:$TG_PORT/api/agui" "$TG_PID" "$i" --workspace "$TG_DIR/ws" || echo "  (toolgate round $i exited $?)"
  load tanstack tanstack "http://127.0.0.1:$TS_PORT/api/chat" "$TS_PID" "$i" || echo "  (tanstack round $i exited $?)"
  load floor tanstack "http://127.0.0.1:$FL_PORT/api/chat" "$FL_PID" "$i" || echo "  (floor round $i exited $?)"
  if [ "$MEMORY" = 1 ]; then
    load toolgate-memory toolgate "http://127.0.0.1:$TM_PORT/api/agui" "$TM_PID" "$i" --workspace "$TM_DIR/ws" || echo "  (toolgate-memory round $i exited $?)"
  fi
done

node -e '
const fs = require("fs")
const [out, pairs, memory] = process.argv.slice(1)
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2 }
const fmt = (x, d = 3) => (Number.isFinite(x) ? +x.toFixed(d) : NaN)
const side = (name) => {
  const runs = []; let missing = 0
  for (let i = 1; i <= Number(pairs); i++) { try { runs.push(JSON.parse(fs.readFileSync(`${out}/${name}-${i}.json`, "utf8"))) } catch { missing++ } }
  const cpu = runs.map((r) => r.completed > 0 ? Math.max(r.server.cpu_s, 0.01) * 1000 / r.completed : NaN)
  const s = { name, missing, errors: runs.reduce((a, r) => a + r.errors_total, 0), completed: runs.reduce((a, r) => a + r.completed, 0),
    cpu, cpuMedian: median(cpu), tps: median(runs.map((r) => r.round_trips_per_s)), p50: median(runs.map((r) => r.latency_ms.round_trip.p50)),
    p99: median(runs.map((r) => r.latency_ms.round_trip.p99)), rssIdle: runs[0]?.server.rss_idle_MiB, rssPeak: Math.max(...runs.map((r) => r.server.rss_peak_during_MiB)) }
  console.log(`${name.padEnd(8)}: CPU ms/trip ${s.cpu.map((x) => fmt(x, 4)).join(", ")} -> median ${fmt(s.cpuMedian, 4)}; trips/s ${s.tps}; ` +
    `rt p50 ${s.p50} ms, p99 ${s.p99} ms; RSS idle ${s.rssIdle} MiB, peak ${s.rssPeak} MiB; ${s.completed} trips, ${s.errors} failed, ${s.missing} rounds missing`)
  return s
}
const tg = side("toolgate"), ts = side("tanstack"), fl = side("floor")
const tm = memory === "1" ? side("toolgate-memory") : null
const bad = [tg, ts, fl, ...(tm ? [tm] : [])].filter((s) => s.errors || s.missing).map((s) => `${s.name}: ${s.errors} failed, ${s.missing} missing`)
console.log(`side-by-side: toolgate ${fmt(tg.cpuMedian, 4)} ms CPU/trip, tanstack ${fmt(ts.cpuMedian, 4)} ms, floor ${fmt(fl.cpuMedian, 4)} ms; ` +
  `tanstack/toolgate ${fmt(ts.cpuMedian / tg.cpuMedian, 2)}, toolgate/floor ${fmt(tg.cpuMedian / fl.cpuMedian, 2)}` +
  (tm ? `; memory store ${fmt(tm.cpuMedian, 4)} ms: tanstack/memory ${fmt(ts.cpuMedian / tm.cpuMedian, 2)}, memory/floor ${fmt(tm.cpuMedian / fl.cpuMedian, 2)}, ` +
    `durable/memory ${fmt(tg.cpuMedian / tm.cpuMedian, 2)}` : "") + (bad.length ? `; UNVERIFIED: ${bad.join("; ")}` : ""))
process.exit(bad.length ? 1 : 0)
' "$OUT" "$PAIRS" "$MEMORY"
