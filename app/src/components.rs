//! The page's parts: the transcript, the composer and the debug console (the ApprovalBar is in `card`).

use agent::request_body::MAX_MESSAGE_BYTES;
use agent::view::{RunStatus, RunView, ToolCallView};
use agent::wire::{McpServerState, McpServerStatus, McpTrust, RunErrorCode};
use leptos::html;
use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::api::{cancel_run, start_run};
use crate::format::{
    byte_size, call_status, clock, output_text, permission_label, server_said, shown_json, visible,
    visible_prose,
};
use crate::state::{Connection, Ui, key_of, left_for_login};

fn ui() -> Ui {
    expect_context::<Ui>()
}

/// An error the person should know about, until they dismiss it.
#[component]
pub fn ErrorBanner() -> impl IntoView {
    let ui = ui();
    move || {
        ui.error.get().map(|message| {
            view! {
                <div class="error-banner" role="alert">
                    <span>{message}</span>
                    <button type="button" class="link" on:click=move |_| {
                        ui.error.set(None);
                        // The button goes with the banner: a focus it took goes on to where the person acts.
                        crate::card::hand_on_focus();
                    }>
                        "Dismiss"
                    </button>
                </div>
            }
        })
    }
}

/// The connection to the live stream, when it is not simply fine.
#[component]
pub fn ConnectionNote() -> impl IntoView {
    let ui = ui();
    move || match ui.connection.get() {
        Connection::Reconnecting => Some(
            view! {
                <p class="connection" role="status">"Connection lost; reconnecting…"</p>
            }
            .into_any(),
        ),
        Connection::Lost { retry_in_secs } => Some(
            view! {
                <p class="connection" role="status">
                    {format!("The server does not answer; trying again in {retry_in_secs} s…")}
                </p>
            }
            .into_any(),
        ),
        Connection::Live => None,
    }
}

/// `run_gone`: the server no longer holds the call's run (found when the page reconnected), which ends here as it
/// stands.
#[component]
fn ToolCallEntry(call: ToolCallView, run: RunStatus, run_gone: Memo<bool>) -> impl IntoView {
    let ui = ui();
    let status_now = {
        let call = call.clone();
        Memo::new(move |_| {
            let run = if run_gone.get() {
                RunStatus::Failed
            } else {
                run
            };
            call_status(&call, run)
        })
    };
    // A call whose approval the server no longer holds (found when the page reconnected) waits for nothing.
    let key = call.pending_approval().map(key_of);
    let gone = Memo::new(move |_| key.as_ref().is_some_and(|key| ui.is_gone(key)));
    let status_class = move || {
        if gone.get() {
            "failed"
        } else {
            status_now.with(|(class, _)| *class)
        }
    };
    let status = move || {
        if gone.get() {
            "no longer held by the server".to_owned()
        } else {
            status_now.with(|(_, status)| status.clone())
        }
    };
    let arguments = shown_json(&call.arguments);
    // The arguments a person edited: as the call ran with them, or, when it did not run (refused, or not begun),
    // as they were approved, never said to have run.
    let edited = match (&call.executed_arguments, &call.resolution) {
        (Some(executed), _) => Some((
            "Ran with arguments edited by a person:",
            shown_json(executed),
        )),
        (
            None,
            Some(agent::wire::Resolution::Approved {
                edited_arguments: Some(edited),
                ..
            }),
        ) => Some((
            "Approved with arguments edited by a person:",
            shown_json(edited),
        )),
        _ => None,
    };
    let output = call.output.as_ref().map(output_text);
    let permission = format!(
        "{}: {}",
        permission_label(&call.permission),
        visible(call.permission.reason())
    );
    // Why a denial denied, and why an approval that no click on its own card made approved (an approval for the
    // session given to another card of the batch, which covers this one).
    // A denial's reason is a person's words (or a timeout's); an approval's may name what a grant covers, a command
    // or a path, which is written out as a card writes it.
    let resolution_reason = match &call.resolution {
        Some(agent::wire::Resolution::Denied { reason, .. }) => Some(visible_prose(reason)),
        Some(agent::wire::Resolution::Approved {
            reason: Some(reason),
            ..
        }) => Some(visible(reason)),
        _ => None,
    };
    view! {
        <article class="tool-call" data-tool-call-id=call.id.to_string() data-status=status_class>
            <header>
                <code class="tool-name">{call.name.clone()}</code>
                <span class=move || format!("badge {}", status_class())>{status}</span>
            </header>
            <p class="permission">{permission}</p>
            <pre class="arguments" aria-label="Arguments">{arguments}</pre>
            {edited.map(|(said, edited)| view! {
                <p class="note">{said}</p>
                <pre class="arguments edited">{edited}</pre>
            })}
            {resolution_reason.map(|reason| view! { <p class="resolution">{reason}</p> })}
            {output.map(|output| view! {
                <details class="output">
                    <summary>"Result"</summary>
                    <pre>{output}</pre>
                </details>
            })}
        </article>
    }
    .into_any()
}

