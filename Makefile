# toolgate: the two commands are `make run` and `make test`. Both install what is missing first.

SHELL := /bin/bash
export PATH := $(CURDIR)/tools/node_modules/.bin:$(HOME)/.cargo/bin:$(PATH)

# Options for the server, for example: make run ARGS="--policy strict --addr 0.0.0.0:3000 --token secret"
ARGS ?=

.PHONY: run test dev site bootstrap lint unit e2e

## Build the release binary (site embedded) and start it with the scripted model on http://127.0.0.1:3000
run:
	scripts/bootstrap.sh build
	scripts/site.sh
	./target/release/toolgate $(ARGS)

## Every check and test: formatting, lints, unit and integration tests, the browser tests, the load-generator smoke run
test:
	scripts/test.sh

## Rebuild and reload on every change (debug build)
dev:
	scripts/bootstrap.sh build
	cargo leptos watch

## Install the pinned tools (idempotent)
bootstrap:
	scripts/bootstrap.sh

## The release binary with the site embedded
site:
	scripts/bootstrap.sh build
	scripts/site.sh

lint:
	scripts/test.sh lint

unit:
	scripts/test.sh unit

e2e:
	scripts/test.sh e2e

.PHONY: bench
# Options for the load generator, for example: make bench BENCH_ARGS="--concurrency 1,8,32 --scale 2000"
BENCH_ARGS ?= --json target/bench.json

## The benchmarks on the release binary: approval round trips (SQLite and memory stores), memory with 10,000
## pending, browser bytes and hydration; then toolgate side by side with TanStack AI and the transport floor
bench:
	scripts/bootstrap.sh
	scripts/site.sh
	cargo build --release -p bench
	./target/release/toolgate-bench $(BENCH_ARGS)
	bench/peers/side-by-side.sh target/release/toolgate

.PHONY: fuzz
# Seconds each fuzz target runs, for example: make fuzz FUZZ_SECONDS=600
FUZZ_SECONDS ?= 60

## Fuzz the request decoding (JSON bodies, decisions, ids, Last-Event-ID) for FUZZ_SECONDS per target; not part of `make test`
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh
