# toolgate: the two commands are `make run` and `make test`. Both install what is missing first.

SHELL := /bin/bash
export PATH := $(CURDIR)/tools/node_modules/.bin:$(HOME)/.cargo/bin:$(PATH)

# Options for the server, for example: make run ARGS="--policy strict --addr 0.0.0.0:3000 --token secret"
ARGS ?=

.PHONY: run test dev site bootstrap lint unit e2e

## Build the release binary (site embedded) and start it with the scripted model on http://127.0.0.1:3000
run:
	scripts/bootstrap.sh build
	cargo leptos build --release --precompress
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
	cargo leptos build --release --precompress

lint:
	scripts/test.sh lint

unit:
	scripts/test.sh unit

e2e:
	scripts/test.sh e2e