#[component]
fn RunEntry(run: RunView) -> impl IntoView {
    let ui = ui();
    let failure = run.error.clone();
    let run_status = run.status;
    // A run the server no longer holds (it kept nothing across a restart) ends here as it stands.
    let run_gone = {
        let run_id = run.run_id.clone();
        Memo::new(move |_| run_status == RunStatus::Running && ui.is_run_gone(&run_id))
    };
    let thinking = run.status == RunStatus::Running
        && run.steps.iter().all(|step| step.text.is_empty())
        && run.pending_approvals().next().is_none();
    let steps = run
        .steps
        .into_iter()
        .map(|step| {
            let text = (!step.text.is_empty()).then(|| {
                view! { <div class="turn assistant"><p>{visible_prose(&step.text)}</p></div> }
            });
            let calls = step
                .tool_calls
                .into_iter()
                .map(|call| view! { <ToolCallEntry call run=run_status run_gone/> })
                .collect_view();
            view! { {text} {calls} }
        })
        .collect_view();
    let omitted = run.omitted_messages.map(|omitted| {
        format!(
            "The conversation is long: its {omitted} oldest messages were left out of what the model was sent."
        )
    });
    view! {
        <li class="run" data-run-id=run.run_id.to_string()>
            <div class="turn user"><p>{visible_prose(&run.message)}</p></div>
            {omitted.map(|note| view! { <p class="note context-note" role="note">{note}</p> })}
            {steps}
            {move || (thinking && !run_gone.get()).then(|| view! { <p class="thinking" role="status">"Working…"</p> })}
            {move || run_gone.get().then(|| view! {
                <div class="turn failed" role="status">
                    <p>
                        <strong>"The server no longer holds this run: "</strong>
                        "it restarted without keeping its runs, or the run ended while this page was away and was pruned since. What it did after what is shown here is not known."
                    </p>
                </div>
            })}
            {failure.map(|failure| if failure.code == RunErrorCode::Aborted {
                // Aborted: cancelled (here, in another tab, on the API), or its client went away. An end the run was
                // told to make, which its message names, not a failure of its own.
                view! {
                    <div class="turn aborted" role="status">
                        <p>{visible_prose(&failure.message)}</p>
                    </div>
                }
                .into_any()
            } else {
                view! {
                    <div class="turn failed" role="status">
                        <p><strong>"The run failed: "</strong>{visible_prose(&failure.message)}</p>
                    </div>
                }
                .into_any()
            })}
        </li>
    }
    .into_any()
}

/// The conversation: each user turn, the assistant's text, and each tool call with its status and result.
#[component]
pub fn Transcript() -> impl IntoView {
    let ui = ui();
    let runs = move || ui.session.with(|session| session.runs.clone());
    view! {
        <section class="transcript" aria-label="Conversation">
            <Show when=move || ui.session.with(|s| s.runs.is_empty())>
                <div class="empty">
                    <p>"Ask the agent to do something in its workspace. Every tool call passes the policy; risky ones wait for you here."</p>
                    <p>"Try " <code>"write notes.txt: hello and list files"</code> " or " <code>"delete notes.txt"</code>"."</p>
                </div>
            </Show>
            <ol class="runs">
                <For
                    each=runs
                    key=|run| (run.run_id.clone(), run.last_seq)
                    children=move |run| view! { <RunEntry run/> }
                />
            </ol>
        </section>
    }
    .into_any()
}

