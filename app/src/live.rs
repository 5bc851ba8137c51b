//! Following the session's events in the browser, with the platform's EventSource.
//!
//! The page follows its whole session, run after run, so a run started in another tab (or through the REST API)
//! shows up here too. The stream starts after the last event the page already shows; when the connection drops,
//! EventSource reconnects on its own and sends `Last-Event-ID` (`runId:seq`), so nothing is missed and, since the
//! view ignores events it has applied, nothing is shown twice.

use agent::ids::{RunId, SessionId};

use crate::state::Ui;

#[cfg(feature = "hydrate")]
mod browser {
    use std::cell::RefCell;

    use agent::ids::{RunId, SessionId};
    use agent::wire::{RunEvent, StreamEvent};
    use leptos::prelude::*;
    use wasm_bindgen::JsCast;
    use wasm_bindgen::closure::Closure;
    use web_sys::{EventSource, MessageEvent};

    use crate::state::{Connection, Ui};

    struct Subscription {
        source: EventSource,
        _on_event: Closure<dyn FnMut(MessageEvent)>,
        _on_open: Closure<dyn FnMut(web_sys::Event)>,
        _on_error: Closure<dyn FnMut(web_sys::Event)>,
    }

    impl Drop for Subscription {
        fn drop(&mut self) {
            self.source.close();
        }
    }

    thread_local! {
        static CURRENT: RefCell<Option<Subscription>> = const { RefCell::new(None) };
    }

    pub fn follow(ui: Ui, session_id: &SessionId, resume: Option<(RunId, u64)>) {
        let url = match resume {
            Some((run_id, after)) => {
                format!("/api/agent/sessions/{session_id}/events?run={run_id}&after={after}")
            }
            None => format!("/api/agent/sessions/{session_id}/events"),
        };
        let source = match EventSource::new(&url) {
            Ok(source) => source,
            Err(_) => {
                ui.error.set(Some(
                    "This browser could not open the run's event stream.".to_owned(),
                ));
                return;
            }
        };
        let on_event = Closure::<dyn FnMut(MessageEvent)>::new(move |message: MessageEvent| {
            // Ids are `runId:seq`; run ids may themselves contain colons.
            let id = message.last_event_id();
            let seq = id
                .rsplit_once(':')
                .and_then(|(_, seq)| seq.parse::<u64>().ok())
                .unwrap_or(0);
            let Some(data) = message.data().as_string() else {
                return;
            };
            match serde_json::from_str::<StreamEvent>(&data) {
                Ok(event) => ui.apply(&RunEvent { seq, event }),
                Err(error) => ui.error.set(Some(format!(
                    "The server sent an event this page cannot read: {error}"
                ))),
            }
        });
        for kind in StreamEvent::KINDS {
            let _ =
                source.add_event_listener_with_callback(kind, on_event.as_ref().unchecked_ref());
        }
        let on_open = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
            ui.connection.set(Connection::Live);
        });
        let watcher = source.clone();
        let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
            if watcher.ready_state() == EventSource::CLOSED {
                ui.connection.set(Connection::Lost);
                ui.error.set(Some(
                    "Lost the connection to the server. Reload the page to try again.".to_owned(),
                ));
            } else {
                ui.connection.set(Connection::Reconnecting);
            }
        });
        source.set_onopen(Some(on_open.as_ref().unchecked_ref()));
        source.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        let subscription = Subscription {
            source,
            _on_event: on_event,
            _on_open: on_open,
            _on_error: on_error,
        };
        // Replacing the previous subscription closes it.
        CURRENT.with(|current| current.replace(Some(subscription)));
    }
}

/// Follows the session's events into the page, after `resume` (the last run the page shows and its last event).
/// Does nothing on the server.
pub fn follow(ui: Ui, session_id: &SessionId, resume: Option<(RunId, u64)>) {
    #[cfg(feature = "hydrate")]
    browser::follow(ui, session_id, resume);
    #[cfg(not(feature = "hydrate"))]
    let _ = (ui, session_id, resume);
}
