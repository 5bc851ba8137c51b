#!/usr/bin/env bash
# Starts the built toolgate binary the way a user deploys it: copied alone into an empty directory and run there.
#   serve.sh BINARY PORT [toolgate options...]
set -euo pipefail
binary=$(realpath "$1")
port=$2
shift 2
[[ $port =~ ^[0-9]+$ ]] || { echo "serve.sh: PORT must be a number, not '$port'" >&2; exit 2; }
# The browser tests end their servers with SIGKILL, which leaves no chance to clean up: an earlier run's directory
# for this port (its server is gone, or the port would not be free) goes now.
rm -rf "${TMPDIR:-/tmp}"/toolgate-e2e-"$port".*
dir=$(mktemp -d "${TMPDIR:-/tmp}/toolgate-e2e-$port.XXXXXX")
cp "$binary" "$dir/toolgate"
cd "$dir"
exec ./toolgate --addr "127.0.0.1:$port" "$@"