/// How far toolgate believes an MCP server, for the cards of its tools.
pub fn mcp_trust_label(trust: McpTrust) -> &'static str {
    match trust {
        McpTrust::Untrusted => "untrusted: what it claims about its tools is not believed",
        McpTrust::Annotations => "trusted: its annotations decide",
    }
}

fn mcp_state_badge(state: McpServerState) -> (&'static str, &'static str) {
    match state {
        McpServerState::Starting => ("waiting", "starting"),
        McpServerState::Ready => ("ok", "ready"),
        McpServerState::Failed => ("failed", "failed"),
        McpServerState::Crashed => ("failed", "crashed"),
        McpServerState::Disabled => ("denied", "disabled"),
        McpServerState::Stopped => ("denied", "stopped"),
    }
}

#[component]
fn McpServerEntry(server: McpServerStatus) -> impl IntoView {
    let (class, label) = mcp_state_badge(server.state);
    let tools = match server.tools.len() {
        1 => "1 tool".to_owned(),
        n => format!("{n} tools"),
    };
    let trust = match server.trust {
        McpTrust::Untrusted => "untrusted",
        McpTrust::Annotations => "trusted annotations",
    };
    view! {
        <li class="mcp-server" data-server=server.name.clone() data-state=label>
            <code>{server.name.clone()}</code>
            <span class=format!("badge {class}")>{label}</span>
            <span class="muted">{format!("{tools} · {trust}")}</span>
            {server.message.map(|message| view! { <p class="mcp-message">{message}</p> })}
            {server.stderr_tail.map(|tail| view! {
                <details class="output">
                    <summary>"The end of its standard error"</summary>
                    <pre>{tail}</pre>
                </details>
            })}
        </li>
    }
}

/// The MCP servers and their state, when any is configured.
#[component]
pub fn McpServers() -> impl IntoView {
    let ui = ui();
    let servers = ui.mcp_servers.get_value();
    (!servers.is_empty()).then(|| {
        view! {
            <section class="mcp-servers" aria-label="MCP servers">
                <h2>"MCP servers"</h2>
                <ul>
                    {servers
                        .into_iter()
                        .map(|server| view! { <McpServerEntry server/> })
                        .collect_view()}
                </ul>
            </section>
        }
    })
}

/// Why `message` cannot be sent, if it cannot: longer than the API takes. (The server takes the page's form of any
/// message the API takes, in any script: `MAX_MESSAGE_FORM_BYTES`.)
fn too_long(message: &str) -> Option<String> {
    (message.len() > MAX_MESSAGE_BYTES).then(|| {
        format!(
            "The message is {}; a message may be at most {}. Nothing was sent.",
            byte_size(message.len() as u64),
            byte_size(MAX_MESSAGE_BYTES as u64)
        )
    })
}

