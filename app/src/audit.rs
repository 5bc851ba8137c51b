//! The audit log's view: who decided what, when, for which call, filtered by conversation, run, tool, outcome and
//! time. It lists the browser's own conversations (every conversation, for a person logged in with the token).

use agent::ids::{RunId, SessionId};
use leptos::html;
use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::api::{AuditLine, audit_log};
use crate::format::{date_time, server_said, visible, visible_prose};
use crate::state::{Ui, View, left_for_login};

/// Outcomes the log records, for the filter.
const OUTCOMES: [&str; 12] = [
    "requested",
    "reopened",
    "approved",
    "approved_with_edits",
    "denied",
    "timed_out",
    "aborted",
    "interrupted",
    "not_run",
    "revoked",
    "added",
    "removed",
];

/// Milliseconds since the Unix epoch from an `<input type="datetime-local">` value (read as UTC, as the view
/// shows times).
fn parse_local(value: &str) -> Option<u64> {
    let (date, time) = value.split_once('T')?;
    let mut date = date.split('-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let mut time = time.split(':').map(|part| part.parse::<i64>().ok());
    let (hour, minute) = (time.next()??, time.next()??);
    // Howard Hinnant's days-from-civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(((days * 24 + hour) * 60 + minute) * 60_000).ok()
}

#[component]
pub fn AuditView() -> impl IntoView {
    let ui = expect_context::<Ui>();
    let entries = RwSignal::new(None::<Vec<AuditLine>>);
    let session = NodeRef::<html::Select>::new();
    let run = NodeRef::<html::Input>::new();
    let tool = NodeRef::<html::Select>::new();
    let outcome = NodeRef::<html::Select>::new();
    let since = NodeRef::<html::Input>::new();
    let until = NodeRef::<html::Input>::new();

    // Each load is numbered: an answer that comes after a newer load's is dropped, so the rows shown are always for
    // the filters last asked.
    let loads = StoredValue::new(0_u64);
    let load = move || {
        // Numbered first: an answer to an earlier load does not land under what this one says.
        let this = loads.get_value() + 1;
        loads.set_value(this);
        let text = |node: Option<String>| node.filter(|value| !value.trim().is_empty());
        let refused = |what: &str, id: &str, error: agent::ids::IdError| {
            ui.error.set(Some(format!(
                "“{}” is not a {what} id: it {error}.",
                visible(id)
            )));
        };
        let session = match text(session.get().map(|s| s.value())) {
            None => None,
            Some(id) => match SessionId::parse(&id) {
                Ok(session) => Some(session),
                Err(error) => return refused("conversation", &id, error),
            },
        };
        let run = match text(run.get().map(|r| r.value())) {
            None => None,
            Some(id) => match RunId::parse(id.trim()) {
                Ok(run) => Some(run),
                Err(error) => return refused("run", id.trim(), error),
            },
        };
        let tool = text(tool.get().map(|t| t.value()));
        let outcome = text(outcome.get().map(|o| o.value()));
        let since = since.get().and_then(|input| parse_local(&input.value()));
        let until = until.get().and_then(|input| parse_local(&input.value()));
        spawn_local(async move {
            let found = audit_log(session, run, tool, outcome, since, until).await;
            if loads.get_value() != this {
                return;
            }
            match found {
                Ok(found) => entries.set(Some(found)),
                Err(error) if left_for_login(&error) => {}
                Err(error) => ui.error.set(Some(format!(
                    "The audit log could not be read: {}",
                    server_said(&error)
                ))),
            }
        });
    };
    // Effects run in the browser only: the log loads once the view opens.
    Effect::new(move |_| load());
    let on_submit = move |event: leptos::ev::SubmitEvent| {
        event.prevent_default();
        load();
    };

    let sessions = ui
        .conversations
        .get_untracked()
        .into_iter()
        .map(|conversation| {
            let label = if conversation.title.is_empty() {
                format!("New conversation ({})", conversation.session_id)
            } else {
                visible_prose(&conversation.title)
            };
            view! { <option value=conversation.session_id.to_string()>{label}</option> }
        })
        .collect_view();
    let tools = ui
        .tools
        .get_value()
        .into_iter()
        .map(|tool| {
            let value = tool.name.clone();
            view! { <option value=value>{tool.name}</option> }
        })
        .collect_view();
    let outcomes = OUTCOMES
        .iter()
        .map(|outcome| view! { <option value=*outcome>{*outcome}</option> })
        .collect_view();

    let rows = move || {
        entries.get().map(|entries| {
            if entries.is_empty() {
                return view! { <p class="empty-list" role="status">"No entries match."</p> }.into_any();
            }
            let rows = entries
                .into_iter()
                .rev()
                .map(|entry| {
                    let outcome = if entry.edited {
                        format!("{} (edited arguments)", entry.outcome)
                    } else {
                        entry.outcome.clone()
                    };
                    // A call's id is the model's, written out as a card writes it: it is what a covered approval's
                    // reason names.
                    let call = entry.tool_call_id.as_deref().map(visible).unwrap_or_default();
                    let run = entry.run_id.map(|run| run.to_string()).unwrap_or_default();
                    let session = entry.session_id.map(|s| s.to_string()).unwrap_or_default();
                    // An entry that names no call or run (a rule's change) has no title either.
                    let title = |id: &String| (!id.is_empty()).then(|| id.clone());
                    let (call_title, run_title, session_title) =
                        (title(&call), title(&run), title(&session));
                    // Reasons name commands, paths, rules and grants (the policy's, a grant's, a rule's text): every
                    // character written out, as a card does.
                    let reason = visible(&entry.reason.unwrap_or_default());
                    // The date and the time each on one line, the time under its date when the column is narrow
                    // (a date alone would break at its hyphens).
                    let at = date_time(entry.at);
                    let (day, clock) = at.split_once(' ').unwrap_or((at.as_str(), ""));
                    let (day, clock) = (day.to_owned(), clock.to_owned());
                    view! {
                        <tr data-outcome=entry.outcome.clone()>
                            <td><time><span>{day}</span>" "<span>{clock}</span></time></td>
                            <td class="tool"><code>{entry.tool.unwrap_or_default()}</code></td>
                            <td class="outcome">{outcome}</td>
                            <td class="scope">{entry.scope.unwrap_or_default()}</td>
                            <td>{entry.actor.or(entry.source).unwrap_or_default()}</td>
                            <td class="reason">{reason}</td>
                            <td class="id call-id"><code title=call_title>{call}</code></td>
                            <td class="id run-id"><code title=run_title>{run}</code></td>
                            <td class="id conversation-id"><code title=session_title>{session}</code></td>
                        </tr>
                    }
                })
                .collect_view();
            view! {
                <div class="audit-scroll" tabindex="0" role="region" aria-label="Audit entries">
                    <table class="audit">
                        <caption class="visually-hidden">"Audit entries, newest first"</caption>
                        <thead>
                            <tr>
                                <th scope="col">"Time (UTC)"</th>
                                <th scope="col">"Tool"</th>
                                <th scope="col">"Outcome"</th>
                                <th scope="col">"Scope"</th>
                                <th scope="col">"Who"</th>
                                <th scope="col">"Reason"</th>
                                <th scope="col">"Call"</th>
                                <th scope="col">"Run"</th>
                                <th scope="col">"Conversation"</th>
                            </tr>
                        </thead>
                        <tbody>{rows}</tbody>
                    </table>
                </div>
            }
            .into_any()
        })
    };

    view! {
        <section class="audit-view" aria-labelledby="audit-title">
            <header class="audit-header">
                <h2 id="audit-title">"Audit log"</h2>
                <button type="button" class="link" on:click=move |_| {
                    ui.view.set(View::Conversation);
                    // The button goes with the view: the focus goes to the header's toggle, which stays.
                    crate::refocus_if_lost(None, vec![".audit-toggle".to_owned()]);
                }>
                    "Back to the conversation"
                </button>
            </header>
            <form class="audit-filters" on:submit=on_submit>
                <label>
                    <span>"Conversation"</span>
                    <select node_ref=session name="session">
                        <option value="">"All"</option>
                        {sessions}
                    </select>
                </label>
                <label>
                    <span>"Run"</span>
                    <input type="text" node_ref=run name="run" maxlength="128"/>
                </label>
                <label>
                    <span>"Tool"</span>
                    <select node_ref=tool name="tool">
                        <option value="">"Any"</option>
                        {tools}
                    </select>
                </label>
                <label>
                    <span>"Outcome"</span>
                    <select node_ref=outcome name="outcome">
                        <option value="">"Any"</option>
                        {outcomes}
                    </select>
                </label>
                <label>
                    <span>"From (UTC)"</span>
                    <input type="datetime-local" node_ref=since name="since"/>
                </label>
                <label>
                    <span>"Until (UTC)"</span>
                    <input type="datetime-local" node_ref=until name="until"/>
                </label>
                <button type="submit" class="apply-filters">"Show"</button>
            </form>
            {rows}
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_times_read_as_utc() {
        assert_eq!(parse_local("1970-01-01T00:00"), Some(0));
        assert_eq!(
            parse_local("2025-12-01T01:02"),
            Some(1_764_547_200_000 + 3_720_000)
        );
        assert_eq!(
            parse_local("2025-12-01T01:02:30"),
            Some(1_764_547_200_000 + 3_720_000)
        );
        assert_eq!(parse_local("nonsense"), None);
    }
}
