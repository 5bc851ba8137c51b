//! The conversations sidebar: this browser's sessions, a new one, and switching between them.
//!
//! Switching is navigation: `/?session=ID` renders that conversation on the server and makes it the browser's
//! current one (the server opens only the browser's own sessions, or any for a person logged in with the token), and
//! `/?new` starts a new one. So it works before the WASM loads, a tab shows one conversation for its whole life,
//! and its server functions name that conversation, whatever another tab switched to since.

use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::api::list_sessions;
use crate::format::{date_time, visible_prose};
use crate::state::Ui;

#[component]
pub fn Sidebar() -> impl IntoView {
    let ui = expect_context::<Ui>();
    let current = ui.session_id();
    // The newest listing asked for: an older one that answers after it is not shown.
    let listings = StoredValue::new(0_u64);
    let relist = move || {
        let listing = listings.get_value() + 1;
        listings.set_value(listing);
        let session = ui.session_id();
        spawn_local(async move {
            if let Ok(listed) = list_sessions(Some(session)).await
                && listings.get_value() == listing
            {
                ui.conversations.set(listed);
            }
        });
    };
    // A new run in this conversation may give it its title, or make it the most recent: list them again.
    let runs = Memo::new(move |_| ui.session.with(|session| session.runs.len()));
    Effect::new(move |previous: Option<usize>| {
        let now = runs.get();
        if previous.is_some_and(|previous| previous != now) {
            relist();
        }
        now
    });
    // Another tab may have started a conversation, or given one a title, which nothing in this tab's stream says:
    // the list is read again when the window takes the focus back.
    #[cfg(feature = "hydrate")]
    {
        let on_focus = window_event_listener(leptos::ev::focus, move |_| relist());
        on_cleanup(move || on_focus.remove());
    }
    let items = move || {
        ui.conversations
            .get()
            .into_iter()
            .map(|conversation| {
                let here = conversation.session_id == current;
                let title = if conversation.title.is_empty() {
                    "New conversation".to_owned()
                } else {
                    visible_prose(&conversation.title)
                };
                let detail = match conversation.runs {
                    0 => "no messages yet".to_owned(),
                    1 => format!("1 message · {}", date_time(conversation.updated_at)),
                    n => format!("{n} messages · {}", date_time(conversation.updated_at)),
                };
                view! {
                    <li data-session-id=conversation.session_id.to_string()>
                        <a
                            href=format!("/?session={}", conversation.session_id)
                            aria-current=here.then_some("page")
                        >
                            <span class="conversation-title">{title}</span>
                            <span class="conversation-detail">{detail}</span>
                        </a>
                    </li>
                }
            })
            .collect_view()
    };
    view! {
        <nav class="sidebar" aria-label="Conversations">
            <a class="new-conversation" href="/?new">"New conversation"</a>
            <ul class="conversations">{items}</ul>
            // The session's grants, with a way to revoke each, belong here: the rules and grants panel takes this place.
        </nav>
    }
}