/// The message box. Disabled, with the reason shown, while an approval waits or a run is going.
#[component]
pub fn Composer() -> impl IntoView {
    let ui = ui();
    let textarea = NodeRef::<html::Textarea>::new();
    // What the cards show: an approval the server no longer holds holds nothing back.
    let pending = Memo::new(move |_| ui.pending().len());
    let active_run = Memo::new(move |_| ui.active_run());
    let blocked_because = move || {
        if !ui.hydrated.get() {
            Some("Loading…".to_owned())
        } else if pending.get() == 1 {
            Some("Decide the pending approval above before sending a new message.".to_owned())
        } else if pending.get() > 1 {
            Some(format!(
                "Decide the {} pending approvals above before sending a new message.",
                pending.get()
            ))
        } else if active_run.get().is_some() {
            Some("The agent is working on your last message.".to_owned())
        } else if ui.sending.get() {
            Some("Sending…".to_owned())
        } else {
            None
        }
    };
    let blocked = Memo::new(move |_| blocked_because().is_some());
    // A card decided with the keyboard hands the focus to this box (see `card::hand_on_focus`), which stays disabled
    // while the run goes on: the focus the page's body holds meanwhile comes here once the box can be used.
    let busy = Memo::new(move |_| {
        pending.get() > 0 || active_run.with(Option::is_some) || ui.sending.get()
    });
    Effect::new(move |was_busy: Option<bool>| {
        let busy = busy.get();
        if was_busy == Some(true) && !busy {
            // When the focus is nowhere, or waits on the note below the box.
            crate::refocus_if_lost(Some("composer-note"), vec![".composer textarea".to_owned()]);
        }
        busy
    });

    let send = move || {
        let Some(area) = textarea.get() else { return };
        let message = area.value();
        if message.trim().is_empty() || blocked.get_untracked() {
            return;
        }
        // Said here, with the message still in the box: the server would refuse it, in words about its body.
        if let Some(refused) = too_long(&message) {
            ui.error.set(Some(refused));
            return;
        }
        ui.sending.set(true);
        crate::scroll_to_the_end();
        let session = ui.session_id();
        spawn_local(async move {
            match start_run(message, Some(session)).await {
                // The session's stream brings the new run's events.
                Ok(_run_id) => {
                    if let Some(area) = textarea.get_untracked() {
                        area.set_value("");
                    }
                }
                Err(error) if left_for_login(&error) => {}
                Err(error) => ui.error.set(Some(format!(
                    "The message was not sent: {}",
                    server_said(&error)
                ))),
            }
            ui.sending.set(false);
        });
    };
    let on_submit = move |event: leptos::ev::SubmitEvent| {
        event.prevent_default();
        send();
    };
    let on_keydown = move |event: leptos::ev::KeyboardEvent| {
        if event.key() == "Enter" && !event.shift_key() {
            event.prevent_default();
            send();
        }
    };
    let cancel = move |_| {
        if let Some(run_id) = active_run.get_untracked() {
            let session = ui.session_id();
            spawn_local(async move {
                if let Err(error) = cancel_run(run_id, Some(session)).await
                    && !left_for_login(&error)
                {
                    ui.error.set(Some(format!(
                        "The run could not be cancelled: {}",
                        server_said(&error)
                    )));
                }
            });
        }
    };

    view! {
        <form class="composer" on:submit=on_submit>
            <label for="message" class="visually-hidden">"Message"</label>
            <textarea
                id="message"
                name="message"
                rows="2"
                node_ref=textarea
                placeholder="Try: write notes.txt: hello and list files"
                aria-describedby="composer-note"
                disabled=move || blocked.get()
                on:keydown=on_keydown
            ></textarea>
            <button type="submit" class="send" disabled=move || blocked.get()>"Send"</button>
            // Focusable, not in the tab order: the focus a decided card hands on waits here while the run goes on.
            <p id="composer-note" class="composer-note" role="status" tabindex="-1">
                {move || blocked_because().unwrap_or_default()}
                <Show when=move || active_run.get().is_some()>
                    " "
                    <button type="button" class="link" on:click=cancel>"Cancel the run"</button>
                </Show>
            </p>
        </form>
    }
    .into_any()
}

/// Every `debug` event with its time, behind a toggle.
#[component]
pub fn DebugConsole() -> impl IntoView {
    let ui = ui();
    let entries = move || {
        ui.session.with(|session| {
            session
                .runs
                .iter()
                .flat_map(|run| {
                    run.debug
                        .iter()
                        .map(move |entry| (run.run_id.clone(), entry.clone()))
                })
                .collect::<Vec<_>>()
        })
    };
    let count = move || {
        ui.session
            .with(|s| s.runs.iter().map(|run| run.debug.len()).sum::<usize>())
    };
    view! {
        <aside class="debug-console" aria-label="Debug console">
            <button
                type="button"
                class="debug-toggle"
                aria-expanded=move || ui.debug_open.get().to_string()
                aria-controls="debug-log"
                on:click=move |_| ui.debug_open.update(|open| *open = !*open)
            >
                {move || if ui.debug_open.get() { "Hide debug console" } else { "Show debug console" }}
                " (" {count} ")"
            </button>
            <ol id="debug-log" class="debug-log" hidden=move || !ui.debug_open.get()>
                <For
                    each=entries
                    key=|(run_id, entry)| (run_id.clone(), entry.seq)
                    children=move |(_, entry)| {
                        let data = entry.data.as_ref().map(|data| data.to_string());
                        view! {
                            <li>
                                <time>{clock(entry.at)}</time>
                                " "
                                <span>{entry.message}</span>
                                {data.map(|data| view! { " " <code>{data}</code> })}
                            </li>
                        }
                    }
                />
            </ol>
        </aside>
    }
    .into_any()
}
