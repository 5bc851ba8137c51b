//! The ApprovalBar: one card per pending approval, what each call would do, editing before approving, and deciding
//! several at once. A card leaves only when its own `approvalResolved` event arrives, never on a request's success,
//! so the screen shows what the server holds.

use std::collections::BTreeSet;

use agent::wire::{ApprovalPreview, ApprovalRequest, DecisionScope, DiffLine, FileDiff};
use leptos::html;
use leptos::prelude::*;
use leptos::task::spawn_local;
use serde_json::{Map, Value};

use crate::api::{Choice, decide_approval};
use crate::components::mcp_trust_label;
use crate::format::{
    byte_size, countdown, counted, has_hidden, pretty_json, server_said, shown_json, visible,
    visible_title,
};
use crate::rules::{AlwaysAllow, scope_notes, session_buttons};
use crate::schema;
use crate::state::{ApprovalKey, Ui, card_dom_id, key_of, left_for_login};

fn ui() -> Ui {
    expect_context::<Ui>()
}

/// Sends one decision. The card leaves when `approvalResolved` arrives on the stream, never on this call's success.
pub fn send_decision(
    ui: Ui,
    key: ApprovalKey,
    choice: Choice,
    reason: Option<String>,
    arguments: Option<Value>,
) {
    let newly = ui
        .deciding
        .try_update(|deciding| deciding.insert(key.clone()));
    if newly != Some(true) {
        return;
    }
    let session = ui.session_id();
    // An approval for the session approves the run's other cards that it covers; the ones the person is editing or
    // writing a reason on stay, for what they are doing, and so do those whose own decision is on its way (a Deny
    // sent a moment before must not be overtaken by this approval).
    let keep_waiting = matches!(
        choice,
        Choice::ApproveForSession | Choice::ApproveProgramForSession
    )
    .then(|| {
        let busy: Vec<_> = ui.session.with_untracked(|session| {
            session
                .pending_approvals()
                .map(key_of)
                .filter(|other| other.0 == key.0 && other.1 != key.1)
                .filter(|other| {
                    ui.editing.with_untracked(|editing| editing.contains(other))
                        || card_reason(other).is_some()
                        || ui
                            .deciding
                            .with_untracked(|deciding| deciding.contains(other))
                })
                .map(|other| other.1)
                .collect()
        });
        serde_json::to_string(&busy).unwrap_or_default()
    });
    spawn_local(async move {
        let arguments = arguments.map(|value| value.to_string());
        let sent = decide_approval(
            key.0.clone(),
            key.1.clone(),
            choice,
            reason,
            arguments,
            Some(session),
            keep_waiting,
        )
        .await;
        if let Err(error) = sent
            && !left_for_login(&error)
        {
            ui.error.set(Some(match &error {
                // The request or its answer was lost: the server may have decided the call all the same.
                ServerFnError::Request(why) => format!(
                    "The decision may not have reached the server ({why}); the card stays until the server says the call was decided."
                ),
                _ => format!("The decision was refused: {}", server_said(&error)),
            }));
            ui.deciding.update(|deciding| {
                deciding.remove(&key);
            });
            // The button pressed was disabled while the decision was on its way, and the focus fell off it.
            focus_card_when_lost(&key);
        }
    });
}

/// Whether a click is the second (or a later) one of a double click: not meant for a button that may have come
/// under the pointer since the first (the next card, once the first one's card left), so a decision ignores it.
/// A click from the keyboard counts 0.
pub(crate) fn second_click(event: &leptos::ev::MouseEvent) -> bool {
    event.detail() > 1
}

