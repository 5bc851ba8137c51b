#!/usr/bin/env bash
# Fuzzes toolgate's request decoding (JSON bodies, decisions, run starts, ids, Last-Event-ID) with cargo-fuzz, each
# target for a bounded time. Not part of `make test`: run it with `make fuzz`.
#
#   scripts/fuzz.sh                  every target, FUZZ_SECONDS (default 60) each
#   scripts/fuzz.sh ids event_id     some targets
#   FUZZ_SECONDS=600 scripts/fuzz.sh longer
#   FUZZ_SANITIZER=none scripts/fuzz.sh   without AddressSanitizer (faster; the code under test is safe Rust)
#
# cargo-fuzz needs nightly compiler flags (-Z sanitizer, coverage instrumentation). This machine has stable rustc
# only, so the script sets RUSTC_BOOTSTRAP=1, which lets stable rustc accept them. Findings land in
# fuzz/artifacts/TARGET/; the corpus grows in fuzz/corpus/TARGET/ (seeded from fuzz/seeds/TARGET/).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

CARGO_FUZZ_VERSION=0.13.2
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_SANITIZER=${FUZZ_SANITIZER:-address}
export RUSTC_BOOTSTRAP=1

say() { printf '\033[1mfuzz:\033[0m %s\n' "$*"; }

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  say "installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

targets=("$@")
[ ${#targets[@]} -eq 0 ] && mapfile -t targets < <(cargo fuzz list)

say "building ${targets[*]} (sanitizer: $FUZZ_SANITIZER; the first build takes several minutes)"
for target in "${targets[@]}"; do
  cargo fuzz build --sanitizer "$FUZZ_SANITIZER" "$target"
done

for target in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$target"
  say "$target for ${FUZZ_SECONDS}s"
  cargo fuzz run --sanitizer "$FUZZ_SANITIZER" "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$FUZZ_SECONDS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
say "no findings in ${targets[*]}"
