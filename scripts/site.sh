#!/usr/bin/env bash
# Builds the release binary with the site embedded: the page (wasm, js, css, public files) into target/site, then
# the server, which embeds target/site.
#
# cargo-leptos writes every file of the site again on each build, even when its bytes did not change, and the
# server's build script reruns on the site's modification times (cargo offers nothing else): with nothing changed,
# the server (whole-program LTO) was compiled again, about five minutes on 2 cores. So the page is built first, the
# files and folders whose contents it did not change get their old modification times back, and the server is built
# after: cargo rebuilds it only when the site really changed (a file's bytes, decompressed for a gzip file, or a
# folder's list of names).
set -euo pipefail

cd "$(dirname "$0")/.."
SITE=target/site
saved=$(mktemp)
trap 'rm -f "$saved"' EXIT

# stamps save|restore FILE: what target/site holds (each path, a digest of its contents, its modification time),
# saved before the page's build; restored after it for what is the same.
stamps() {
  python3 - "$1" "$SITE" "$2" <<'PY'
import gzip, hashlib, json, os, sys, zlib

action, site, saved = sys.argv[1:]

def digest(path):
    if os.path.isdir(path):
        return "dir:" + "\n".join(sorted(os.listdir(path)))
    with open(path, "rb") as f:
        data = f.read()
    # A gzip file's header holds the time it was written: compare what it holds (a broken one, as it is).
    if path.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            pass
    return "file:" + hashlib.sha256(data).hexdigest()

def walk():
    if not os.path.isdir(site):
        return
    for root, dirs, files in os.walk(site):
        yield root
        for name in files:
            yield os.path.join(root, name)

if action == "save":
    stamps = {p: [digest(p), os.stat(p).st_mtime_ns] for p in walk()}
    with open(saved, "w") as f:
        json.dump(stamps, f)
else:
    with open(saved) as f:
        stamps = json.load(f)
    for path in walk():
        old = stamps.get(path)
        if old is not None and old[0] == digest(path):
            os.utime(path, ns=(old[1], old[1]), follow_symlinks=False)
PY
}

stamps save "$saved"
cargo leptos build --release --precompress --frontend-only
stamps restore "$saved"
cargo leptos build --release --precompress --server-only
