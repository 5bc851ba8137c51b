//! Following the session's events in the browser, with the platform's EventSource, and telling the person when a
//! card arrives.
//!
//! The page follows its whole session, run after run, so a run started in another tab (or through the REST API)
//! shows up here too. The stream starts after the last event the page already shows; when the connection drops,
//! EventSource reconnects on its own and sends `Last-Event-ID` (`runId:seq`), so nothing is missed and, since the
//! view ignores events it has applied, nothing is shown twice. When EventSource gives up (the server answered with
//! an error, or was gone long enough), the page opens the stream again itself, with a growing pause, from the last
//! event it shows; once connected it asks the server which approvals are still pending, so a card whose approval
//! the server no longer holds (a restart ended it) leaves.

use crate::state::Ui;

#[cfg(feature = "hydrate")]
mod browser {
    use std::cell::{Cell, RefCell};
    use std::collections::{HashMap, HashSet};
    use std::time::Duration;

    use agent::ids::RunId;
    use agent::wire::{ApprovalRequest, RunEvent, StreamEvent, event_fingerprint};
    use leptos::prelude::*;
    use leptos::task::spawn_local;
    use wasm_bindgen::JsCast;
    use wasm_bindgen::closure::Closure;
    use web_sys::{
        EventSource, MessageEvent, Notification, NotificationOptions, NotificationPermission,
    };

    use crate::api::{RunAsHeld, list_pending, run_progress};
    use crate::format::server_said;
    use crate::state::left_for_login;
    use crate::state::{ApprovalKey, Connection, Ui, card_dom_id, key_of};

    /// The longest pause between attempts to open the stream again.
    const MAX_RETRY_SECS: u32 = 30;

    struct Subscription {
        source: EventSource,
        _on_event: Closure<dyn FnMut(web_sys::Event)>,
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
        /// Attempts since the stream last opened; 0 while it is open.
        static ATTEMPTS: Cell<u32> = const { Cell::new(0) };
        /// The connection dropped since the page last asked which approvals are pending.
        static STALE: Cell<bool> = const { Cell::new(false) };
        /// The last event applied from the stream: its run, its number and its fingerprint.
        static LAST_APPLIED: RefCell<Option<(RunId, u64, u64)>> = const { RefCell::new(None) };
        /// The notifications shown, by their card: one closes when its card leaves (decided here or elsewhere,
        /// timed out, or no longer held by the server).
        static SHOWN: RefCell<HashMap<ApprovalKey, Notification>> = RefCell::new(HashMap::new());
    }

    /// How long a card that arrived waits before the person is told of it, so that one a replay decides at once is
    /// never told of.
    const NOTIFY_AFTER: Duration = Duration::from_millis(500);

    /// Whether the card of `key` is still shown: its approval pending, and held by the server as far as the page
    /// knows.
    fn still_waits(ui: Ui, key: &ApprovalKey) -> bool {
        !ui.is_gone_untracked(key)
            && ui.session.with_untracked(|session| {
                session
                    .pending_approvals()
                    .any(|request| &key_of(request) == key)
            })
    }

    /// Closes the notifications of cards that no longer wait.
    fn close_settled(ui: Ui) {
        SHOWN.with(|shown| {
            shown.borrow_mut().retain(|key, notification| {
                let waits = still_waits(ui, key);
                if !waits {
                    notification.close();
                }
                waits
            });
        });
    }

