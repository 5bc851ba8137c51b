#!/usr/bin/env bash
# Installs what building and testing toolgate needs, at pinned versions, skipping whatever is already present.
# Safe to run again and again. Reaches only crates.io, npm, PyPI (one MCP test server, pinned) and Debian's packages.
#
#   scripts/bootstrap.sh          everything (build + browser tests)
#   scripts/bootstrap.sh build    only what building the site needs
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
WHAT=${1:-all}

CARGO_LEPTOS_VERSION=0.3.10
# wasm-bindgen-cli must match the wasm-bindgen crate in Cargo.lock exactly.
WASM_BINDGEN_VERSION=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3; exit }' Cargo.lock)

say() { printf '\033[1mbootstrap:\033[0m %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# 1. The wasm32 target for the browser bundle.
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  say "adding the wasm32-unknown-unknown target"
  rustup target add wasm32-unknown-unknown
fi

# 2. cargo-leptos (0.3.11 needs a newer rustc than this machine's).
if ! cargo leptos --version 2>/dev/null | grep -q "$CARGO_LEPTOS_VERSION"; then
  say "installing cargo-leptos $CARGO_LEPTOS_VERSION (about 20 minutes on 2 cores, once per machine)"
  cargo install cargo-leptos --version "$CARGO_LEPTOS_VERSION" --locked
fi

# 3. wasm-bindgen-cli at exactly the version the lock file pins (--locked fails for this crate: a locked dependency of it is missing from the registry).
if ! wasm-bindgen --version 2>/dev/null | grep -q "$WASM_BINDGEN_VERSION"; then
  say "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION"
  cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" --force
fi

# 4. wasm-opt from npm's binaryen (Debian's is too old for current Rust output).
if [ ! -x tools/node_modules/.bin/wasm-opt ] || [ tools/package-lock.json -nt tools/node_modules/.package-lock.json ]; then
  say "installing binaryen (wasm-opt) from npm"
  npm ci --prefix tools --no-audit --no-fund
fi

[ "$WHAT" = build ] && exit 0

# 5. Chromium from Debian, for the browser tests. Playwright never downloads a browser here.
if [ ! -x /usr/bin/chromium ]; then
  say "installing chromium from Debian"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium
fi

# 6. PostgreSQL's server binaries, for the tests of the PostgreSQL store and of several instances (the tests start
#    their own throwaway server from them; nothing is left running). The machine image usually has them.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  say "installing PostgreSQL from Debian"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql postgresql-client
fi

# 7. The end-to-end test packages, exactly as locked.
if [ ! -d end2end/node_modules/@playwright/test ] || [ end2end/package-lock.json -nt end2end/node_modules/.package-lock.json ]; then
  say "installing the end-to-end test packages"
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --prefix end2end --no-audit --no-fund
fi

# 8. The third-party MCP servers the tests run against, exactly as locked: never fetched at test time.
if [ ! -d tools/mcp/node_modules/@modelcontextprotocol/server-everything ] || [ tools/mcp/package-lock.json -nt tools/mcp/node_modules/.package-lock.json ]; then
  say "installing the MCP test servers from npm"
  npm ci --prefix tools/mcp --no-audit --no-fund
fi

# 9. mcp-server-time from PyPI, in a virtual environment of its own, every package pinned.
if [ ! -x tools/mcp/python/bin/mcp-server-time ] || [ tools/mcp/requirements.txt -nt tools/mcp/python/.installed ]; then
  say "installing mcp-server-time from PyPI into tools/mcp/python"
  rm -rf tools/mcp/python
  python3 -m venv tools/mcp/python
  tools/mcp/python/bin/pip install --quiet --disable-pip-version-check --no-deps --requirement tools/mcp/requirements.txt
  touch tools/mcp/python/.installed
fi

# 10. The peer `make bench` measures toolgate against (TanStack AI on Node), exactly as locked.
if [ ! -d bench/peers/tanstack/node_modules/@tanstack/ai ] || [ bench/peers/tanstack/package-lock.json -nt bench/peers/tanstack/node_modules/.package-lock.json ]; then
  say "installing the benchmark's peer (TanStack AI)"
  npm ci --prefix bench/peers/tanstack --no-audit --no-fund
fi

say "ready ($ROOT)"
