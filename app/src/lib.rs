//! toolgate's page: rendered on the server, hydrated in the browser.
//!
//! The server renders the session as it stands (the transcript, every pending approval); the browser hydrates it
//! and follows the session's events, run after run, from the last one the page shows.

pub mod api;
pub mod audit;
pub mod card;
pub mod components;
pub mod format;
pub mod live;
pub mod rules;
pub mod schema;
pub mod sidebar;
pub mod state;

use std::time::Duration;

use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};

use crate::api::{PageState, load_page};
use crate::audit::AuditView;
use crate::card::ApprovalBar;
use crate::components::{
    Composer, ConnectionNote, DebugConsole, ErrorBanner, McpServers, Transcript,
};
use crate::rules::RulesPanel;
use crate::sidebar::Sidebar;
use crate::state::{Ui, View};

/// The HTML document around the app.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    #[cfg(feature = "ssr")]
    restrict_the_page();
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <meta name="color-scheme" content="light dark"/>
                <link rel="icon" href="/favicon.svg" type="image/svg+xml"/>
                <AutoReload options=options.clone()/>
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

/// The page's Content-Security-Policy, for a response whose inline scripts (the hydration data Leptos writes) carry
/// `nonce`: scripts only from this origin or with that nonce, WebAssembly compiled only from them, styles, fetches,
/// streams and images only from this origin, no plugins, no `<base>`, forms posted only here, and no framing. So
/// markup that a model or a tool smuggled into the page, were it ever rendered as markup rather than text, could
/// neither run a script nor load anything from another origin. `reloads`: `cargo leptos watch` serves the page,
/// whose reload script connects to its own WebSocket port.
pub fn page_policy(nonce: &str, reloads: bool) -> String {
    let reload = if reloads { " ws: wss:" } else { "" };
    format!(
        "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; style-src 'self'; \
         connect-src 'self'{reload}; object-src 'none'; base-uri 'none'; form-action 'self'; \
         frame-ancestors 'none'"
    )
}

/// Answers the page with [`page_policy`] for the nonce of this response's inline scripts.
#[cfg(feature = "ssr")]
fn restrict_the_page() {
    use axum::http::{HeaderValue, header};
    let (Some(nonce), Some(response)) = (
        leptos::nonce::use_nonce(),
        use_context::<leptos_axum::ResponseOptions>(),
    ) else {
        return;
    };
    let reloads = std::env::var_os("LEPTOS_WATCH").is_some();
    // A nonce is base64, which a header value always takes.
    if let Ok(policy) = HeaderValue::from_str(&page_policy(&nonce, reloads)) {
        response.insert_header(header::CONTENT_SECURITY_POLICY, policy);
    }
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    let page = Resource::new_blocking(|| (), |_| load_page());
    view! {
        <Stylesheet id="leptos" href="/pkg/toolgate.css"/>
        <Suspense fallback=|| view! { <p class="loading">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match page.await {
                    Ok(state) => view! { <Chat state/> }.into_any(),
                    Err(error) => view! {
                        <Title text="toolgate"/>
                        <div class="error-banner" role="alert">
                            "The page could not load its session: " {error.to_string()}
                        </div>
                    }
                    .into_any(),
                }
            })}
        </Suspense>
    }
}

