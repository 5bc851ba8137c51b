#!/usr/bin/env bash
# The SQLite pages a round trip writes to the WAL, by the B-tree they belong to: the figures the README gives as
# "WAL frames a trip". Runs toolgate-bench against the given binary under strace, keeps every frame header the
# server wrote to its WAL (a frame is a 24-byte header, then the page; the server writes a commit's frames with one
# pwrite64, in pieces of at most 124 KiB, so the headers are read at the frames' places within each write), and
# names each frame's page from the finished database's dbstat table. Slow (strace records every byte written) and
# for reading, not for timing.
#
#   bench/wal-frames.sh TOOLGATE_BINARY [SCENARIO] [TRIPS] [CONCURRENCY]
#     SCENARIO     roundtrip (the approval API, the default) or agui-roundtrip
#     TRIPS        measured trips (default 200), after 10 warm-up trips that are counted in neither figure
#     CONCURRENCY  trips in flight at once (default 1)
#
# Needs strace, python3 with its sqlite3 module, and the release build of toolgate-bench (cargo build --release
# -p bench).
set -euo pipefail

die() { echo "wal-frames: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 TOOLGATE_BINARY [roundtrip|agui-roundtrip] [TRIPS] [CONCURRENCY]"
BINARY=$(realpath "$1") || die "no such binary: $1"
SCENARIO=${2:-roundtrip}
TRIPS=${3:-200}
CONCURRENCY=${4:-1}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BENCH="$HERE/target/release/toolgate-bench"
[ -x "$BINARY" ] || die "not an executable: $BINARY"
[ -x "$BENCH" ] || die "no $BENCH: build it with cargo build --release -p bench"
command -v strace >/dev/null || die "strace is not installed"
python3 -c 'import sqlite3' 2>/dev/null || die "python3 with its sqlite3 module is needed"

OUT=$(mktemp -d "${TMPDIR:-/tmp}/wal-frames.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
# toolgate-bench starts the server itself: a wrapper starts it, attaches strace to its threads, and passes the
# bench's SIGTERM on to it (strace in front of the server would take the signal and leave the server running).
cat > "$OUT/server.sh" <<EOF
#!/bin/sh
"$BINARY" "\$@" &
server=\$!
trap 'kill -TERM \$server' TERM INT
strace -f -e trace=pwrite64 -s 131072 -xx -o "$OUT/pwrite.trace" -p \$server 2>/dev/null &
while kill -0 \$server 2>/dev/null; do wait \$server; done
wait
EOF
chmod +x "$OUT/server.sh"

# The bench makes the database's directory in TMPDIR: a private one, so that the database is the one found there.
mkdir "$OUT/tmp"
TMPDIR="$OUT/tmp" "$BENCH" --server "$OUT/server.sh" --scenarios "$SCENARIO" --stores sqlite \
    --concurrency "$CONCURRENCY" --trips "$TRIPS" --rounds 1 --warmup 10 --keep-workdir --tmpdir "$OUT/tmp" \
    --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1 || die "toolgate-bench failed: $(tail -5 "$OUT/bench.log")"
sleep 0.5
DATABASE=$(ls -d "$OUT"/tmp/toolgate-bench-db-*/toolgate.db 2>/dev/null | head -1)
[ -n "$DATABASE" ] || die "cannot find the database the bench kept (see $OUT/bench.log)"

python3 - "$OUT/pwrite.trace" "$DATABASE" "$((TRIPS + 10))" "$SCENARIO" "$CONCURRENCY" <<'PY'
import collections, re, sqlite3, sys

trace, database, trips, scenario, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
try:
    page_owner = {page: name for name, page in connection.execute("SELECT name, pageno FROM dbstat")}
except sqlite3.OperationalError as error:
    sys.exit(f"wal-frames: this python's SQLite has no dbstat table ({error})")

page_size = connection.execute("PRAGMA page_size").fetchone()[0]
frame_size = 24 + page_size
# A write: the file, its bytes as strace shows them (each byte \xNN), how many, and where in the file.
write = re.compile(r'pwrite64\((\d+), "((?:\\x[0-9a-f]{2})*)"\.*, (\d+), (\d+)\)')
writes = [(m.group(1), m.group(2), int(m.group(3)), int(m.group(4))) for m in map(write.search, open(trace)) if m]

def headers_in(shown, count, offset):
    """The frame headers a write of `count` bytes at `offset` holds: frames start at 32 + k * frame_size."""
    k = max(0, -(-(offset - 32) // frame_size))
    while 32 + k * frame_size + 8 <= offset + count:
        at = 32 + k * frame_size - offset
        if 4 * (at + 8) > len(shown):
            break
        yield bytes(int(shown[4 * i + 2:4 * i + 4], 16) for i in range(at, at + 8))
        k += 1

# The WAL is the file whose writes hold frame headers (the database's own writes, at multiples of the page size,
# do not start at a frame's place).
per_fd = collections.Counter(fd for fd, _, count, offset in writes if (offset - 32) % frame_size in (0, 24) and offset >= 32)
if not per_fd:
    sys.exit("wal-frames: the server wrote no WAL frame header")
wal_fd = per_fd.most_common(1)[0][0]
frames = []
for fd, shown, count, offset in writes:
    if fd != wal_fd:
        continue
    for raw in headers_in(shown, count, offset):
        # A frame header: the page number, then the database's size in pages after a commit (0 for other frames).
        frames.append((int.from_bytes(raw[0:4], "big"), int.from_bytes(raw[4:8], "big")))
commits = sum(1 for _, size in frames if size)
print(f"{scenario}, concurrency {concurrency}, {trips} trips with the warm-up: "
      f"{len(frames) / trips:.1f} WAL frames a trip, {commits / trips:.2f} commits a trip, "
      f"{len(frames) / max(commits, 1):.1f} frames a commit")
by_tree = collections.Counter(page_owner.get(page, "(freed since)") for page, _ in frames)
print("by B-tree, frames a trip: " + ", ".join(f"{name} {count / trips:.1f}" for name, count in by_tree.most_common()))
PY
