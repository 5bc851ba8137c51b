//! Rules and session grants in the page: on a card, the session scopes the server offers and "Always allow" with
//! its confirmation; at the top, the panel that lists the session's grants and the rules in force, with a way to
//! remove what a person added. The card keeps its own layout; it places these parts.

use agent::ids::{GrantId, RuleId, RunId, SessionId, ToolCallId};
use agent::permissions::{ApprovalChoices, ListedRule, SessionGrant};
use agent::view::SessionView;
use agent::wire::{DecisionScope, Resolution};
use leptos::prelude::*;
use leptos::task::spawn_local;
use serde::{Deserialize, Serialize};

use crate::api::Choice;
use crate::card::{focus_card_when_lost, second_click};
use crate::format::{server_said, visible};
use crate::state::{ApprovalKey, Ui, left_for_login};

/// What the panel shows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RulesAndGrants {
    pub rules: Vec<ListedRule>,
    /// The grants of the conversation the page shows; `None` when it is no longer one of this browser's (its list
    /// keeps the most recent ones), whose grants it may not see.
    pub grants: Option<Vec<SessionGrant>>,
}

#[server(prefix = "/api/fn", endpoint = "rules")]
pub async fn load_rules_and_grants(
    session: Option<SessionId>,
) -> Result<RulesAndGrants, ServerFnError> {
    let harness = crate::api::ssr::harness()?;
    // The conversation the page shows, when it is one of this browser's: another's grants are not shown, and the
    // panel says so rather than that there are none.
    let session = crate::api::ssr::acting_session(session)?;
    Ok(RulesAndGrants {
        rules: harness
            .rules()
            .await
            .map_err(|error| crate::api::ssr::rules_refused(&error))?,
        grants: match session {
            Some(session) => Some(
                harness
                    .grants(&session)
                    .await
                    .map_err(|error| crate::api::ssr::unavailable(error.to_string()))?
                    .list()
                    .to_vec(),
            ),
            None => None,
        },
    })
}

/// How an "Always allow" ended, once its rule is in force (an error means no rule was added).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AlwaysAllowed {
    /// The rule is in force, and the call was approved.
    Approved,
    /// The rule is in force, but the call was not approved (it was decided meanwhile, its run ended, the database
    /// refused the decision): why.
    RuleOnly { reason: String },
}

/// Adds the rule the card offered for this pending call, then approves the call once. `rule` is the text the
/// person confirmed; it must be the one offered, so what was confirmed is what is added.
#[server(prefix = "/api/fn", endpoint = "always_allow")]
pub async fn always_allow(
    run_id: RunId,
    tool_call_id: ToolCallId,
    rule: String,
    session: Option<SessionId>,
) -> Result<AlwaysAllowed, ServerFnError> {
    use agent::policy::{Rule, RuleBookError};
    use agent::wire::Decision;

    use crate::api::ssr;

    let harness = ssr::harness()?;
    let actor = ssr::actor()?;
    ssr::deciding_session(&harness, session, &run_id, &tool_call_id).await?;
    let gone = || ssr::approval_not_found(&run_id, &tool_call_id);
    let pending = harness
        .pending(Some(&run_id))
        .await
        .map_err(|error| ssr::unavailable(error.to_string()))?
        .into_iter()
        .find(|request| request.tool_call_id == tool_call_id)
        .ok_or_else(gone)?;
    let offered = pending.choices.always_allow.ok_or_else(|| {
        ssr::invalid("This approval offers no rule to always allow it.".to_owned())
    })?;
    if offered != rule {
        return Err(ssr::invalid(format!(
            "The rule confirmed ({rule}) is not the one offered ({offered}); nothing was added."
        )));
    }
    let parsed = Rule::parse(&offered).map_err(|error| ssr::invalid(error.to_string()))?;
    match harness.add_rule(parsed, &actor).await {
        // Another card, tab or person added the same rule first: what was confirmed is in force.
        Ok(_) | Err(RuleBookError::AlreadyPresent { .. }) => {}
        Err(error) => return Err(ssr::rules_refused(&error)),
    }
    // The rule is in force from here on, whatever becomes of the call: the page must know it was added.
    Ok(
        match harness
            .decide(&run_id, &tool_call_id, Decision::approve(), &actor)
            .await
        {
            Ok(_) => AlwaysAllowed::Approved,
            // What the database said goes to the log; the page gets the words every route gives.
            Err(agent::harness::DecideError::Unavailable(error)) => {
                tracing::warn!(%error, "the rule was added, and the approval could not be recorded");
                AlwaysAllowed::RuleOnly {
                    reason: crate::api::APPROVAL_NOT_RECORDED.to_owned(),
                }
            }
            Err(error) => AlwaysAllowed::RuleOnly {
                reason: error.to_string(),
            },
        },
    )
}