/// The path or command a call is about, for the card's title (to be shown through [`visible`]). A command is
/// written whole, its arguments too: a compact card, among others, shows its title and not its details, and `rm` is
/// not `rm -rf notes.txt`.
fn target(request: &ApprovalRequest) -> Option<String> {
    match &request.preview {
        Some(ApprovalPreview::FileWrite { path, .. }) => Some(path.clone()),
        Some(ApprovalPreview::FileDelete { path, .. }) => Some(path.clone()),
        Some(ApprovalPreview::Command { program, args, .. }) => {
            Some(agent::permissions::shell_words(program, args))
        }
        _ => request
            .arguments
            .get("path")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

/// A preview as the card shows it: every text the call or the file brings with its hidden characters written out
/// ([`visible`]), so that nothing reads otherwise than it runs.
fn shown(preview: ApprovalPreview) -> ApprovalPreview {
    let all = |texts: Vec<String>| texts.iter().map(|text| visible(text)).collect();
    match preview {
        ApprovalPreview::FileWrite { path, mut diff } => {
            for line in &mut diff.lines {
                match line {
                    DiffLine::Same { text, .. }
                    | DiffLine::Added { text, .. }
                    | DiffLine::Removed { text, .. } => *text = visible(text),
                    DiffLine::Folded { .. } => {}
                }
            }
            ApprovalPreview::FileWrite {
                path: visible(&path),
                diff,
            }
        }
        ApprovalPreview::FileDelete {
            path,
            bytes,
            head,
            more,
            note,
        } => ApprovalPreview::FileDelete {
            path: visible(&path),
            bytes,
            head: all(head),
            more,
            note,
        },
        ApprovalPreview::Command {
            program,
            args,
            directory,
        } => ApprovalPreview::Command {
            program: visible(&program),
            args: all(args),
            directory: visible(&directory),
        },
        ApprovalPreview::Fields {
            server,
            tool,
            fields,
        } => ApprovalPreview::Fields {
            server,
            tool: tool.map(|tool| visible(&tool)),
            fields: fields
                .into_iter()
                .map(|field| agent::wire::PreviewField {
                    name: visible(&field.name),
                    value: visible(&field.value),
                })
                .collect(),
        },
        unavailable @ ApprovalPreview::Unavailable { .. } => unavailable,
    }
}

/// What a write would change: line numbers, added and removed lines, folded stretches.
#[component]
fn DiffView(diff: FileDiff) -> impl IntoView {
    let summary = if diff.new_file {
        format!(
            "New file, {} · {}",
            byte_size(diff.new_bytes),
            counted(diff.added.into(), "line", "lines")
        )
    } else {
        format!(
            "{} → {} · +{} −{}",
            byte_size(diff.old_bytes.unwrap_or_default()),
            byte_size(diff.new_bytes),
            diff.added,
            diff.removed
        )
    };
    let rows = diff
        .lines
        .into_iter()
        .map(|line| {
            let (class, old, new, sign, text) = match line {
                DiffLine::Same { old, new, text } => {
                    ("same", old.to_string(), new.to_string(), " ", text)
                }
                DiffLine::Added { new, text } => ("added", String::new(), new.to_string(), "+", text),
                DiffLine::Removed { old, text } => {
                    ("removed", old.to_string(), String::new(), "−", text)
                }
                DiffLine::Folded { count, .. } => {
                    let text = counted(count.into(), "unchanged line", "unchanged lines");
                    return view! {
                        <tr class="folded"><td colspan="4">{text}</td></tr>
                    }
                    .into_any();
                }
            };
            view! {
                <tr class=class>
                    <td class="ln">{old}</td>
                    <td class="ln">{new}</td>
                    <td class="sign" aria-hidden="true">{sign}</td>
                    <td class="text"><span class="visually-hidden">{match class { "added" => "added: ", "removed" => "removed: ", _ => "" }}</span>{text}</td>
                </tr>
            }
            .into_any()
        })
        .collect_view();
    let omitted = (diff.omitted > 0).then(|| {
        view! { <p class="note">{format!("{} not shown.", counted(diff.omitted.into(), "more line", "more lines"))}</p> }
    });
    let note = diff.note.map(|note| view! { <p class="note">{note}</p> });
    view! {
        <p class="diff-summary">{summary}</p>
        {note}
        <div class="diff-scroll" tabindex="0" role="region" aria-label="The change to the file">
            <table class="diff">
                <thead class="visually-hidden">
                    <tr><th scope="col">"Line now"</th><th scope="col">"Line after"</th><th scope="col">"Change"</th><th scope="col">"Text"</th></tr>
                </thead>
                <tbody>{rows}</tbody>
            </table>
        </div>
        {omitted}
    }
}

/// What the call would do, as the server worked it out when it asked.
#[component]
fn Preview(preview: ApprovalPreview) -> impl IntoView {
    match preview {
        ApprovalPreview::FileWrite { path, diff } => view! {
            <div class="preview file-write" data-kind="fileWrite">
                <p class="preview-title">"Write " <code>{path}</code></p>
                <DiffView diff/>
            </div>
        }
        .into_any(),
        ApprovalPreview::FileDelete {
            path,
            bytes,
            head,
            more,
            note,
        } => {
            let lines = head
                .into_iter()
                .map(|line| view! { <li><code>{line}</code></li> })
                .collect_view();
            view! {
                <div class="preview file-delete" data-kind="fileDelete">
                    <p class="preview-title">"Delete " <code>{path}</code> {format!(" · {}", byte_size(bytes))}</p>
                    {note.map(|note| view! { <p class="note">{note}</p> })}
                    <ol class="head" aria-label="The file's first lines">{lines}</ol>
                    {more.then(|| view! { <p class="note">"… and more."</p> })}
                </div>
            }
            .into_any()
        }
        ApprovalPreview::Command {
            program,
            args,
            directory,
        } => {
            let args = args
                .into_iter()
                .map(|arg| view! { <li><code>{arg}</code></li> })
                .collect_view();
            view! {
                <div class="preview command" data-kind="command">
                    <dl>
                        <dt>"Program"</dt>
                        <dd><code class="program">{program}</code></dd>
                        <dt>"Arguments, each exactly as the program receives it"</dt>
                        <dd><ol class="args">{args}</ol></dd>
                        <dt>"Directory"</dt>
                        <dd><code>{directory}</code></dd>
                    </dl>
                </div>
            }
            .into_any()
        }
        ApprovalPreview::Fields { server, fields, .. } => {
            let fields = fields
                .into_iter()
                .map(|field| view! { <dt>{field.name}</dt><dd><pre>{field.value}</pre></dd> })
                .collect_view();
            view! {
                <div class="preview fields" data-kind="fields">
                    {server.map(|server| view! { <p class="preview-title">"From the MCP server " <code>{server}</code></p> })}
                    <dl>{fields}</dl>
                </div>
            }
            .into_any()
        }
        ApprovalPreview::Unavailable { reason } => view! {
            <div class="preview unavailable" data-kind="unavailable">
                <p class="note">{reason}</p>
            </div>
        }
        .into_any(),
    }
}

/// A tool's fields when its schema is simple enough to edit one by one: an object whose properties are all strings.
/// The required ones first, in their order.
fn simple_fields(schema: &Value) -> Option<Vec<String>> {
    let properties = schema.get("properties")?.as_object()?;
    if properties
        .values()
        .any(|property| property.get("type").and_then(Value::as_str) != Some("string"))
    {
        return None;
    }
    let mut names: Vec<String> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|required| {
            required
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    for name in properties.keys() {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    Some(names)
}

/// Whether editing field by field (`names`, each a text) keeps the whole of `arguments`: an object whose every
/// argument is one of them and a text. Otherwise an argument the schema does not name, or a value that is not
/// text, would be dropped or turned into text by the edit, and the JSON is edited instead.
fn fields_hold(names: &[String], arguments: &Value) -> bool {
    arguments.as_object().is_some_and(|arguments| {
        arguments
            .iter()
            .all(|(name, value)| value.is_string() && names.contains(name))
    })
}

/// The fields whose value differs between the model's arguments and the edited ones.
fn edited_fields(original: &Value, edited: &Value) -> Vec<String> {
    let empty = Map::new();
    let (before, after) = (
        original.as_object().unwrap_or(&empty),
        edited.as_object().unwrap_or(&empty),
    );
    let names: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    names
        .into_iter()
        .filter(|name| before.get(*name) != after.get(*name))
        .cloned()
        .collect()
}

/// Whether a text of the arguments holds a carriage return. A browser's text box gives its text back with every
/// line break as a line feed (and a one-line box drops them), so such a text is edited in the JSON, where it is
/// written `\r` and comes back as it was.
fn has_carriage_return(arguments: &Value) -> bool {
    match arguments {
        Value::String(text) => text.contains('\r'),
        Value::Array(items) => items.iter().any(has_carriage_return),
        Value::Object(fields) => fields.values().any(has_carriage_return),
        _ => false,
    }
}

/// The editor's state: one text per field, or the whole JSON.
#[derive(Clone, Debug)]
enum Draft {
    Fields(Vec<(String, RwSignal<String>)>),
    Json(RwSignal<String>),
}

impl Draft {
    fn new(schema: Option<&Value>, arguments: &Value) -> Self {
        match schema.and_then(simple_fields) {
            Some(names) if fields_hold(&names, arguments) && !has_carriage_return(arguments) => {
                Draft::Fields(
                    names
                        .into_iter()
                        .map(|name| {
                            let value = arguments
                                .get(&name)
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned();
                            (name, RwSignal::new(value))
                        })
                        .collect(),
                )
            }
            _ => Draft::Json(RwSignal::new(pretty_json(arguments))),
        }
    }

    /// The arguments the draft stands for. A field the model did not send and the person left empty stays out.
    fn value(&self, original: &Value) -> Result<Value, String> {
        match self {
            Draft::Fields(fields) => {
                let mut object = Map::new();
                for (name, text) in fields {
                    let text = text.get();
                    if text.is_empty() && original.get(name).is_none() {
                        continue;
                    }
                    object.insert(name.clone(), Value::String(text));
                }
                Ok(Value::Object(object))
            }
            Draft::Json(text) => serde_json::from_str(&text.get())
                .map_err(|error| format!("/: is not valid JSON ({error})")),
        }
    }
}

#[component]
fn Editor(
    draft: Draft,
    dom_id: String,
    problems: RwSignal<Vec<String>>,
    /// The fields the draft changes, or `None` while its JSON does not read.
    edited: Memo<Option<Vec<String>>>,
    /// When the card offers approvals for the session, which are off while it is edited: the id of the note in which
    /// the editor says why (the buttons are described by it meanwhile).
    session_note: Option<String>,
) -> impl IntoView {
    let errors_id = format!("{dom_id}-edit-errors");
    // The problems are those of the arguments as they were sent: once the person types again they are gone, and
    // the next Approve edited checks the new text.
    let retype = move |text: RwSignal<String>, typed: String| {
        text.set(typed);
        if problems.with_untracked(|problems| !problems.is_empty()) {
            problems.set(Vec::new());
        }
    };
    let described = errors_id.clone();
    // A field is marked invalid when a problem names it (or the whole arguments).
    let invalid = move |field: Option<String>| {
        move || {
            problems
                .with(|problems| {
                    problems.iter().any(|problem| match &field {
                        _ if problem.starts_with("/:") => true,
                        Some(name) => {
                            problem.starts_with(&format!("/{name}:"))
                                || problem.starts_with(&format!("/{name}/"))
                        }
                        None => true,
                    })
                })
                .to_string()
        }
    };
    let inputs = match draft {
        Draft::Fields(fields) => fields
            .into_iter()
            .map(|(name, text)| {
                let id = format!("{dom_id}-field-{name}");
                let multiline = name == "content" || text.get_untracked().contains('\n');
                let described = described.clone();
                let invalid = invalid(Some(name.clone()));
                let input = if multiline {
                    view! {
                        <textarea id=id.clone() rows="6" spellcheck="false" aria-invalid=invalid aria-describedby=described
                            prop:value=move || text.get() on:input=move |event| retype(text, event_target_value(&event))></textarea>
                    }
                    .into_any()
                } else {
                    view! {
                        <input type="text" id=id.clone() spellcheck="false" aria-invalid=invalid aria-describedby=described
                            prop:value=move || text.get() on:input=move |event| retype(text, event_target_value(&event))/>
                    }
                    .into_any()
                };
                view! {
                    <div class="field">
                        <label for=id>{name}</label>
                        {input}
                    </div>
                }
                .into_any()
            })
            .collect_view()
            .into_any(),
        Draft::Json(text) => {
            let id = format!("{dom_id}-json");
            view! {
                <div class="field">
                    <label for=id.clone()>"Arguments (JSON)"</label>
                    <textarea id=id rows="8" spellcheck="false" aria-invalid=invalid(None) aria-describedby=described
                        prop:value=move || text.get() on:input=move |event| retype(text, event_target_value(&event))></textarea>
                </div>
            }
            .into_any()
        }
    };
    view! {
        <div class="editor" role="group" aria-label="Edit the arguments">
            // First, next to the buttons it explains.
            {session_note.map(|id| view! {
                <p class="edit-note" id=id role="note">
                    "Approving for the session is off while you edit: a grant covers calls as the card showed them, "
                    "not as edited. Approve edited runs this call once."
                </p>
            })}
            {inputs}
            <p class="edited-fields" role="status">
                {move || {
                    match edited.get() {
                        None => "The arguments are not valid JSON yet.".to_owned(),
                        Some(edited) if edited.is_empty() => "Nothing edited yet.".to_owned(),
                        Some(edited) => format!("Edited: {}", edited.join(", ")),
                    }
                }}
            </p>
            <ul id=errors_id class="edit-errors" role="alert" hidden=move || problems.with(Vec::is_empty)>
                {move || problems.get().into_iter().map(|problem| view! { <li>{problem}</li> }).collect_view()}
            </ul>
        </div>
    }
}

/// After a card (or the error banner) left: a focus it took with it (now on the page's body) goes to the first card,
/// or else to the message box, so a person at the keyboard goes on from where they were. Focus elsewhere stays where
/// it is. While the run goes on the box is disabled: the focus waits on the note that says so, and the box takes it
/// once it can be used (`Composer`).
pub(crate) fn hand_on_focus() {
    crate::refocus_if_lost(
        None,
        vec![
            ".approval-card".to_owned(),
            ".composer textarea:not([disabled])".to_owned(),
            "#composer-note".to_owned(),
        ],
    );
}

/// Gives the focus back to a card that still waits, when the focus is nowhere (on the page's body). Ids are letters,
/// digits and `- _ . :`, so the quoted attribute selector finds the card whatever its id.
pub(crate) fn focus_card_when_lost(key: &ApprovalKey) {
    crate::refocus_if_lost(None, vec![format!("[id=\"{}\"]", card_dom_id(key))]);
}

/// A frame later, once an edit has opened below a card's buttons: scrolls the list of cards (never the page) so that
/// the card starts at its top, its title and the edit's first fields in view together. Left where it was, a card low
/// in the list opened its edit below the list's visible part, and scrolling to the edit took the card's title out
/// of view, under the batch buttons.
fn show_from_its_top(card: NodeRef<html::Article>) {
    #[cfg(feature = "hydrate")]
    request_animation_frame(move || {
        use wasm_bindgen::JsCast;

        let Some(card) = card.get_untracked() else {
            return;
        };
        let Some(list) = card
            .closest(".approval-bar .cards")
            .ok()
            .flatten()
            .and_then(|list| list.dyn_into::<web_sys::HtmlElement>().ok())
        else {
            return;
        };
        // Both measured from the same offset parent; the list's padding keeps the card's border in view.
        let from_top = card.offset_top() - list.offset_top() - list.client_top();
        list.set_scroll_top((from_top - 2).max(0));
    });
    #[cfg(not(feature = "hydrate"))]
    let _ = card;
}

/// The id of a card's reason box.
fn card_reason_id(key: &ApprovalKey) -> String {
    format!("{}-reason", card_dom_id(key))
}

/// The reason written on a card's own reason box, if any.
fn card_reason(key: &ApprovalKey) -> Option<String> {
    document()
        .get_element_by_id(&card_reason_id(key))
        .and_then(|element| {
            use leptos::wasm_bindgen::JsCast;
            element.dyn_into::<leptos::web_sys::HtmlInputElement>().ok()
        })
        .map(|input| input.value())
        .filter(|reason| !reason.trim().is_empty())
}

#[component]
fn ApprovalCard(request: ApprovalRequest, crowded: Memo<bool>) -> impl IntoView {
    let ui = ui();
    let key = key_of(&request);
    let card = NodeRef::<html::Article>::new();
    let reason_input = NodeRef::<html::Input>::new();
    let dom_id = card_dom_id(&key);
    let title_id = format!("{dom_id}-title");
    let reason_text_id = format!("{dom_id}-why");
    let reason_id = card_reason_id(&key);
    let detail_id = format!("{dom_id}-detail");
    let expires_at = request.expires_at;
    // The page's clock ticks once a second: never show more time than the approval was given.
    let requested_at = request.requested_at;
    let original = StoredValue::new(request.arguments.clone());
    let schema = StoredValue::new(ui.schema_of(&request.tool_name));

    // Alone, a card shows what it would do; with others, each is compact (its title, reason and buttons in view)
    // until the person opens it.
    let opened = RwSignal::new(None::<bool>);
    let expanded = Signal::derive(move || opened.get().unwrap_or(!crowded.get()));
    let editing = RwSignal::new(None::<Draft>);
    let problems = RwSignal::new(Vec::<String>::new());
    let edited = Memo::new(move |_| {
        editing.with(|draft| match draft {
            None => Some(Vec::new()),
            Some(draft) => draft
                .value(&original.get_value())
                .ok()
                .map(|value| edited_fields(&original.get_value(), &value)),
        })
    });

    // A new card takes the focus (the card, not a button: a stray Enter must not approve anything), unless the
    // person is already at another card.
    Effect::new(move |_| {
        if let Some(card) = card.get() {
            let elsewhere = document()
                .active_element()
                .and_then(|active| active.closest(".approval-card").ok().flatten())
                .is_some();
            if !elsewhere {
                let _ = card.focus();
            }
        }
    });

    // The page keeps which cards show an edit (its Approve all holds back meanwhile, as a decision from elsewhere
    // would not send the edit either). When the card leaves (its call was settled, here or elsewhere), the focus it
    // held goes on, and an edit this page did not send is said to be lost rather than silently dropped.
    Effect::new({
        let key = key.clone();
        move |_| {
            let open = editing.with(Option::is_some);
            ui.editing.update(|keys| {
                if open {
                    keys.insert(key.clone());
                } else {
                    keys.remove(&key);
                }
            });
        }
    });
    on_cleanup({
        let key = key.clone();
        let tool = visible(&request.tool_name);
        move || {
            let drafting = ui
                .editing
                .try_update(|keys| keys.remove(&key))
                .unwrap_or(false);
            // A card whose call still waits is not leaving because it was settled (the page is being taken down or
            // drawn anew): there is nothing to say, and the focus is not its to move.
            let still_waits = ui
                .session
                .try_with_untracked(|session| {
                    session
                        .pending_approvals()
                        .any(|request| key_of(request) == key)
                })
                .unwrap_or(false);
            let gone = ui
                .gone
                .try_with_untracked(|gone| gone.contains(&key))
                .unwrap_or(false);
            if still_waits && !gone {
                return;
            }
            let sent_here = ui
                .deciding
                .try_with_untracked(|deciding| deciding.contains(&key))
                .unwrap_or(true);
            if drafting && !sent_here {
                ui.error.try_set(Some(format!(
                    "The call of {tool} you were editing was settled elsewhere (another tab, a timeout or the end of its run); your edit was not sent."
                )));
            }
            hand_on_focus();
        }
    });

    // The buttons wait for the page's code: a click before it runs would do nothing and say nothing. Then a
    // decision on its way holds them back until the server answers.
    let in_flight = {
        let key = key.clone();
        Memo::new(move |_| {
            !ui.hydrated.get() || ui.deciding.with(|deciding| deciding.contains(&key))
        })
    };
    let decide = {
        let key = key.clone();
        move |choice: Choice| {
            let reason = reason_input
                .get()
                .map(|input| input.value())
                .filter(|reason| !reason.trim().is_empty());
            let mut arguments = None;
            if choice != Choice::Deny
                && let Some(draft) = editing.get_untracked()
            {
                let value = match draft.value(&original.get_value()) {
                    Ok(value) => value,
                    Err(problem) => {
                        problems.set(vec![problem]);
                        return;
                    }
                };
                // Checked here first: arguments the schema refuses are never sent.
                let found = schema
                    .get_value()
                    .map(|schema| schema::check(&schema, &value))
                    .unwrap_or_default();
                if !found.is_empty() {
                    problems.set(found);
                    return;
                }
                problems.set(Vec::new());
                if value != original.get_value() {
                    arguments = Some(value);
                }
            }
            send_decision(ui, key.clone(), choice, reason, arguments);
        }
    };
    let approve = {
        let decide = decide.clone();
        move |event: leptos::ev::MouseEvent| {
            if !second_click(&event) {
                decide(Choice::Approve);
            }
        }
    };
    // A session scope covers what the card showed: not offered while the arguments are being edited.
    let session_offered = request
        .choices
        .session
        .iter()
        .any(|choice| choice.scope != DecisionScope::Once);
    let session_note = session_offered.then(|| format!("{dom_id}-session-note"));
    let session_choices = session_buttons(
        &request.choices,
        decide.clone(),
        move || in_flight.get() || editing.with(Option::is_some),
        {
            let session_note = session_note.clone();
            move || {
                session_note
                    .clone()
                    .filter(|_| editing.with(Option::is_some))
            }
        },
    );
    let always_allow = request.choices.always_allow.clone().map(|rule| {
        let key = key.clone();
        view! { <AlwaysAllow key rule in_flight/> }
    });
    let notes = scope_notes(&request.choices);
    let deny = move |event: leptos::ev::MouseEvent| {
        if !second_click(&event) {
            decide(Choice::Deny);
        }
    };
    let toggle_edit = {
        let request_arguments = request.arguments.clone();
        move |_| {
            if editing.with_untracked(Option::is_some) {
                editing.set(None);
                problems.set(Vec::new());
            } else {
                editing.set(Some(Draft::new(
                    schema.get_value().as_ref(),
                    &request_arguments,
                )));
                opened.set(Some(true));
                show_from_its_top(card);
            }
        }
    };

    // Where a tool of an MCP server comes from, and how far its server is believed: on the card itself, compact or
    // not. The servers as the page was rendered know the trust; a tool that came later still names its server.
    let origin = match ui.mcp_server_of(&request.tool_name) {
        Some(server) => Some((server.name, Some(mcp_trust_label(server.trust)))),
        None => match &request.preview {
            Some(ApprovalPreview::Fields {
                server: Some(server),
                ..
            }) => Some((server.clone(), None)),
            _ => None,
        },
    };
    // The tool's own name on its server, where the name the model sees does not spell it (cut short, or made safe).
    let own_name = match &request.preview {
        Some(ApprovalPreview::Fields {
            tool: Some(tool), ..
        }) => Some(visible(tool)),
        _ => None,
    };
    // Characters that would make the card read otherwise than the call runs are written out, and said to be there:
    // wherever the card shows a text otherwise than it is. (The arguments' JSON escapes the control characters.)
    let preview = request.preview.clone().map(shown);
    let raw_target = target(&request);
    let target = raw_target.as_deref().map(visible_title);
    let hidden = has_hidden(&request.arguments.to_string())
        || preview != request.preview
        || target != raw_target;
    let has_preview = preview.is_some();
    let arguments_json = shown_json(&request.arguments);
    let editor_id = dom_id.clone();
    let labelled_by = title_id.clone();
    let described_by = reason_text_id.clone();
    let reason_for = reason_id.clone();

    view! {
        <article
            class="approval-card"
            id=dom_id
            tabindex="-1"
            aria-labelledby=labelled_by
            aria-describedby=described_by
            data-tool-call-id=request.tool_call_id.to_string()
            data-editing=move || editing.with(Option::is_some).to_string()
            node_ref=card
        >
            <header>
                <h2 id=title_id>
                    "Run " <code>{request.tool_name.clone()}</code> "?"
                    {target.map(|target| view! { " " <span class="target">{target}</span> })}
                </h2>
                <span class="countdown">{move || countdown(expires_at, ui.now_ms.get().max(requested_at))}</span>
            </header>
            {origin.map(|(server, trust)| view! {
                <p class="origin">
                    "A tool of the MCP server " <code>{server}</code>
                    {own_name.map(|tool| view! { ", named " <code class="mcp-tool">{tool}</code> " there" })}
                    {trust.map(|trust| format!(", {trust}"))}
                </p>
            })}
            <p class="reason" id=reason_text_id>{visible(&request.reason)}</p>
            {hidden.then(|| view! {
                <p class="hidden-characters" role="note">
                    "This call holds characters that would hide themselves or turn text around; they are shown as "
                    <code>"\\u{…}"</code> "."
                </p>
            })}
            <div class="actions">
                <button type="button" class="approve" on:click=approve disabled=move || in_flight.get()>
                    {move || if editing.with(Option::is_some) { "Approve edited" } else { "Approve" }}
                </button>
                {session_choices}
                <label class="deny-reason" for=reason_for>
                    <span class="visually-hidden">"Reason (optional)"</span>
                    <input type="text" id=reason_id node_ref=reason_input maxlength="2000" placeholder="Reason (optional)"
                        disabled=move || in_flight.get()/>
                </label>
                <button type="button" class="deny" on:click=deny disabled=move || in_flight.get()>
                    "Deny"
                </button>
                <button type="button" class="edit" aria-pressed=move || editing.with(Option::is_some).to_string()
                    on:click=toggle_edit disabled=move || in_flight.get()>
                    {move || if editing.with(Option::is_some) { "Cancel edit" } else { "Edit" }}
                </button>
                <button type="button" class="link toggle-detail" aria-expanded=move || expanded.get().to_string()
                    aria-controls=detail_id.clone() on:click=move |_| opened.set(Some(!expanded.get_untracked()))>
                    {move || if expanded.get() { "Hide details" } else { "Show details" }}
                </button>
            </div>
            <div class="detail" id=detail_id hidden=move || !expanded.get()>
                {move || editing.get().map(|draft| view! {
                    <Editor draft dom_id=editor_id.clone() problems edited session_note=session_note.clone()/>
                })}
                <div hidden=move || editing.with(Option::is_some)>
                    {preview.map(|preview| view! { <Preview preview/> })}
                    {if has_preview {
                        view! {
                            <details class="raw-arguments">
                                <summary>"Arguments as JSON"</summary>
                                <pre class="arguments" aria-label="Arguments">{arguments_json}</pre>
                            </details>
                        }
                        .into_any()
                    } else {
                        view! { <pre class="arguments" aria-label="Arguments">{arguments_json}</pre> }.into_any()
                    }}
                    // What each session scope covers (each button's title says it too), and the rule Always
                    // allow would add: with the details, so that a compact card keeps its buttons in view.
                    {notes}
                    {always_allow}
                </div>
            </div>
        </article>
    }
    .into_any()
}

/// Approve all and Deny all, when several cards wait. Each card still leaves on its own `approvalResolved`.
#[component]
fn BatchActions(pending: Memo<Vec<ApprovalRequest>>) -> impl IntoView {
    let ui = ui();
    let reason = NodeRef::<html::Input>::new();
    let undecided = move || {
        let deciding = ui.deciding.get();
        pending
            .get()
            .iter()
            .map(key_of)
            .filter(|key| !deciding.contains(key))
            .collect::<Vec<_>>()
    };
    // Approve all approves what the cards show: not while one shows an edit, which only its own Approve sends.
    let edit_open = move || {
        let editing = ui.editing.get();
        pending.with(|pending| {
            pending
                .iter()
                .any(|request| editing.contains(&key_of(request)))
        })
    };
    // A card with a reason written on it is one the person means to decide on its own (a reason goes with a denial
    // more often than not): Approve all leaves it, as an approval for the session does, and says so.
    let left_with_reason = RwSignal::new(Vec::<ApprovalKey>::new());
    // Of those, the ones still waiting: the note goes with them.
    let still_left = move || {
        left_with_reason.with(|left| {
            pending.with(|pending| {
                pending
                    .iter()
                    .filter(|request| left.contains(&key_of(request)))
                    .count()
            })
        })
    };
    // A second click of a double click would also decide the cards that came meanwhile, unseen.
    let approve_all = move |event: leptos::ev::MouseEvent| {
        if edit_open() || second_click(&event) {
            return;
        }
        let (reasoned, approved): (Vec<_>, Vec<_>) = undecided()
            .into_iter()
            .partition(|key| card_reason(key).is_some());
        left_with_reason.set(reasoned);
        for key in approved {
            send_decision(ui, key, Choice::Approve, None, None);
        }
    };
    let deny_all = move |event: leptos::ev::MouseEvent| {
        if second_click(&event) {
            return;
        }
        let why = reason
            .get()
            .map(|input| input.value())
            .filter(|reason| !reason.trim().is_empty());
        for key in undecided() {
            // A reason written on the card itself is the one its call is denied with.
            let own = card_reason(&key);
            send_decision(ui, key, Choice::Deny, own.or_else(|| why.clone()), None);
        }
    };
    let none_left = move || !ui.hydrated.get() || undecided().is_empty();
    view! {
        <div class="batch" role="group" aria-label="Decide every pending approval">
            <p class="batch-count" role="status">{move || format!("{} approvals wait", pending.with(Vec::len))}</p>
            <button type="button" class="approve-all" on:click=approve_all
                disabled=move || none_left() || edit_open() aria-describedby="approve-all-held">
                "Approve all"
            </button>
            <label class="deny-reason" for="deny-all-reason">
                <span class="visually-hidden">"Reason for denying all (optional)"</span>
                <input type="text" id="deny-all-reason" node_ref=reason maxlength="2000"
                    placeholder="Reason for denying all (optional)"/>
            </label>
            <button type="button" class="deny-all" on:click=deny_all disabled=none_left>
                "Deny all"
            </button>
            <p id="approve-all-held" class="note" hidden=move || !edit_open()>
                "A card is being edited: approve it on its own, or cancel the edit, before approving all."
            </p>
            <p class="note approve-all-left" role="status" hidden=move || still_left() == 0>
                {move || match still_left() {
                    1 => "Approve all left the card with a reason written on it: decide it with its own buttons.".to_owned(),
                    left => format!("Approve all left the {left} cards with a reason written on them: decide each with its own buttons."),
                }}
            </p>
        </div>
    }
}

/// One card per pending approval, with the batch buttons when several wait.
#[component]
pub fn ApprovalBar() -> impl IntoView {
    let ui = ui();
    let pending = Memo::new(move |_| ui.pending());
    let crowded = Memo::new(move |_| pending.with(|pending| pending.len() > 1));
    view! {
        <section class="approval-bar" aria-label="Pending approvals" hidden=move || pending.with(Vec::is_empty)>
            <Show when=move || pending.with(|pending| pending.len() > 1)>
                <BatchActions pending/>
            </Show>
            <div class="cards">
                <For
                    each=move || pending.get()
                    key=key_of
                    children=move |request| view! { <ApprovalCard request crowded/> }
                />
            </div>
        </section>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Editing field by field is offered only where the fields hold the whole call: an argument the schema does not
    /// name, or a value that is not text, would be dropped or turned into text by the edit, so such a call is
    /// edited as JSON.
    #[test]
    fn a_call_is_edited_field_by_field_only_where_the_fields_hold_all_of_it() {
        Owner::new().with(fields_hold_the_whole_call);
    }

    fn fields_hold_the_whole_call() {
        let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]});
        let fields = |arguments: Value| {
            matches!(
                Draft::new(Some(&schema), &arguments),
                Draft::Fields(ref fields) if fields.len() == 1
            )
        };
        assert!(fields(json!({"path": "a.txt"})));
        assert!(fields(json!({})));
        assert!(!fields(json!({"path": "a.txt", "force": true})));
        assert!(!fields(json!({"path": 5})));
        assert!(!fields(json!("a.txt")));
        // What the JSON editor starts from is the whole call.
        let Draft::Json(text) = Draft::new(Some(&schema), &json!({"path": "a", "force": true}))
        else {
            panic!("a JSON editor");
        };
        let edited: Value = serde_json::from_str(&text.get_untracked()).unwrap();
        assert_eq!(edited, json!({"path": "a", "force": true}));
    }
}