    pub fn follow(ui: Ui) {
        let session_id = ui.session_id();
        let url = match ui.last_seen() {
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
        let on_event = Closure::<dyn FnMut(web_sys::Event)>::new(move |event: web_sys::Event| {
            // The server's `error` events are messages; the browser's own `error` (the connection failed, handled
            // by `on_error`) is a plain event, with no id or data to read.
            let Ok(message) = event.dyn_into::<MessageEvent>() else {
                return;
            };
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
                Ok(event) => {
                    let arrived = match &event {
                        StreamEvent::ApprovalRequired { request } => Some(request.clone()),
                        _ => None,
                    };
                    let run_id = agent::view::event_run_id(&event).clone();
                    if ui.apply(&RunEvent { seq, event }) {
                        LAST_APPLIED.with(|last| {
                            last.replace(Some((run_id, seq, event_fingerprint(&data))))
                        });
                        close_settled(ui);
                        if let Some(request) = arrived {
                            // Told a moment later, if its card still waits: a stream that reconnects replays the
                            // cards asked and decided meanwhile, each with its decision right after it.
                            set_timeout(
                                move || {
                                    if still_waits(ui, &key_of(&request)) {
                                        notify(&request);
                                    }
                                },
                                NOTIFY_AFTER,
                            );
                        }
                    }
                }
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
            ATTEMPTS.set(0);
            ui.connection.set(Connection::Live);
            if STALE.replace(false) {
                refresh_pending(ui);
            }
        });
        let watcher = source.clone();
        let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(move |event: web_sys::Event| {
            // The server's own `error` events (a run that failed or was cancelled) reach `onerror` too, as
            // messages: they are the run's news, read by `on_event`, and say nothing about the connection.
            if event.is_instance_of::<MessageEvent>() {
                return;
            }
            STALE.set(true);
            if watcher.ready_state() != EventSource::CLOSED {
                ui.connection.set(Connection::Reconnecting);
                return;
            }
            // EventSource gave up. Its login may have ended (logged out elsewhere, or expired), which a stream
            // refused with a 401 does not say: a server function does, and then the page goes to the login form.
            let session = ui.session_id();
            spawn_local(async move {
                if let Err(error) = list_pending(None, Some(session)).await {
                    left_for_login(&error);
                }
            });
            // Otherwise open the stream again, later each time, from the last event shown.
            let attempt = ATTEMPTS.get() + 1;
            ATTEMPTS.set(attempt);
            let pause = 1u32
                .checked_shl(attempt.saturating_sub(1))
                .unwrap_or(MAX_RETRY_SECS)
                .min(MAX_RETRY_SECS);
            ui.connection.set(Connection::Lost {
                retry_in_secs: pause,
            });
            set_timeout(move || follow(ui), Duration::from_secs(u64::from(pause)));
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

    /// Asks the server which of the session's approvals are pending, and lets go of the cards it no longer holds.
    /// Only cards shown before asking can go: a card that arrives meanwhile is newer than the answer. Asks too
    /// whether it still holds the run the page waits for, which a server that kept nothing across a restart (a
    /// `memory` store) does not: no event will ever end that run, and the message box must not wait for it.
    fn refresh_pending(ui: Ui) {
        let asked_about: HashSet<_> = ui
            .session
            .with_untracked(|session| session.pending_approvals().map(key_of).collect());
        let session = ui.session_id();
        let waited_for = ui.session.with_untracked(|view| {
            view.active_run()
                .map(|run| (run.run_id.clone(), run.last_seq))
        });
        if let Some((run_id, seen)) = waited_for {
            let session = session.clone();
            // What the page applied under that number, when it came from the stream (not with the page).
            let applied = LAST_APPLIED.with(|last| {
                last.borrow()
                    .as_ref()
                    .filter(|(run, seq, _)| run == &run_id && *seq == seen)
                    .map(|(_, _, fingerprint)| *fingerprint)
            });
            spawn_local(async move {
                match run_progress(run_id.clone(), seen, Some(session.clone())).await {
                    Ok(Some(RunAsHeld {
                        finished,
                        last_seq,
                        fingerprint,
                    })) if seen > last_seq
                        || (finished && seen == last_seq)
                        || applied
                            .zip(fingerprint)
                            .is_some_and(|(mine, held)| mine != held) =>
                    {
                        // The page has seen events the server's log does not hold (a machine crash lost its last
                        // writes, and what it wrote since has numbers the page has seen): the stream cannot mend
                        // the page's view, opening the conversation again shows what the server holds.
                        let _ = window().location().replace(&format!("/?session={session}"));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => {
                        // Nor does it hold the run's approvals: their cards go, and their notifications.
                        let of_run: Vec<_> = ui.session.with_untracked(|view| {
                            view.pending_approvals()
                                .filter(|request| request.run_id == run_id)
                                .map(key_of)
                                .collect()
                        });
                        ui.gone.update(|gone| gone.extend(of_run));
                        ui.gone_runs.update(|gone| {
                            gone.insert(run_id);
                        });
                        close_settled(ui);
                    }
                    Err(error) if left_for_login(&error) => {}
                    Err(error) => ui.error.set(Some(format!(
                        "Could not ask the server how far it holds the run: {}",
                        server_said(&error)
                    ))),
                }
            });
        }
        spawn_local(async move {
            match list_pending(None, Some(session)).await {
                Ok(pending) => {
                    let held: HashSet<_> = pending.iter().map(key_of).collect();
                    ui.gone.update(|gone| {
                        gone.extend(asked_about.difference(&held).cloned());
                    });
                    close_settled(ui);
                }
                Err(error) if left_for_login(&error) => {}
                Err(error) => ui.error.set(Some(format!(
                    "Could not ask the server which approvals are pending: {}",
                    server_said(&error)
                ))),
            }
        });
    }

    /// Whether the person allowed notifications: `granted`, `denied` or `default` (not asked yet).
    pub fn notification_permission() -> Option<String> {
        // Browsers without the Notification API have no `Notification` global.
        let global = js_sys::global();
        if !js_sys::Reflect::has(&global, &"Notification".into()).unwrap_or(false) {
            return None;
        }
        Some(
            match Notification::permission() {
                NotificationPermission::Granted => "granted",
                NotificationPermission::Denied => "denied",
                _ => "default",
            }
            .to_owned(),
        )
    }

    /// Asks the person to allow notifications; `ui.notifications` follows the answer.
    pub fn ask_for_notifications(ui: Ui) {
        let answered = Closure::once_into_js(move |_: wasm_bindgen::JsValue| {
            ui.notifications.set(notification_permission());
        });
        let _ = Notification::request_permission_with_permission_callback(answered.unchecked_ref());
    }

    /// Tells the person a card arrived, when the tab is hidden and they allowed it; a click brings the card.
    fn notify(request: &ApprovalRequest) {
        let hidden = document().hidden();
        if !hidden || notification_permission().as_deref() != Some("granted") {
            return;
        }
        let options = NotificationOptions::new();
        // Written out as the card writes them: a notification is read before the card is.
        options.set_body(&format!(
            "{}: {}",
            crate::format::visible(&request.tool_name),
            crate::format::visible(&request.reason)
        ));
        let key = key_of(request);
        let dom_id = card_dom_id(&key);
        options.set_tag(&dom_id);
        let Ok(notification) =
            Notification::new_with_options("toolgate: an approval is waiting", &options)
        else {
            return;
        };
        SHOWN.with(|shown| shown.borrow_mut().insert(key, notification.clone()));
        let shown = notification.clone();
        let on_click = Closure::once_into_js(move |_: web_sys::Event| {
            let _ = window().focus();
            if let Some(card) = document()
                .get_element_by_id(&dom_id)
                .and_then(|card| card.dyn_into::<web_sys::HtmlElement>().ok())
            {
                let _ = card.focus();
            }
            shown.close();
        });
        notification.set_onclick(Some(on_click.unchecked_ref()));
    }
}

/// Follows the session's events into the page, after the last event it shows. Does nothing on the server.
pub fn follow(ui: Ui) {
    #[cfg(feature = "hydrate")]
    browser::follow(ui);
    #[cfg(not(feature = "hydrate"))]
    let _ = ui;
}

/// Whether the person allowed notifications (`granted`, `denied`, `default`); `None` on the server or without the
/// Notification API.
pub fn notification_permission() -> Option<String> {
    #[cfg(feature = "hydrate")]
    return browser::notification_permission();
    #[cfg(not(feature = "hydrate"))]
    None
}

/// Asks the person to allow notifications. Does nothing on the server.
pub fn ask_for_notifications(ui: Ui) {
    #[cfg(feature = "hydrate")]
    browser::ask_for_notifications(ui);
    #[cfg(not(feature = "hydrate"))]
    let _ = ui;
}
