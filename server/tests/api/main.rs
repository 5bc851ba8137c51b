//! The HTTP API over real HTTP: the server runs on port 0 and the tests talk to it like any client.

mod helpers;
#[path = "../../../agent/tests/support/postgres.rs"]
mod postgres;
mod process;

mod agui;
mod approval_api;
mod bodies;
mod durable;
mod instances;
mod mcp;
mod pages;
mod rules;
mod runs;
mod security;
mod streaming;