/// Puts `address` in the address bar in place of the page's own, without a reload or a step in the history.
fn replace_address(address: &str) {
    #[cfg(feature = "hydrate")]
    if let Some(history) = web_sys::window().and_then(|window| window.history().ok()) {
        let _ = history.replace_state_with_url(&wasm_bindgen::JsValue::NULL, "", Some(address));
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = address;
}

/// The document's title: the number of approvals waiting, so a person sees it from another tab.
fn title(pending: usize) -> String {
    if pending == 0 {
        "toolgate".to_owned()
    } else {
        format!("({pending}) toolgate")
    }
}

#[component]
fn Chat(state: PageState) -> impl IntoView {
    let ui = Ui::new(&state);
    provide_context(ui);
    let server_clock_at_render = state.now_ms;
    // A `?session=` the server refused (not this browser's) shows the browser's current conversation: the address
    // says that one, so that a reload or a copied link is what the page shows.
    let shown_instead = state
        .notice
        .is_some()
        .then(|| format!("/?session={}", state.session.session_id));

    // In the browser only: follow the session from the last event shown, and start the clock. Countdowns read the
    // server's clock, estimated from its reading at render time, never the browser's own (which may be off).
    Effect::new(move |_| {
        if let Some(address) = &shown_instead {
            replace_address(address);
        }
        ui.hydrated.set(true);
        ui.notifications.set(live::notification_permission());
        live::follow(ui);
        ui.clock_offset_ms
            .set_value(server_clock_at_render as i64 - js_now() as i64);
        ui.now_ms.set(ui.server_now(js_now()));
        set_interval(
            move || ui.now_ms.set(ui.server_now(js_now())),
            Duration::from_secs(1),
        );
    });
    follow_the_bottom(ui);
    let waiting = Memo::new(move |_| ui.pending().len());

    let summary = format!(
        "policy {} · model {} · approvals time out after {} s",
        state.policy, state.model, state.approval_timeout_secs
    );
    // A plain form: logging out works before hydration, and the origin check covers it like any POST.
    let logout = state.logged_in.then(|| {
        view! {
            <form class="logout" method="post" action="/logout">
                <button type="submit" class="link">"Log out"</button>
            </form>
        }
    });
    let notify_offer = move || {
        (ui.notifications.get().as_deref() == Some("default")).then(|| {
            view! {
                <button type="button" class="link notify" on:click=move |_| live::ask_for_notifications(ui)>
                    "Notify me when an approval waits"
                </button>
            }
        })
    };
    let audit_toggle = move |_| {
        ui.view.update(|view| {
            *view = match view {
                View::Conversation => View::Audit,
                View::Audit => View::Conversation,
            }
        })
    };
    let audit = view! {
        <Show when=move || ui.view.get() == View::Audit>
            <ErrorBanner/>
            <AuditView/>
        </Show>
    }
    .into_any();
    // Hidden, not taken down, while the audit log shows: a card being edited keeps its edit.
    let conversation = view! {
        <div class="conversation-view" hidden=move || ui.view.get() == View::Audit>
            <Transcript/>
            // The error banner sits where the person acts, above the cards and the message box.
            <div class="dock">
                <ErrorBanner/>
                <ConnectionNote/>
                <ApprovalBar/>
                <Composer/>
            </div>
        </div>
    }
    .into_any();
    view! {
        <Title text=move || title(waiting.get())/>
        <div class="page" data-hydrated=move || ui.hydrated.get().to_string()>
            <header class="top">
                <h1>"toolgate"</h1>
                <p class="summary">{summary}</p>
                <RulesPanel/>
                <div class="top-actions">
                    {notify_offer}
                    <button type="button" class="link audit-toggle" aria-pressed=move || (ui.view.get() == View::Audit).to_string()
                        on:click=audit_toggle>
                        "Audit log"
                    </button>
                    {logout}
                </div>
                <McpServers/>
            </header>
            <div class="columns">
                <Sidebar/>
                <main>{audit}{conversation}</main>
            </div>
            <DebugConsole/>
        </div>
    }
    .into_any()
}

/// Keeps the newest part of the transcript in view as events arrive, unless the person scrolled up to read.
fn follow_the_bottom(ui: Ui) {
    #[cfg(feature = "hydrate")]
    {
        use std::cell::Cell;
        use std::rc::Rc;

        fn near_bottom() -> bool {
            let Some(window) = web_sys::window() else {
                return true;
            };
            let scrolled = window.scroll_y().unwrap_or(0.0)
                + window
                    .inner_height()
                    .ok()
                    .and_then(|h| h.as_f64())
                    .unwrap_or(0.0);
            let height = window
                .document()
                .and_then(|document| document.document_element())
                .map_or(0.0, |root| f64::from(root.scroll_height()));
            scrolled >= height - 120.0
        }

        let stick = Rc::new(Cell::new(true));
        let on_scroll = Rc::clone(&stick);
        let handle =
            window_event_listener(leptos::ev::scroll, move |_| on_scroll.set(near_bottom()));
        on_cleanup(move || handle.remove());
        Effect::new(move |_| {
            ui.session.track();
            if stick.get()
                && let Some(window) = web_sys::window()
            {
                window.scroll_to_with_x_and_y(0.0, 1e9);
            }
        });
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = ui;
}

/// A frame later, once the page has redrawn: when the keyboard focus is where no person put it (on the page's body,
/// or nowhere, or on the element with id `resting`, which only holds it for a while), gives it to the first element
/// that one of `targets` (CSS selectors, in order) finds. Focus a person put elsewhere stays where it is.
pub(crate) fn refocus_if_lost(resting: Option<&'static str>, targets: Vec<String>) {
    #[cfg(feature = "hydrate")]
    request_animation_frame(move || {
        use wasm_bindgen::JsCast;

        let document = document();
        let lost = match (document.active_element(), document.body()) {
            (Some(active), Some(body)) => {
                active == *body.unchecked_ref::<web_sys::Element>()
                    || resting.is_some_and(|id| active.id() == id)
            }
            (None, _) => true,
            (Some(_), None) => false,
        };
        if !lost {
            return;
        }
        let target = targets
            .iter()
            .find_map(|selector| document.query_selector(selector).ok().flatten())
            .and_then(|target| target.dyn_into::<web_sys::HtmlElement>().ok());
        if let Some(target) = target {
            let _ = target.focus();
        }
    });
    #[cfg(not(feature = "hydrate"))]
    let _ = (resting, targets);
}

/// Brings the end of the page into view, where a message just sent will show its run; the transcript then follows
/// the bottom again (`follow_the_bottom` sees the person there), even if they had scrolled up to read.
pub(crate) fn scroll_to_the_end() {
    #[cfg(feature = "hydrate")]
    if let Some(window) = web_sys::window() {
        window.scroll_to_with_x_and_y(0.0, 1e9);
    }
}

/// The browser's clock in milliseconds since the Unix epoch. Only effects call it, and effects run only in the
/// browser.
fn js_now() -> u64 {
    #[cfg(feature = "hydrate")]
    return js_sys::Date::now() as u64;
    #[cfg(not(feature = "hydrate"))]
    0
}
