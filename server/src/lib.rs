//! toolgate's server: configuration, the HTTP API, SSE, the embedded site, and the wiring between them.

pub mod agui;
pub mod api;
pub mod assets;
pub mod body;
pub mod client;
pub mod config;
pub mod error;
pub mod rules;
pub mod rules_api;
pub mod runtime;
pub mod security;
pub mod serve;
pub mod session_cookie;
pub mod startup;
pub mod state;
pub mod streams;
pub mod tools;