#[server(prefix = "/api/fn", endpoint = "remove_rule")]
pub async fn remove_rule(rule_id: RuleId) -> Result<(), ServerFnError> {
    let harness = crate::api::ssr::harness()?;
    let actor = crate::api::ssr::actor()?;
    harness
        .remove_rule(&rule_id, &actor)
        .await
        .map(|_| ())
        .map_err(|error| crate::api::ssr::rules_refused(&error))
}

/// Revokes a grant of the caller's own session.
#[server(prefix = "/api/fn", endpoint = "revoke_grant")]
pub async fn revoke_grant(
    grant_id: GrantId,
    session: Option<SessionId>,
) -> Result<(), ServerFnError> {
    let harness = crate::api::ssr::harness()?;
    let actor = crate::api::ssr::actor()?;
    let Some(session) = crate::api::ssr::acting_session(session)? else {
        return Err(crate::api::ssr::not_found(format!(
            "No grant {grant_id} in this session."
        )));
    };
    harness
        .revoke_grant(&session, &grant_id, &actor)
        .await
        .map(|_| ())
        .map_err(|error| match error {
            agent::harness::RevokeError::NotFound(unknown) => {
                crate::api::ssr::not_found(unknown.to_string())
            }
            agent::harness::RevokeError::Unavailable(unavailable) => {
                crate::api::ssr::unavailable(unavailable.to_string())
            }
        })
}

/// One button per session scope the server offers, with what it covers as its title: the card never promises
/// more than the grant. `decide` sends the choice; `described_by` names what says why the buttons are off, when
/// something does.
pub fn session_buttons(
    choices: &ApprovalChoices,
    decide: impl Fn(Choice) + Clone + Send + Sync + 'static,
    disabled: impl Fn() -> bool + Clone + Send + Sync + 'static,
    described_by: impl Fn() -> Option<String> + Clone + Send + Sync + 'static,
) -> impl IntoView {
    choices
        .session
        .iter()
        .filter_map(|choice| {
            let (class, pick) = match choice.scope {
                DecisionScope::Session => ("approve-session", Choice::ApproveForSession),
                DecisionScope::SessionProgram => {
                    ("approve-session-program", Choice::ApproveProgramForSession)
                }
                DecisionScope::Once => return None,
            };
            let decide = decide.clone();
            let disabled = disabled.clone();
            let described_by = described_by.clone();
            Some(view! {
                <button
                    type="button"
                    class=class
                    title=visible(&choice.covers)
                    on:click=move |event| if !second_click(&event) { decide(pick) }
                    disabled=disabled
                    aria-describedby=described_by
                >
                    {visible(&choice.label)}
                </button>
            })
        })
        .collect_view()
}

/// What each session scope covers, and why one is not offered.
pub fn scope_notes(choices: &ApprovalChoices) -> impl IntoView {
    let notes: Vec<String> = choices
        .session
        .iter()
        .map(|choice| visible(&format!("{}: {}", choice.label, choice.covers)))
        .chain(choices.session_note.clone())
        .collect();
    (!notes.is_empty()).then(|| {
        let items = notes
            .into_iter()
            .map(|note| view! { <li>{note}</li> })
            .collect_view();
        view! { <ul class="scope-notes">{items}</ul> }
    })
}

