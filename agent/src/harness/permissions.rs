//! What people allowed beyond one call: the grants a session holds (made by approving for the session, see
//! [`decide`](super::decide) and the AG-UI resume), and the rules people added ("Always allow"). Both are kept in
//! the store; each revocation and each rule added or removed is a line of the audit log, naming who did it.

use super::{Actor, Harness, Unavailable};
use crate::clock::now_ms;
use crate::ids::{GrantId, RuleId, SessionId};
use crate::permissions::{GrantScope, ListedRule, SessionGrant};
use crate::policy::{BookRule, Removed, Rule, RuleBook, RuleBookError, SessionGrants};
use crate::store::{AuditEntry, AuditKind};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Session {session_id} holds no grant {grant_id}. It may have been revoked already.")]
pub struct GrantNotFound {
    pub session_id: SessionId,
    pub grant_id: GrantId,
}

#[derive(Debug, thiserror::Error)]
pub enum RevokeError {
    #[error(transparent)]
    NotFound(#[from] GrantNotFound),
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
}

impl Harness {
    /// What people approved for the rest of a session, oldest first.
    pub async fn grants(&self, session_id: &SessionId) -> Result<SessionGrants, Unavailable> {
        let stored = self.inner.store.grants(session_id).await?;
        Ok(SessionGrants::from_stored(&stored))
    }

    /// Revokes a session grant, by `actor`: later calls it covered ask again. Runs already past their decision
    /// are not changed.
    pub async fn revoke_grant(
        &self,
        session_id: &SessionId,
        grant_id: &GrantId,
        actor: &Actor,
    ) -> Result<SessionGrant, RevokeError> {
        let not_found = || GrantNotFound {
            session_id: session_id.clone(),
            grant_id: grant_id.clone(),
        };
        let grants = self.grants(session_id).await?;
        let grant = grants
            .list()
            .iter()
            .find(|held| &held.id == grant_id)
            .cloned()
            .ok_or_else(not_found)?;
        let audit = AuditEntry {
            id: 0,
            at: now_ms(),
            kind: AuditKind::GrantRevoked,
            session_id: Some(session_id.clone()),
            run_id: None,
            tool_call_id: None,
            tool: Some(grant.grant.tool_name.clone()),
            arguments_digest: None,
            edited_digest: None,
            outcome: "revoked".to_owned(),
            source: Some("user".to_owned()),
            scope: Some(
                match grant.grant.scope {
                    GrantScope::Program { .. } => "session_program",
                    _ => "session",
                }
                .to_owned(),
            ),
            reason: Some(grant.grant.describe()),
            actor: Some(actor.as_str().to_owned()),
        };
        let revoked = self
            .inner
            .store
            .revoke_grant(session_id, grant_id.as_str(), audit)
            .await
            .map_err(Unavailable)?;
        if revoked {
            Ok(grant)
        } else {
            Err(not_found().into())
        }
    }

    /// Every rule in force, configured ones first, as the store holds them now.
    pub async fn rules(&self) -> Result<Vec<ListedRule>, RuleBookError> {
        self.inner.rules.refresh().await?;
        Ok(self.inner.rules.list())
    }

    /// Adds a rule a person confirmed, by `actor`: kept, with its audit entry, before it applies (to every
    /// session, and on every instance that shares the database).
    pub async fn add_rule(&self, rule: Rule, actor: &Actor) -> Result<BookRule, RuleBookError> {
        self.inner.rules.add(rule, actor.as_str()).await
    }

    /// Removes a rule a person added, or a kept row that does not read as a rule, by `actor`. Rules from `--rules`
    /// or the rules file are refused.
    pub async fn remove_rule(&self, id: &RuleId, actor: &Actor) -> Result<Removed, RuleBookError> {
        self.inner.rules.remove(id, actor.as_str()).await
    }
}
