//! The state every handler shares.

use std::time::Duration;

use agent::harness::Harness;
use axum::extract::FromRef;
use leptos::config::LeptosOptions;

use crate::streams::StreamLimit;

#[derive(Clone)]
pub struct AppState {
    pub harness: Harness,
    pub leptos_options: LeptosOptions,
    /// How often an idle event stream sends a keep-alive comment.
    pub keep_alive: Duration,
    /// The event streams each client holds open, and how many it may.
    pub streams: StreamLimit,
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}