/// "Always allow…": shows the rule it would add and adds it only once the person confirms, then approves the call.
#[component]
pub fn AlwaysAllow(key: ApprovalKey, rule: String, in_flight: Memo<bool>) -> impl IntoView {
    let ui = expect_context::<Ui>();
    let confirming = RwSignal::new(false);
    let opener = NodeRef::<leptos::html::Button>::new();
    let rule = StoredValue::new(rule);
    let confirm = move |event: leptos::ev::MouseEvent| {
        if second_click(&event) {
            return;
        }
        let key = key.clone();
        let rule = rule.get_value();
        let newly = ui
            .deciding
            .try_update(|deciding| deciding.insert(key.clone()));
        if newly != Some(true) {
            return;
        }
        spawn_local(async move {
            // The card leaves when `approvalResolved` arrives, as for any decision.
            match always_allow(key.0.clone(), key.1.clone(), rule, Some(ui.session_id())).await {
                Ok(AlwaysAllowed::Approved) => ui.rules_changed.update(|n| *n += 1),
                Ok(AlwaysAllowed::RuleOnly { reason }) => {
                    ui.rules_changed.update(|n| *n += 1);
                    ui.error.set(Some(format!(
                        "The rule was added, but the call was not approved: {reason}"
                    )));
                    ui.deciding.update(|deciding| {
                        deciding.remove(&key);
                    });
                    focus_card_when_lost(&key);
                }
                Err(error) if left_for_login(&error) => {}
                Err(error) => {
                    ui.error.set(Some(format!(
                        "The rule was not added: {}",
                        server_said(&error)
                    )));
                    ui.deciding.update(|deciding| {
                        deciding.remove(&key);
                    });
                    // The button pressed was disabled while the request was on its way, and the focus fell off it.
                    focus_card_when_lost(&key);
                }
            }
        });
    };
    view! {
        <div class="always-allow">
            <button
                type="button"
                class="link always-allow-open"
                aria-expanded=move || confirming.get().to_string()
                on:click=move |_| confirming.set(true)
                disabled=move || in_flight.get()
                node_ref=opener
            >
                "Always allow…"
            </button>
            <Show when=move || confirming.get()>
                <div class="confirm" role="group" aria-label="Confirm the rule">
                    <span>"Add this rule? Calls it covers run without asking, in every session, until it is removed:"</span>
                    <code class="rule-text">{visible(&rule.get_value())}</code>
                    <button type="button" class="approve always-allow-confirm" on:click=confirm.clone() disabled=move || in_flight.get()>
                        "Add rule and approve"
                    </button>
                    <button type="button" class="always-allow-cancel" on:click=move |_| {
                        confirming.set(false);
                        // The button pressed goes with the confirmation: the focus goes back to what opened it.
                        if let Some(opener) = opener.get_untracked() {
                            let _focused = opener.focus();
                        }
                    }>
                        "Cancel"
                    </button>
                </div>
            </Show>
        </div>
    }
    .into_any()
}

/// How many calls of the session were approved for the session: when it changes, the grants did.
fn session_approvals(session: &SessionView) -> usize {
    session
        .runs
        .iter()
        .flat_map(|run| &run.steps)
        .flat_map(|step| &step.tool_calls)
        .filter(|call| {
            matches!(
                call.resolution,
                Some(Resolution::Approved { scope, .. }) if scope != DecisionScope::Once
            )
        })
        .count()
}

