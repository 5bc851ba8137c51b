#!/usr/bin/env bash
# Runs every check and test of toolgate, each step timed. `make test` calls this with no argument.
#
#   scripts/test.sh            all steps
#   scripts/test.sh STEP...    some of: bootstrap lint unit site e2e bench
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/tools/node_modules/.bin:$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(bootstrap lint unit site e2e bench)

started=$SECONDS
step() {
  local name=$1
  shift
  local t=$SECONDS
  printf '\n\033[1m== %s\033[0m\n' "$name"
  "$@"
  printf '\033[1m== %s: %ss\033[0m\n' "$name" $((SECONDS - t))
}

lint() {
  cargo fmt --all --check
  # The server side: the harness with tokio, the app with ssr, the server; tests included.
  cargo clippy -p agent -p app -p server -p bench --all-targets --features agent/runtime,app/ssr -- -D warnings
  # The browser side: the wire types without tokio and the app with hydrate, for wasm32.
  cargo clippy -p agent -p frontend --target wasm32-unknown-unknown -- -D warnings
  # The fuzz targets are their own workspace (running them needs nightly flags, see scripts/fuzz.sh); type-check
  # them here so that they cannot rot unnoticed. Same target directory: they share the server's dependencies.
  cargo check --manifest-path fuzz/Cargo.toml --target-dir target --bins
}

unit() {
  cargo test -p agent -p app -p server -p bench --features agent/runtime,app/ssr
}

site() {
  scripts/site.sh
  # Built again with nothing changed, nothing is compiled: the server is not built again for a site whose files
  # cargo-leptos only wrote again (scripts/site.sh gives back their times). Judged by cargo's plain output and by
  # the binary itself, whatever colour or quietness the caller's cargo settings ask for.
  local before again
  before=$(stat -c %y target/release/toolgate)
  again=$(CARGO_TERM_COLOR=never CARGO_TERM_QUIET=false scripts/site.sh 2>&1) || { printf '%s\n' "$again"; return 1; }
  printf '%s\n' "$again"
  if grep -E '^ +Compiling ' <<<"$again" || [ "$(stat -c %y target/release/toolgate)" != "$before" ]; then
    echo "the site's second build, with nothing changed, compiled again" >&2
    return 1
  fi
}

e2e() {
  (cd end2end && npx playwright test)
}

# The load generator's smoke run: a few hundred verified round trips (the approval API and AG-UI) and 200 pending runs,
# so the benchmark tool cannot rot. `make bench` is the full measurement.
bench() {
  cargo build --release -p bench
  ./target/release/toolgate-bench --quick
}

for s in "${steps[@]}"; do
  case $s in
    bootstrap) step bootstrap scripts/bootstrap.sh ;;
    lint) step lint lint ;;
    unit) step unit unit ;;
    site) step site site ;;
    e2e) step e2e e2e ;;
    bench) step bench bench ;;
    *) echo "unknown step: $s" >&2; exit 2 ;;
  esac
done
printf '\n\033[1mall steps passed in %ss\033[0m\n' $((SECONDS - started))