/// The session's grants and the rules in force, each with a way to remove it where that is possible.
#[component]
pub fn RulesPanel() -> impl IntoView {
    let ui = expect_context::<Ui>();
    let panel = RwSignal::new(None::<RulesAndGrants>);
    let details = NodeRef::<leptos::html::Details>::new();
    // Set by a removal: the button pressed goes with its line, so the focus is handed on, to these (CSS selectors,
    // in order), once the list is redrawn.
    let hand_on_focus = StoredValue::new(None::<Vec<String>>);
    // The newest load: an older one that answers after it is not shown (it may predate a removal).
    let loads = StoredValue::new(0_u64);
    // A removal or revocation on its way, until the list it changed is read again: every such button waits for it,
    // so that a double click sends one request (the second would come back "not found"), and a click meant for a
    // line that went never lands on the line that took its place.
    let removing = RwSignal::new(false);
    let approvals = Memo::new(move |_| ui.session.with(session_approvals));
    // Another tab may have revoked a grant or removed a rule, which nothing in this tab's stream says: the panel
    // reads them again when it is opened, and when the window takes the focus back with the panel open.
    let open = move || {
        details
            .get_untracked()
            .is_some_and(|details| details.open())
    };
    let reload = move || ui.rules_changed.update(|n| *n += 1);
    #[cfg(feature = "hydrate")]
    {
        let on_focus = window_event_listener(leptos::ev::focus, move |_| {
            if open() {
                reload();
            }
        });
        on_cleanup(move || on_focus.remove());
    }
    // Effects run in the browser only: the server renders the panel closed and empty.
    Effect::new(move |_| {
        ui.rules_changed.track();
        // Read, not only tracked: a memo computes (and so follows the session) only once something reads it, and
        // one that was merely tracked would never change.
        approvals.get();
        let load = loads.get_value() + 1;
        loads.set_value(load);
        spawn_local(async move {
            let loaded = load_rules_and_grants(Some(ui.session_id())).await;
            if loads.get_value() != load {
                return;
            }
            // The buttons take clicks again once they stand for the lines shown (before the focus is handed on:
            // a disabled button takes none).
            match loaded {
                Ok(state) => {
                    panel.set(Some(state));
                    removing.set(false);
                    if let Some(targets) = hand_on_focus.get_value() {
                        hand_on_focus.set_value(None);
                        crate::refocus_if_lost(None, targets);
                    }
                }
                Err(error) if left_for_login(&error) => {}
                Err(error) => {
                    removing.set(false);
                    ui.error.set(Some(format!(
                        "The rules and grants could not be loaded: {}",
                        server_said(&error)
                    )));
                }
            }
        });
    });
    // After a removal from `list` (`grants` or `rules`) at `index`: the focus goes to the next line's button, or else
    // (the last line went) to the line before, or else to the first button left in that list, or else to the panel's
    // summary. (A line that is not the last keeps its place: the redrawn list reuses it for the next one, focus
    // and all.)
    let after = move |result: Result<(), ServerFnError>,
                      what: &'static str,
                      list: &'static str,
                      index: usize| {
        if let Err(error) = result
            && !left_for_login(&error)
        {
            ui.error
                .set(Some(format!("{what}: {}", server_said(&error))));
        }
        hand_on_focus.set_value(Some(vec![
            format!(
                ".rules-panel ul.{list} > li:nth-child(n+{}) button",
                index + 1
            ),
            format!(".rules-panel ul.{list} > li:last-child button"),
            format!(".rules-panel ul.{list} li button"),
            ".rules-panel summary".to_owned(),
        ]));
        reload();
    };
    let count = move || {
        panel.with(|state| {
            state.as_ref().map_or(0, |state| {
                state.rules.len() + state.grants.as_ref().map_or(0, Vec::len)
            })
        })
    };

    view! {
        <details class="rules-panel" node_ref=details on:toggle=move |_| if open() { reload() }>
            <summary>"Rules and grants (" {count} ")"</summary>
            {move || panel.get().map(|state| {
                let grants = match state.grants {
                    None => view! {
                        <p class="empty-list">"This conversation is no longer one of this browser's (it keeps its most recent ones), so its grants are not shown here."</p>
                    }.into_any(),
                    Some(grants) if grants.is_empty() => view! { <p class="empty-list">"Nothing is approved for this session."</p> }.into_any(),
                    Some(grants) => {
                    let items = grants.into_iter().enumerate().map(|(index, grant)| {
                        let id = grant.id.clone();
                        let described = visible(&grant.grant.describe());
                        view! {
                            <li class="grant" data-grant-id=grant.id.to_string()>
                                <span>{described.clone()}</span>
                                " "
                                <button type="button" class="link revoke-grant" aria-label=format!("Revoke: {described}")
                                    disabled=move || removing.get() on:click=move |event: leptos::ev::MouseEvent| {
                                    // The second click of a double click is not meant for the line under it now.
                                    if removing.get_untracked() || event.detail() > 1 {
                                        return;
                                    }
                                    removing.set(true);
                                    let id = id.clone();
                                    spawn_local(async move { after(revoke_grant(id, Some(ui.session_id())).await, "The grant was not revoked", "grants", index) });
                                }>"Revoke"</button>
                            </li>
                        }
                    }).collect_view();
                    view! { <ul class="grants">{items}</ul> }.into_any()
                    }
                };
                let rules = if state.rules.is_empty() {
                    view! { <p class="empty-list">"No rules: the policy decides alone."</p> }.into_any()
                } else {
                    let items = state.rules.into_iter().enumerate().map(|(index, rule)| {
                        let removable = rule.removable();
                        let id = rule.id.clone();
                        let text = visible(&rule.rule);
                        view! {
                            <li class="rule" data-rule-id=rule.id.to_string()>
                                <code>{text.clone()}</code>
                                " "
                                <span class="origin">{rule.origin.describe()}</span>
                                {removable.then(|| view! {
                                    " "
                                    <button type="button" class="link remove-rule" aria-label=format!("Remove the rule {text}")
                                        disabled=move || removing.get() on:click=move |event: leptos::ev::MouseEvent| {
                                        if removing.get_untracked() || event.detail() > 1 {
                                            return;
                                        }
                                        removing.set(true);
                                        let id = id.clone();
                                        spawn_local(async move { after(remove_rule(id).await, "The rule was not removed", "rules", index) });
                                    }>"Remove"</button>
                                })}
                            </li>
                        }
                    }).collect_view();
                    view! { <ul class="rules">{items}</ul> }.into_any()
                };
                view! {
                    <h3>"Approved for this session"</h3>
                    {grants}
                    <h3>"Rules"</h3>
                    {rules}
                }
            })}
        </details>
    }
    .into_any()
}
