//! The policy's contract as tables: which source decides, and what no rule, grant or path trick can get past.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::ids::{RunId, ToolCallId};
use crate::wire::{McpToolOrigin, McpTrust, ToolAnnotations};

fn tool(name: &str, annotations: ToolAnnotations) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("the {name} tool"),
        input_schema: json!({"type": "object"}),
        annotations,
        mcp: None,
    }
}

const READ_ONLY: ToolAnnotations = ToolAnnotations {
    read_only: Some(true),
    destructive: Some(false),
    idempotent: Some(true),
    open_world: Some(false),
};

const DESTRUCTIVE: ToolAnnotations = ToolAnnotations {
    read_only: Some(false),
    destructive: Some(true),
    idempotent: Some(true),
    open_world: Some(false),
};

const HARMLESS: ToolAnnotations = ToolAnnotations {
    read_only: Some(false),
    destructive: Some(false),
    idempotent: Some(false),
    open_world: Some(false),
};

fn run_command() -> ToolSpec {
    tool(
        "run_command",
        ToolAnnotations {
            open_world: Some(true),
            ..DESTRUCTIVE
        },
    )
}

fn policy(policy: ApprovalPolicy, rules: &str) -> PermissionPolicy {
    PermissionPolicy::new(policy, rules.parse().unwrap_or_else(|e| panic!("{e}")))
}

fn verdict_kind(decision: &PermissionDecision) -> &'static str {
    match decision {
        PermissionDecision::Allow { .. } => "allow",
        PermissionDecision::Ask { .. } => "ask",
        PermissionDecision::Deny { .. } => "deny",
    }
}

fn command(line: &str) -> Value {
    let words = shlex::split(line).unwrap();
    json!({"command": words[0], "args": &words[1..]})
}

/// Grants of one session, made the way an approval makes them.
fn granted(spec: &ToolSpec, input: &Value, scope: DecisionScope) -> SessionGrants {
    let mut grants = SessionGrants::new();
    let grant = grant::grant_for(spec, input, scope).unwrap();
    grants.insert(grant::session_grant(
        grant,
        RunId::parse("run").unwrap(),
        ToolCallId::parse("call").unwrap(),
    ));
    grants
}

#[test]
fn precedence_deny_then_ask_then_allow_then_grants_then_the_default() {
    let ls = command("ls -la");
    let grant = granted(&run_command(), &ls, DecisionScope::Session);
    let none = SessionGrants::new();
    // (server policy, rules, grants, expected decision, what decided)
    let table: &[(ApprovalPolicy, &str, &SessionGrants, &str, &str)] = &[
        (ApprovalPolicy::OnRequest, "", &none, "ask", "policy"),
        (ApprovalPolicy::OnRequest, "", &grant, "allow", "grant"),
        (
            ApprovalPolicy::OnRequest,
            "run_command(ls)=allow",
            &none,
            "allow",
            "rule",
        ),
        (
            ApprovalPolicy::OnRequest,
            "run_command(ls)=allow",
            &grant,
            "allow",
            "rule",
        ),
        (
            ApprovalPolicy::OnRequest,
            "run_command(ls)=ask",
            &grant,
            "ask",
            "rule",
        ),
        (
            ApprovalPolicy::OnRequest,
            "run_command(ls)=ask,run_command(ls -la)=allow",
            &grant,
            "ask",
            "rule",
        ),
        (
            ApprovalPolicy::OnRequest,
            "run_command(ls)=deny,run_command(ls -la)=ask",
            &grant,
            "deny",
            "rule",
        ),
        (
            ApprovalPolicy::OnRequest,
            "run_command=allow,run_command(ls)=deny",
            &grant,
            "deny",
            "rule",
        ),
        (
            ApprovalPolicy::Trusted,
            "run_command(ls -la)=deny",
            &none,
            "deny",
            "rule",
        ),
        (
            ApprovalPolicy::Trusted,
            "run_command(ls)=ask",
            &none,
            "ask",
            "rule",
        ),
        (ApprovalPolicy::Trusted, "", &none, "allow", "policy"),
        (ApprovalPolicy::Strict, "", &grant, "ask", "policy"),
        (
            ApprovalPolicy::Strict,
            "run_command(ls)=allow",
            &grant,
            "allow",
            "rule",
        ),
        (
            ApprovalPolicy::OnRequest,
            "run_command(git)=allow",
            &grant,
            "allow",
            "grant",
        ),
        (
            ApprovalPolicy::OnRequest,
            "read_file=deny",
            &grant,
            "allow",
            "grant",
        ),
    ];
    for (server, rules, grants, expected, by) in table {
        let verdict = policy(*server, rules).explain(&run_command(), &ls, grants);
        let source = match verdict.decided_by {
            DecidedBy::Rule { .. } => "rule",
            DecidedBy::Grant(_) => "grant",
            DecidedBy::Policy(_) => "policy",
            DecidedBy::ProgramRunner { .. } => "runner",
        };
        assert_eq!(
            (verdict_kind(&verdict.decision), source),
            (*expected, *by),
            "{server} with {rules:?}: {verdict:?}"
        );
    }
}

#[test]
fn the_policy_default_reads_the_annotations() {
    let none = SessionGrants::new();
    let input = json!({});
    // (policy, annotations, expected)
    let table: &[(ApprovalPolicy, ToolAnnotations, &str)] = &[
        (ApprovalPolicy::OnRequest, READ_ONLY, "allow"),
        (ApprovalPolicy::OnRequest, HARMLESS, "allow"),
        (ApprovalPolicy::OnRequest, DESTRUCTIVE, "ask"),
        (ApprovalPolicy::OnRequest, ToolAnnotations::default(), "ask"),
        (ApprovalPolicy::Strict, READ_ONLY, "ask"),
        (ApprovalPolicy::Strict, HARMLESS, "ask"),
        (ApprovalPolicy::Trusted, DESTRUCTIVE, "allow"),
        (ApprovalPolicy::Trusted, ToolAnnotations::default(), "allow"),
    ];
    for (server, annotations, expected) in table {
        let decision = policy(*server, "").decide(&tool("t", *annotations), &input, &none);
        assert_eq!(
            verdict_kind(&decision),
            *expected,
            "{server} {annotations:?}"
        );
    }
    let decision = policy(ApprovalPolicy::OnRequest, "").decide(
        &tool("delete_file", DESTRUCTIVE),
        &input,
        &none,
    );
    assert_eq!(decision.reason(), "delete_file is destructive.");
}

fn from_mcp(mut spec: ToolSpec, trust: McpTrust) -> ToolSpec {
    spec.mcp = Some(McpToolOrigin {
        server: "fs".into(),
        tool: spec.name.clone(),
        trust,
        endpoint: "stdio-digest".into(),
    });
    spec
}

#[test]
fn an_untrusted_servers_claims_never_let_a_call_run_without_asking() {
    let on_request = PermissionPolicy::default();
    let none = SessionGrants::new();
    let input = json!({});
    for annotations in [READ_ONLY, HARMLESS, DESTRUCTIVE, ToolAnnotations::default()] {
        let spec = from_mcp(tool("read_text_file", annotations), McpTrust::Untrusted);
        let decision = on_request.decide(&spec, &input, &none);
        assert_eq!(verdict_kind(&decision), "ask", "{annotations:?}");
        assert!(
            decision
                .reason()
                .contains("the MCP server fs, which is not trusted"),
            "{}",
            decision.reason()
        );
    }
    let decision = on_request.decide(
        &from_mcp(tool("read_text_file", READ_ONLY), McpTrust::Untrusted),
        &input,
        &none,
    );
    assert_eq!(
        decision.reason(),
        "read_text_file belongs to the MCP server fs, which is not trusted, so every call asks (it claims to be read-only, not destructive, idempotent, not open-world, unverified)."
    );
    // Trusted, its annotations decide as a built-in's do.
    let trusted = |annotations| {
        verdict_kind(&on_request.decide(
            &from_mcp(tool("read_text_file", annotations), McpTrust::Annotations),
            &input,
            &none,
        ))
    };
    assert_eq!(trusted(READ_ONLY), "allow");
    assert_eq!(trusted(DESTRUCTIVE), "ask");
    // A read-only tool that does not say it stays inside reaches outside, as MCP reads a missing openWorldHint.
    let read_only_alone = ToolAnnotations {
        read_only: Some(true),
        ..Default::default()
    };
    assert_eq!(trusted(read_only_alone), "ask");
    assert!(
        on_request
            .decide(
                &from_mcp(tool("fetch", read_only_alone), McpTrust::Annotations),
                &input,
                &none,
            )
            .reason()
            .contains("does not say that it stays inside the workspace"),
    );
    // A rule still allows it; a rule on an argument allows only what it names; deny beats everything.
    let rules = policy(
        ApprovalPolicy::OnRequest,
        "mcp__gh__create_issue(repo=acme/*)=allow,mcp__fs__*=allow,mcp__fs__move_file=deny",
    );
    let untrusted = |name: &str, input: Value| {
        verdict_kind(&rules.decide(
            &from_mcp(tool(name, ToolAnnotations::default()), McpTrust::Untrusted),
            &input,
            &none,
        ))
    };
    assert_eq!(untrusted("mcp__fs__read_text_file", json!({})), "allow");
    assert_eq!(
        untrusted("mcp__gh__create_issue", json!({"repo": "acme/widgets"})),
        "allow"
    );
    assert_eq!(
        untrusted("mcp__gh__create_issue", json!({"repo": "evil/widgets"})),
        "ask"
    );
    assert_eq!(untrusted("mcp__gh__create_issue", json!({})), "ask");
    assert_eq!(untrusted("mcp__fs__move_file", json!({})), "deny");
    // The strict policy still asks.
    let strict = policy(ApprovalPolicy::Strict, "");
    assert_eq!(
        verdict_kind(&strict.decide(
            &from_mcp(tool("read_text_file", READ_ONLY), McpTrust::Annotations),
            &input,
            &none,
        )),
        "ask"
    );
}

#[test]
fn a_read_only_tool_that_reaches_outside_asks_under_on_request() {
    let spec = tool(
        "fetch",
        ToolAnnotations {
            open_world: Some(true),
            ..READ_ONLY
        },
    );
    let decision = PermissionPolicy::default().decide(&spec, &json!({}), &SessionGrants::new());
    assert_eq!(verdict_kind(&decision), "ask");
    assert!(
        decision.reason().contains("outside the workspace"),
        "{}",
        decision.reason()
    );
}

#[test]
fn a_session_grant_covers_the_tool_as_it_was_approved() {
    let on_request = policy(ApprovalPolicy::OnRequest, "");
    let before = from_mcp(tool("mcp__fs__delete", DESTRUCTIVE), McpTrust::Annotations);
    let input = json!({"path": "a"});
    let grants = granted(&before, &input, DecisionScope::Session);
    assert_eq!(
        verdict_kind(&on_request.decide(&before, &input, &grants)),
        "allow"
    );
    let mut changed = before.clone();
    changed.description = "Deletes a file, and more.".into();
    assert_eq!(
        verdict_kind(&on_request.decide(&changed, &input, &grants)),
        "ask"
    );
    let mut changed = before.clone();
    changed.input_schema = json!({"type": "object", "properties": {"path": {}}});
    assert_eq!(
        verdict_kind(&on_request.decide(&changed, &input, &grants)),
        "ask"
    );
    let mut changed = before.clone();
    changed.mcp = Some(McpToolOrigin {
        server: "other".into(),
        tool: "delete".into(),
        trust: McpTrust::Annotations,
        endpoint: "stdio-digest".into(),
    });
    assert_eq!(
        verdict_kind(&on_request.decide(&changed, &input, &grants)),
        "ask"
    );
    // The same server name, tool and definition, reached another way (its URL or command changed): another tool.
    let mut changed = before.clone();
    if let Some(origin) = changed.mcp.as_mut() {
        origin.endpoint = "another-digest".into();
    }
    assert_eq!(
        verdict_kind(&on_request.decide(&changed, &input, &grants)),
        "ask"
    );
    // A deny rule beats the grant.
    let deny = policy(ApprovalPolicy::OnRequest, "mcp__fs__*=deny");
    assert_eq!(verdict_kind(&deny.decide(&before, &input, &grants)), "deny");
}

#[test]
fn tool_wide_rules_name_the_strictest_action_for_a_tool() {
    let rules = policy(
        ApprovalPolicy::OnRequest,
        "mcp__fs__*=ask,mcp__fs__move_file=deny,mcp__gh__create_issue(repo=acme/*)=allow,read_file=allow",
    );
    assert_eq!(
        rules.tool_rule(&tool("mcp__fs__move_file", HARMLESS)),
        Some(RuleAction::Deny)
    );
    assert_eq!(
        rules.tool_rule(&tool("mcp__fs__read", HARMLESS)),
        Some(RuleAction::Ask)
    );
    assert_eq!(
        rules.tool_rule(&tool("mcp__gh__create_issue", HARMLESS)),
        None
    );
    assert_eq!(
        rules.tool_rule(&tool("read_file", HARMLESS)),
        Some(RuleAction::Allow)
    );
    assert_eq!(rules.tool_rule(&tool("write_file", HARMLESS)), None);
}

/// A tool of a server with a long name is cut to the 64 characters model APIs take, the end of its name replaced by a
/// digest: a `deny` or `ask` still meets it by its name uncut (a glob over its end, or its whole name); an `allow`
/// glob does not, as it could land on a tool it was not written for.
#[test]
fn a_deny_or_ask_meets_an_mcp_tool_by_its_name_uncut() {
    let server = "github-enterprise-acme-corporation-internal-mirror-production";
    let name = crate::tools::mcp_names::qualified_name(server, "delete_repo");
    assert!(
        !name.contains("delete"),
        "the cut leaves none of the tool's name: {name}"
    );
    let spec = ToolSpec {
        mcp: Some(McpToolOrigin {
            server: server.into(),
            tool: "delete.repo".into(),
            trust: McpTrust::Annotations,
            endpoint: "stdio-digest".into(),
        }),
        ..tool(&name, DESTRUCTIVE)
    };
    let input = json!({"repo": "acme/site"});
    let whole = format!("mcp__{server}__delete_repo");
    let decide = |rules: &str| {
        verdict_kind(&policy(ApprovalPolicy::OnRequest, rules).decide(
            &spec,
            &input,
            &SessionGrants::new(),
        ))
    };
    for (rule, expected) in [
        ("mcp__*__delete_*=deny", "deny"),
        ("mcp__*__delete_repo(repo=acme/*)=deny", "deny"),
        ("mcp__*repo=ask", "ask"),
        (&format!("{whole}=deny"), "deny"),
        ("mcp__*__delete.repo=deny", "deny"),
        ("mcp__*__create_*=deny", "allow"),
    ] {
        assert_eq!(decide(&format!("mcp__*=allow,{rule}")), expected, "{rule}");
    }
    // The tool is destructive: with no rule that meets it, it asks.
    assert_eq!(decide("mcp__*__delete_*=allow"), "ask");
    assert_eq!(decide(&format!("{whole}=allow")), "ask");
    let listed = policy(ApprovalPolicy::OnRequest, "mcp__*__delete_*=deny");
    assert_eq!(listed.tool_rule(&spec), Some(RuleAction::Deny));
}

#[test]
fn the_most_specific_matching_rule_names_the_reason() {
    let none = SessionGrants::new();
    let push = command("git push origin main");
    // (rules, expected reason)
    let table: &[(&str, &str)] = &[
        (
            "run_command=deny:whole tool,run_command(git)=deny:git",
            "git",
        ),
        (
            "run_command(git)=deny:git,run_command(git push)=deny:push",
            "push",
        ),
        (
            "run_command(git push)=deny:push,run_command(git push origin main $)=deny:exact",
            "exact",
        ),
        ("*=deny:any tool,run_command=deny:this tool", "this tool"),
        ("run_*=deny:glob,run_command=deny:exact name", "exact name"),
        (
            "run_command(git)=deny:first,run_command(git)=deny:second",
            "first",
        ),
        // A less specific deny still beats a more specific allow: the action decides first.
        (
            "run_command(git push origin)=allow:allow,run_command(git)=deny:deny",
            "deny",
        ),
    ];
    for (rules, expected) in table {
        let decision =
            policy(ApprovalPolicy::OnRequest, rules).decide(&run_command(), &push, &none);
        assert_eq!(decision.reason(), *expected, "{rules}");
    }
    let decision = policy(ApprovalPolicy::OnRequest, "run_command(git push)=ask").decide(
        &run_command(),
        &push,
        &none,
    );
    assert_eq!(
        decision.reason(),
        "The rule run_command(git push)=ask asks before this call runs."
    );
}

#[test]
fn approving_ls_for_the_session_never_lets_another_command_through() {
    let grants = granted(&run_command(), &command("ls"), DecisionScope::Session);
    let policy = policy(ApprovalPolicy::OnRequest, "");
    assert!(matches!(
        policy.decide(&run_command(), &command("ls"), &grants),
        PermissionDecision::Allow { .. }
    ));
    for other in ["rm -rf x", "ls -la", "ls ..", "sh -c ls"] {
        let decision = policy.decide(&run_command(), &command(other), &grants);
        assert!(
            matches!(decision, PermissionDecision::Ask { .. }),
            "{other}: {decision:?}"
        );
    }
}

/// A `deny` that names its program by a path catches it by name too, from any directory: `/bin/rm` catches `rm`
/// and `/usr/bin/rm`, as `rm` catches `/bin/rm`. Before, the rule's word was compared whole with the call's
/// program's name, so a path in the rule caught only that very path. An `allow` keeps the exact text.
#[test]
fn a_deny_naming_a_program_by_its_path_catches_it_by_name() {
    let none = SessionGrants::new();
    let policy = policy(
        ApprovalPolicy::Trusted,
        "run_command(/bin/rm)=deny,run_command(/usr/bin/ls)=allow",
    );
    for (line, expected) in [
        ("rm -rf x", "deny"),
        ("/usr/bin/rm -rf x", "deny"),
        ("/bin/rm x", "deny"),
        ("rmdir x", "allow"),
    ] {
        let decision = policy.decide(&run_command(), &command(line), &none);
        assert_eq!(verdict_kind(&decision), expected, "{line}: {decision:?}");
    }
    let strict = super::tests::policy(ApprovalPolicy::OnRequest, "run_command(/usr/bin/ls)=allow");
    assert_eq!(
        verdict_kind(&strict.decide(&run_command(), &command("ls"), &none)),
        "ask"
    );
}

#[test]
fn a_shell_asks_while_a_deny_or_ask_rule_restricts_commands() {
    let none = SessionGrants::new();
    let rules = "run_command(rm)=deny,run_command(sh)=allow,run_command(find)=allow,run_command(git status)=allow,run_command(ls)=allow";
    let policy = policy(ApprovalPolicy::OnRequest, rules);
    // (command, expected)
    let table: &[(&str, &str)] = &[
        ("rm -rf x", "deny"),
        ("/bin/rm -rf x", "deny"),
        // `rm` where file names ignore case (macOS): the same program to a deny.
        ("RM -rf x", "deny"),
        ("/BIN/Rm -rf x", "deny"),
        ("sh -c 'rm -rf x'", "ask"),
        ("SH -c 'rm -rf x'", "ask"),
        ("env rm -rf x", "ask"),
        ("python3 -c 'import shutil'", "ask"),
        ("perl5.36-x86_64-linux-gnu -e 'unlink q(x)'", "ask"),
        // Allowed by name, but its options run programs: the `rm` it runs is not in its argv's first word.
        ("find . -exec rm -rf {} +", "ask"),
        // So do git's (`git -c alias.x='!rm -rf x' x`): a rule that allows `git status` waits for the deny rule to go.
        ("git -c alias.x=!rm x", "ask"),
        ("git status", "ask"),
        ("ls -la", "allow"),
    ];
    for (line, expected) in table {
        let decision = policy.decide(&run_command(), &command(line), &none);
        assert_eq!(verdict_kind(&decision), *expected, "{line}: {decision:?}");
    }
    // A deny rule written as a glob on the `command` argument restricts `run_command` as its prefix form does: it
    // catches the program from any directory, and a shell asks while it is there.
    let named = super::tests::policy(
        ApprovalPolicy::OnRequest,
        "run_command(command=rm)=deny,run_command(sh)=allow",
    );
    for (line, expected) in [
        ("/bin/rm -rf x", "deny"),
        ("/bin/RM -rf x", "deny"),
        ("sh -c 'rm -rf x'", "ask"),
    ] {
        let decision = named.decide(&run_command(), &command(line), &none);
        assert_eq!(verdict_kind(&decision), expected, "{line}: {decision:?}");
    }
    // A deny on another argument, which no command has, restricts no command: a program allowed by name runs.
    let paths = super::tests::policy(
        ApprovalPolicy::OnRequest,
        "*(**/.env*)=deny,run_command(git)=allow,run_command(sh)=allow",
    );
    for line in ["git status", "sh -c ls"] {
        let decision = paths.decide(&run_command(), &command(line), &none);
        assert_eq!(verdict_kind(&decision), "allow", "{line}: {decision:?}");
    }
    // An `ask` rule restricts as a deny does: the spellings that reach what it asks before without naming it ask,
    // though an `allow` names the program, and under `trusted`, which asks for nothing else.
    let asking = super::tests::policy(
        ApprovalPolicy::OnRequest,
        "run_command(git)=allow,run_command(git push)=ask",
    );
    for line in [
        "git -C . push --force",
        "git -c a=b push",
        "git push",
        "git status",
    ] {
        let decision = asking.decide(&run_command(), &command(line), &none);
        assert_eq!(verdict_kind(&decision), "ask", "{line}: {decision:?}");
    }
    let trusted = super::tests::policy(ApprovalPolicy::Trusted, "run_command(rm)=ask");
    for (line, expected) in [
        ("env rm -rf x", "ask"),
        ("sh -c 'rm -rf x'", "ask"),
        ("rm -rf x", "ask"),
        ("ls -la", "allow"),
    ] {
        let decision = trusted.decide(&run_command(), &command(line), &none);
        assert_eq!(verdict_kind(&decision), expected, "{line}: {decision:?}");
    }
    // Without a deny or ask rule on commands, a shell the person allowed by name runs.
    let relaxed = super::tests::policy(ApprovalPolicy::OnRequest, "run_command(sh)=allow");
    assert_eq!(
        verdict_kind(&relaxed.decide(&run_command(), &command("sh -c ls"), &none)),
        "allow"
    );
}

#[test]
fn path_rules_read_the_path_as_it_resolves() {
    let none = SessionGrants::new();
    let policy = policy(
        ApprovalPolicy::OnRequest,
        "read_file(**/.env*)=deny:secrets,write_file(src/**)=allow",
    );
    let read = tool("read_file", READ_ONLY);
    let write = tool("write_file", DESTRUCTIVE);
    // (tool, path, expected)
    let table: &[(&ToolSpec, &str, &str)] = &[
        (&read, ".env", "deny"),
        (&read, "./src/../.env", "deny"),
        (&read, "config/.env.local", "deny"),
        (&read, "src//./../.env", "deny"),
        (&read, "notes.txt", "allow"),
        (&write, "src/main.rs", "allow"),
        (&write, "./src/a/b.rs", "allow"),
        (&write, "src/../.env", "ask"),
        (&write, "src/../../x", "ask"),
        (&write, "srcx/a", "ask"),
    ];
    for (spec, path, expected) in table {
        let decision = policy.decide(spec, &json!({"path": path}), &none);
        assert_eq!(
            verdict_kind(&decision),
            *expected,
            "{} {path}: {decision:?}",
            spec.name
        );
    }
    let decision = policy.decide(&read, &json!({"path": ".env"}), &none);
    assert_eq!(decision.reason(), "secrets");
}

/// A path glob is read as the paths it is compared with are: `./`, `.` segments, repeated and trailing slashes go,
/// whether the rule names a file tool or a glob over tool names that covers them. Before, only an exact file tool's
/// leading `./` went, so `*_file(./secrets/**)=deny` and `read_file(secrets/)=deny` matched nothing.
#[test]
fn a_path_glob_is_normalised_as_the_paths_it_meets() {
    let none = SessionGrants::new();
    let read = tool("read_file", READ_ONLY);
    let fetch = tool("mcp__fs__read", ToolAnnotations::default());
    for rules in [
        "*_file(./secrets/**)=deny",
        "read_file(secrets/./**)=deny",
        "read_file(secrets//**)=deny",
        "*(path=./secrets/**)=deny",
    ] {
        let deny = policy(ApprovalPolicy::Trusted, rules);
        assert_eq!(
            verdict_kind(&deny.decide(&read, &json!({"path": "secrets/key"}), &none)),
            "deny",
            "{rules}"
        );
    }
    // What is under a directory covers the directory itself for a deny or an ask: listing it would show the names
    // the rule keeps from the model. An allow does not stretch so.
    let list = tool("list_files", READ_ONLY);
    for rules in ["list_files(secrets/**)=deny", "list_files(secrets/*)=ask"] {
        let under = policy(ApprovalPolicy::Trusted, rules);
        let kept = if rules.ends_with("ask") {
            "ask"
        } else {
            "deny"
        };
        for (path, expected) in [
            ("secrets", kept),
            ("./secrets/", kept),
            ("secrets/a", kept),
            ("secretsx", "allow"),
            (".", "allow"),
        ] {
            let decision = under.decide(&list, &json!({ "path": path }), &none);
            assert_eq!(verdict_kind(&decision), expected, "{rules}: {path}");
        }
    }
    // Nor for the other file tools: a file at the top is not under a directory (`*/**` is "inside a subdirectory").
    let nested = policy(ApprovalPolicy::Trusted, "read_file(*/**)=deny");
    assert_eq!(
        verdict_kind(&nested.decide(&read, &json!({"path": "README.md"}), &none)),
        "allow"
    );
    // Not by a glob that names some files under it.
    let named = policy(
        ApprovalPolicy::Trusted,
        "list_files(secrets/.env)=deny,list_files(secrets/**/*.key)=deny",
    );
    assert_eq!(
        verdict_kind(&named.decide(&list, &json!({"path": "secrets"}), &none)),
        "allow"
    );
    let allowed = policy(ApprovalPolicy::Strict, "list_files(src/**)=allow");
    assert_eq!(
        verdict_kind(&allowed.decide(&list, &json!({"path": "src"}), &none)),
        "ask"
    );
    let alternatives = policy(
        ApprovalPolicy::Trusted,
        "read_file({.env,./secrets/**})=deny",
    );
    assert_eq!(
        verdict_kind(&alternatives.decide(&read, &json!({"path": "./secrets/key"}), &none)),
        "deny"
    );
    let trailing = policy(ApprovalPolicy::Trusted, "read_file(secrets/)=deny");
    assert_eq!(
        verdict_kind(&trailing.decide(&read, &json!({"path": "secrets/"}), &none)),
        "deny"
    );
    // `.` and `./` are the workspace itself.
    for rules in [
        "list_files(.)=deny",
        "list_files(./)=deny",
        "*(path=.//)=deny",
    ] {
        let root = policy(ApprovalPolicy::Trusted, rules);
        let list = tool("list_files", READ_ONLY);
        assert_eq!(
            verdict_kind(&root.decide(&list, &json!({"path": "."}), &none)),
            "deny",
            "{rules}"
        );
        assert_eq!(
            verdict_kind(&root.decide(&list, &json!({"path": "src"}), &none)),
            "allow",
            "{rules}"
        );
    }
    // A normalised rule reads back as itself.
    for (written, shown) in [
        ("read_file(./a//b/)=deny", "read_file(a/b)=deny"),
        ("*_file(./a)=deny", "*_file(./a)=deny"),
        ("list_files(.)=deny", "list_files(.)=deny"),
    ] {
        assert_eq!(Rule::parse(written).unwrap().to_string(), shown);
        assert_eq!(Rule::parse(shown).unwrap().to_string(), shown);
    }
    // Another tool's `path` is text: the glob meets it as written.
    let any_tool = policy(ApprovalPolicy::Trusted, "*(path=./secrets/**)=deny");
    assert_eq!(
        verdict_kind(&any_tool.decide(&fetch, &json!({"path": "./secrets/key"}), &none)),
        "deny"
    );
    assert_eq!(
        verdict_kind(&any_tool.decide(&fetch, &json!({"path": "secrets/key"}), &none)),
        "allow"
    );
}

#[test]
fn a_symlink_inside_the_workspace_cannot_carry_a_path_past_a_rule() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("src")).unwrap();
    std::fs::write(root.join(".env"), "secret").unwrap();
    std::os::unix::fs::symlink(root.join(".env"), root.join("src/settings")).unwrap();
    let paths = PathContext::with_root(root, false).unwrap();
    let policy = policy(
        ApprovalPolicy::OnRequest,
        "read_file(**/.env*)=deny,write_file(src/**)=allow",
    )
    .with_paths(paths);
    let none = SessionGrants::new();
    let read = policy.decide(
        &tool("read_file", READ_ONLY),
        &json!({"path": "src/settings"}),
        &none,
    );
    assert_eq!(
        verdict_kind(&read),
        "deny",
        "the deny sees where the link leads"
    );
    let write = policy.decide(
        &tool("write_file", DESTRUCTIVE),
        &json!({"path": "src/settings"}),
        &none,
    );
    assert_eq!(
        verdict_kind(&write),
        "ask",
        "the allow must fit where the link leads too"
    );
}

/// A path whose links cannot be followed when the call is decided (a loop, or past the system's limit on a
/// path's length, which the tool does not meet: it opens a part at a time) may lead to what a deny rule names: it is
/// denied, and an allow rule does not take it.
#[test]
fn a_path_whose_links_cannot_be_followed_meets_the_deny_rules_and_no_allow() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join(".env"), "secret").unwrap();
    let long = matcher::tests::deep_link_to_env(root);
    let policy = policy(
        ApprovalPolicy::OnRequest,
        "read_file(**/.env*)=deny,write_file(**)=allow",
    )
    .with_paths(PathContext::with_root(root, false).unwrap());
    let none = SessionGrants::new();
    let read = policy.decide(&tool("read_file", READ_ONLY), &json!({"path": long}), &none);
    assert_eq!(verdict_kind(&read), "deny", "{read:?}");
    let write = policy.decide(
        &tool("write_file", DESTRUCTIVE),
        &json!({"path": long}),
        &none,
    );
    assert_eq!(verdict_kind(&write), "ask", "{write:?}");
    let choices = policy.approval_choices(
        &tool("write_file", DESTRUCTIVE),
        &json!({"path": long}),
        &none,
    );
    assert!(choices.always_allow.is_none(), "{choices:?}");
}

#[test]
fn case_counts_only_where_the_file_system_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let none = SessionGrants::new();
    let read = tool("read_file", READ_ONLY);
    let input = json!({"path": ".ENV"});
    let sensitive = policy(ApprovalPolicy::OnRequest, "read_file(**/.env*)=deny")
        .with_paths(PathContext::with_root(dir.path(), false).unwrap());
    assert_eq!(
        verdict_kind(&sensitive.decide(&read, &input, &none)),
        "allow"
    );
    let insensitive = policy(ApprovalPolicy::OnRequest, "read_file(**/.env*)=deny")
        .with_paths(PathContext::with_root(dir.path(), true).unwrap());
    assert_eq!(
        verdict_kind(&insensitive.decide(&read, &input, &none)),
        "deny"
    );
    // Case in every script, not only ASCII's: on a case-insensitive file system `DONNÉES` is `données`, `ΟΔΟΣ` is
    // `οδος`, the Kelvin sign is `k`, and the long s is `s`. Before, the globs ignored ASCII case only, and these
    // were allowed.
    let rules = "read_file(**/données/**)=deny,read_file(**/.ssh/**)=deny,read_file(keys.txt)=deny,read_file(**/οδος/*)=deny";
    let insensitive = policy(ApprovalPolicy::OnRequest, rules)
        .with_paths(PathContext::with_root(dir.path(), true).unwrap());
    let sensitive = policy(ApprovalPolicy::OnRequest, rules)
        .with_paths(PathContext::with_root(dir.path(), false).unwrap());
    for path in [
        "DONNÉES/x",
        "Données/x",
        ".\u{17F}sh/id_rsa",
        "\u{212A}eys.txt",
        "KEYS.TXT",
        "ΟΔΟΣ/x",
    ] {
        let input = json!({"path": path});
        assert_eq!(
            verdict_kind(&insensitive.decide(&read, &input, &none)),
            "deny",
            "{path}"
        );
        assert_eq!(
            verdict_kind(&sensitive.decide(&read, &input, &none)),
            "allow",
            "{path} where case counts"
        );
    }
    // An `allow` keeps to ASCII's case, as the probe tested it: a file system may fold fewer letters than Unicode.
    let allowed = policy(ApprovalPolicy::OnRequest, "write_file(données/*)=allow")
        .with_paths(PathContext::with_root(dir.path(), true).unwrap());
    let write = tool("write_file", DESTRUCTIVE);
    for (path, expected) in [("DONNées/a", "allow"), ("DONNÉES/a", "ask")] {
        let input = json!({"path": path, "content": ""});
        assert_eq!(
            verdict_kind(&allowed.decide(&write, &input, &none)),
            expected,
            "{path}"
        );
    }
    // This machine's temporary directory is probed, not assumed.
    let probed = PathContext::for_workspace(dir.path()).unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the probe cleans up"
    );
    let _ = probed.case_insensitive();
}

/// A tmpfs mounted at a directory for as long as it lives.
struct Mount(std::ffi::CString);

impl Mount {
    /// `None` where this process may not mount (it is not root, or its container forbids it); any other failure
    /// fails the test.
    fn tmpfs(at: &std::path::Path) -> Option<Mount> {
        use std::os::unix::ffi::OsStrExt as _;
        let target = std::ffi::CString::new(at.as_os_str().as_bytes()).unwrap();
        // SAFETY: every pointer is a NUL-terminated string that outlives the call; no data.
        let mounted = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if mounted == 0 {
            return Some(Mount(target));
        }
        let error = std::io::Error::last_os_error();
        assert_eq!(
            error.raw_os_error(),
            Some(libc::EPERM),
            "mounting a tmpfs: {error}"
        );
        None
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // SAFETY: a NUL-terminated path this test mounted.
        unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
    }
}

/// The startup probe sees the workspace's own file system; a file system mounted inside it (a FAT stick, an SMB
/// share: anything that may ignore case) is read by `deny` and `ask` rules in every spelling.
#[test]
fn a_file_system_mounted_inside_the_workspace_is_read_in_every_spelling_by_deny_and_ask_rules() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("stick")).unwrap();
    let Some(_mount) = Mount::tmpfs(&dir.path().join("stick")) else {
        // Not root, or a container without the right to mount (this project's machines have it, as root).
        eprintln!("skipped: this process may not mount a file system");
        return;
    };
    std::fs::create_dir(dir.path().join("stick/keys")).unwrap();
    let none = SessionGrants::new();
    let read = tool("read_file", READ_ONLY);
    let paths = PathContext::with_root(dir.path(), false).unwrap();
    let rules = "read_file(**/.env*)=deny, read_file(stick/keys/**)=ask, read_file(stick/**)=allow";
    let decide = |path: &str| {
        verdict_kind(
            &policy(ApprovalPolicy::OnRequest, rules)
                .with_paths(paths.clone())
                .decide(&read, &json!({ "path": path }), &none),
        )
    };
    assert_eq!(decide("stick/.ENV"), "deny");
    assert_eq!(decide("stick/KEYS/id"), "ask");
    assert_eq!(
        decide("stick/Keys/New/id"),
        "ask",
        "a name made there later too"
    );
    assert_eq!(decide("stick/notes.txt"), "allow");
    // The workspace's own file system counts case: `.ENV` there is another file than `.env`, as before.
    assert_eq!(decide(".ENV"), "allow");
    assert_eq!(
        decide("Stick/.ENV"),
        "allow",
        "not the mount: another directory"
    );
}

/// An unquoted reason runs to the next comma whatever it holds: the apostrophe of "don't" opens no quote that would
/// take the rules after it into the reason.
#[test]
fn an_apostrophe_in_a_reason_keeps_the_rules_after_it() {
    let rules: RuleSet = "delete_file=deny:don't, run_command(rm)=deny, write_file=ask:won't, read_file=deny:\"a, b\""
        .parse()
        .unwrap();
    let written: Vec<String> = rules.rules().iter().map(ToString::to_string).collect();
    assert_eq!(
        written,
        [
            "delete_file=deny:\"don't\"",
            "run_command(rm)=deny",
            "write_file=ask:\"won't\"",
            "read_file=deny:\"a, b\"",
        ]
    );
    let policy = PermissionPolicy::new(ApprovalPolicy::Trusted, rules);
    let rm = policy.decide(&run_command(), &command("rm -rf x"), &SessionGrants::new());
    assert_eq!(verdict_kind(&rm), "deny", "{rm:?}");
}

#[test]
fn named_argument_globs_apply_to_any_tool() {
    let none = SessionGrants::new();
    let issue = tool("mcp__github__create_issue", ToolAnnotations::default());
    let policy = policy(
        ApprovalPolicy::OnRequest,
        "mcp__github__create_issue(repo=acme/*)=allow,mcp__github__*(repo=acme/secret)=deny",
    );
    // (arguments, expected)
    let table: &[(Value, &str)] = &[
        (json!({"repo": "acme/widgets", "title": "x"}), "allow"),
        (json!({"repo": "acme/secret"}), "deny"),
        (json!({"repo": "acme/a/b"}), "ask"),
        (json!({"repo": "other/widgets"}), "ask"),
        (json!({"title": "no repo"}), "ask"),
        (json!({"repo": ["acme/widgets", "evil/x"]}), "ask"),
        (json!({"repo": ["acme/widgets", "acme/secret"]}), "deny"),
        // A value no glob can read: what it holds cannot be told, so the deny takes it and the allow does not.
        (json!({"repo": ["acme/widgets", ["acme/secret"]]}), "deny"),
        (json!({"repo": {"name": "acme/secret"}}), "deny"),
        (json!({"repo": ["acme/widgets", null]}), "deny"),
    ];
    for (input, expected) in table {
        assert_eq!(
            verdict_kind(&policy.decide(&issue, input, &none)),
            *expected,
            "{input}"
        );
    }
}

/// An argument that is not a workspace path may be any text: a `deny` or `ask` rule's `*` crosses `/` there, so
/// `command=rm *` catches `rm -rf /` and `url=*evil.com*` catches a URL. An `allow` keeps `*` between slashes.
/// Before, every argument glob read `*` as a path segment, and such a deny silently let the call through.
#[test]
fn a_deny_on_a_text_argument_reads_star_across_slashes_and_an_allow_does_not() {
    let none = SessionGrants::new();
    let exec = tool("mcp__shell__exec", ToolAnnotations::default());
    let fetch = tool("mcp__web__fetch", ToolAnnotations::default());
    let policy = policy(
        ApprovalPolicy::OnRequest,
        "mcp__shell__exec(command=rm *)=deny,mcp__web__fetch(url=*evil.com*)=ask,\
         mcp__web__fetch(url=https://docs.rs/*)=allow,run_command(args=-D)=deny",
    );
    let table: &[(&ToolSpec, Value, &str)] = &[
        (&exec, json!({"command": "rm -rf /"}), "deny"),
        (&exec, json!({"command": "rm x/y"}), "deny"),
        (&exec, json!({"command": "ls /"}), "ask"),
        // Other white space, another case, and a command among others in a shell's line.
        (&exec, json!({"command": "rm\t-rf /"}), "deny"),
        (&exec, json!({"command": " rm -rf /"}), "deny"),
        (&exec, json!({"command": "RM -rf /"}), "deny"),
        (&exec, json!({"command": "true; rm -rf /"}), "deny"),
        (&exec, json!({"command": "ls && rm -rf /"}), "deny"),
        (&exec, json!({"command": "ls | rm -rf /"}), "deny"),
        (&exec, json!({"command": "echo $(rm -rf /)"}), "deny"),
        (&exec, json!({"command": "ls\nrm -rf /"}), "deny"),
        (&exec, json!({"command": "ls; firm x"}), "ask"),
        // A command's flags keep their case: `-d` is not `-D`.
        (&run_command(), command("base64 -d x"), "ask"),
        (&run_command(), command("base64 -D x"), "deny"),
        (&fetch, json!({"url": "https://evil.com/x"}), "ask"),
        (&fetch, json!({"url": "https://EVIL.COM/x"}), "ask"),
        (&fetch, json!({"url": "https://docs.rs/serde;x"}), "allow"),
        (&fetch, json!({"url": "https://docs.rs/serde"}), "allow"),
        // The allow's `*` stays in one segment: a deeper page is not what it names.
        (
            &fetch,
            json!({"url": "https://docs.rs/serde/latest"}),
            "ask",
        ),
    ];
    for (tool, input, expected) in table {
        assert_eq!(
            verdict_kind(&policy.decide(tool, input, &none)),
            *expected,
            "{input}"
        );
    }
}

/// A number is read by its value: every JSON spelling of a whole number meets the rule written with it.
#[test]
fn a_number_meets_a_rule_whatever_its_spelling() {
    let none = SessionGrants::new();
    let pay = tool("mcp__bank__pay", ToolAnnotations::default());
    let policy = policy(
        ApprovalPolicy::Trusted,
        "mcp__bank__pay(amount=1000)=deny,mcp__bank__pay(amount=5)=ask,mcp__bank__pay(amount=10000000000000000)=deny,mcp__bank__pay(amount=0)=deny",
    );
    for text in [
        "1000", "1e3", "1000.0", "1.0e3", "[1, 1e3]", "1e16", "-0.0", "0.0",
    ] {
        let input: Value = serde_json::from_str(&format!(r#"{{"amount": {text}}}"#)).unwrap();
        assert_eq!(
            verdict_kind(&policy.decide(&pay, &input, &none)),
            "deny",
            "{text}"
        );
    }
    for text in ["5.0", "5e0"] {
        let input: Value = serde_json::from_str(&format!(r#"{{"amount": {text}}}"#)).unwrap();
        assert_eq!(
            verdict_kind(&policy.decide(&pay, &input, &none)),
            "ask",
            "{text}"
        );
    }
    assert_eq!(
        verdict_kind(&policy.decide(&pay, &json!({"amount": 1000.5}), &none)),
        "allow"
    );
}

/// A card asked by a rule (an `ask` rule, or a shell while a `deny` restricts `run_command`) offers no approval for
/// the session: the rule asks again before any grant is read, so the grant would never apply. Before, the card
/// offered it, and the next identical call asked anyway.
#[test]
fn a_card_a_rule_asked_for_offers_no_session_approval() {
    let none = SessionGrants::new();
    let policy = policy(
        ApprovalPolicy::OnRequest,
        "run_command(rm)=deny,write_file(notes/**)=ask",
    );
    let shell = policy.approval_choices(&run_command(), &command("sh -c ls"), &none);
    assert!(shell.session.is_empty(), "{shell:?}");
    assert!(
        shell
            .session_note
            .as_deref()
            .unwrap_or("")
            .contains("run_command(rm)=deny"),
        "{shell:?}"
    );
    let write = tool("write_file", DESTRUCTIVE);
    let asked = policy.approval_choices(
        &write,
        &json!({"path": "notes/a.md", "content": "x"}),
        &none,
    );
    assert!(asked.session.is_empty(), "{asked:?}");
    assert!(
        asked
            .session_note
            .as_deref()
            .unwrap_or("")
            .contains("write_file(notes/**)=ask"),
        "{asked:?}"
    );
    // Without a rule that asks, the card offers its grants.
    let plain = policy.approval_choices(&write, &json!({"path": "a.md", "content": "x"}), &none);
    assert!(!plain.session.is_empty(), "{plain:?}");
}

/// A program named by a path into the workspace (`./build.sh`) is a file the file tools can rewrite: no approval of
/// it holds for later calls (no session grant, no Always allow, and a grant made before does not apply), and while a
/// rule restricts `run_command` it asks, as a shell does. Before, its card offered "any arguments for the session"
/// and a rule, both by its name, so a script rewritten after its approval ran unasked, past `run_command(rm)=deny`.
#[tokio::test]
async fn a_program_in_the_workspace_is_approved_once_only() {
    let dir = tempfile::tempdir().unwrap();
    let paths = PathContext::for_workspace(dir.path()).unwrap();
    let in_workspace = format!("{}/build.sh", paths.root().unwrap().display());
    let none = SessionGrants::new();
    let on_request = policy(ApprovalPolicy::OnRequest, "").with_paths(paths.clone());
    // Also a path that reads as the workspace only in the command's process, and one that leads nowhere yet.
    for program in [
        "./build.sh",
        "scripts/test",
        in_workspace.as_str(),
        "/proc/self/cwd/build.sh",
        "/no/such/dir/build.sh",
    ] {
        let input = json!({"command": program, "args": ["--all"]});
        let choices = on_request.approval_choices(&run_command(), &input, &none);
        assert!(choices.session.is_empty(), "{program}: {choices:?}");
        assert_eq!(choices.always_allow, None, "{program}");
        assert!(
            choices
                .session_note
                .as_deref()
                .unwrap()
                .contains("a file in the workspace"),
            "{program}: {choices:?}"
        );
        assert_eq!(
            on_request
                .grant_for(&run_command(), &input, None, DecisionScope::SessionProgram)
                .unwrap(),
            None
        );
        // A grant made before for it does not apply.
        let granted = granted(&run_command(), &input, DecisionScope::Session);
        assert_eq!(
            verdict_kind(&on_request.decide(&run_command(), &input, &granted)),
            "ask",
            "{program}"
        );
        let restricted =
            policy(ApprovalPolicy::Trusted, "run_command(rm)=deny").with_paths(paths.clone());
        let verdict = restricted.explain(&run_command(), &input, &none);
        assert!(
            matches!(verdict.decided_by, DecidedBy::ProgramRunner { .. }),
            "{program}: {verdict:?}"
        );
    }
    // A rule a person added (an earlier version's Always allow) does not allow it; a configured one does.
    let store: Arc<dyn crate::store::Store> = Arc::new(crate::store::memory::MemoryStore::new());
    let configured = policy(ApprovalPolicy::OnRequest, "").with_paths(paths.clone());
    let book = Arc::new(StoredRuleBook::new(configured.rule_book().rules(), store));
    let with_added = configured.with_rule_book(Arc::clone(&book) as Arc<dyn RuleBook>);
    book.add(
        Rule::parse("run_command(./build.sh)=allow").unwrap(),
        "local",
    )
    .await
    .unwrap();
    let script = json!({"command": "./build.sh"});
    assert_eq!(
        verdict_kind(&with_added.decide(&run_command(), &script, &none)),
        "ask"
    );
    let in_file = policy(ApprovalPolicy::OnRequest, "run_command(./build.sh)=allow")
        .with_paths(paths.clone());
    assert_eq!(
        verdict_kind(&in_file.decide(&run_command(), &script, &none)),
        "allow"
    );
    // A program outside the workspace named by its path is a program like any other.
    let outside = json!({"command": "/bin/ls", "args": ["-la"]});
    let choices = on_request.approval_choices(&run_command(), &outside, &none);
    assert_eq!(choices.session.len(), 2, "{choices:?}");
    let restricted = policy(ApprovalPolicy::Trusted, "run_command(rm)=deny").with_paths(paths);
    assert_eq!(
        verdict_kind(&restricted.decide(&run_command(), &outside, &none)),
        "allow"
    );
}

#[test]
fn a_card_offers_the_exact_grants_and_the_narrowest_rule() {
    let none = SessionGrants::new();
    let on_request = policy(ApprovalPolicy::OnRequest, "");
    let choices = on_request.approval_choices(&run_command(), &command("ls -la"), &none);
    assert_eq!(
        choices.always_allow.as_deref(),
        Some("run_command(ls -la $)=allow")
    );
    assert_eq!(choices.session.len(), 2);
    assert_eq!(
        choices.session[0].grant,
        on_request
            .grant_for(
                &run_command(),
                &command("ls -la"),
                None,
                DecisionScope::Session
            )
            .unwrap()
            .unwrap()
    );
    assert!(
        choices.session[0].covers.contains("“ls -la”"),
        "{}",
        choices.session[0].covers
    );

    let write = tool("write_file", DESTRUCTIVE);
    let choices = on_request.approval_choices(
        &write,
        &json!({"path": "./notes/../a b.txt", "content": "x"}),
        &none,
    );
    assert_eq!(
        choices.always_allow.as_deref(),
        Some("write_file(a b.txt)=allow")
    );
    assert!(
        choices.session[0]
            .covers
            .contains("any path in the workspace")
    );

    let strict = policy(ApprovalPolicy::Strict, "");
    let choices = strict.approval_choices(&write, &json!({"path": "a.txt"}), &none);
    assert!(choices.session.is_empty());
    assert!(choices.session_note.as_deref().unwrap().contains("strict"));
    assert!(!choices.offers(DecisionScope::Session));

    let asked_by_rule = policy(ApprovalPolicy::OnRequest, "write_file=ask");
    let choices = asked_by_rule.approval_choices(&write, &json!({"path": "a.txt"}), &none);
    assert_eq!(choices.always_allow, None);
    assert!(
        choices
            .always_allow_note
            .unwrap()
            .contains("write_file=ask")
    );

    let issue = ToolSpec {
        input_schema: json!({
            "type": "object",
            "properties": {"repo": {"type": "string"}, "n": {"type": "integer"}, "body": {"type": "string"}},
            "additionalProperties": false
        }),
        ..tool("mcp__github__create_issue", ToolAnnotations::default())
    };
    let full = json!({"repo": "acme/*", "n": 3, "body": "b"});
    let choices = on_request.approval_choices(&issue, &full, &none);
    assert_eq!(
        choices.always_allow.as_deref(),
        Some("mcp__github__create_issue(body=b, n=3, repo=acme/[*], $)=allow")
    );
    // Each argument pinned and no other (`$`): a call that leaves one out, and a tool whose schema takes arguments
    // it does not name, get a rule for that very call too.
    let partial = on_request.approval_choices(&issue, &json!({"repo": "acme/*", "n": 3}), &none);
    assert_eq!(
        partial.always_allow.as_deref(),
        Some("mcp__github__create_issue(n=3, repo=acme/[*], $)=allow")
    );
    let open = ToolSpec {
        input_schema: json!({"type": "object", "properties": {"repo": {"type": "string"}}}),
        ..issue.clone()
    };
    let choices = on_request.approval_choices(&open, &json!({"repo": "acme"}), &none);
    assert_eq!(
        choices.always_allow.as_deref(),
        Some("mcp__github__create_issue(repo=acme, $)=allow")
    );
}

/// "Always allow" on a tool of a server allows that very call: not one that gives another argument too, whether
/// the schema took it all along or the server added it to its tool later. Before, the rule pinned the arguments the
/// call gave and let any other through, once the server's schema took one more.
#[tokio::test]
async fn an_always_allow_rule_for_a_servers_tool_allows_no_call_with_another_argument() {
    let none = SessionGrants::new();
    let configured = policy(ApprovalPolicy::OnRequest, "");
    let store: Arc<dyn crate::store::Store> = Arc::new(crate::store::memory::MemoryStore::new());
    let book = Arc::new(StoredRuleBook::new(configured.rule_book().rules(), store));
    let base = configured.with_rule_book(Arc::clone(&book) as Arc<dyn RuleBook>);
    let closed = ToolSpec {
        input_schema: json!({
            "type": "object",
            "properties": {"repo": {"type": "string"}},
            "additionalProperties": false
        }),
        ..tool("mcp__gh__create_issue", ToolAnnotations::default())
    };
    let call = json!({"repo": "acme/w"});
    let rule = base.narrowest_allow_rule(&closed, &call).unwrap();
    assert_eq!(
        rule.to_string(),
        "mcp__gh__create_issue(repo=acme/w, $)=allow"
    );
    book.add(rule, "local").await.unwrap();
    assert_eq!(verdict_kind(&base.decide(&closed, &call, &none)), "allow");
    // The server adds an argument to its tool.
    let widened = ToolSpec {
        input_schema: json!({
            "type": "object",
            "properties": {"repo": {"type": "string"}, "delete_after": {"type": "boolean"}},
            "additionalProperties": false
        }),
        ..closed.clone()
    };
    for other in [
        json!({"repo": "acme/w", "delete_after": true}),
        json!({"repo": "acme/x"}),
        json!({}),
    ] {
        assert_eq!(
            verdict_kind(&base.decide(&widened, &other, &none)),
            "ask",
            "{other}"
        );
    }
    assert_eq!(verdict_kind(&base.decide(&widened, &call, &none)), "allow");
}

/// An Always-allow rule pins the text of each value: it is offered for a value that is not text only where the
/// tool's schema fixes its type (else `false` would allow the string "false", which a server in JavaScript reads as
/// true), and it never allows a list of the values it pins. Before, both were allowed.
#[test]
fn an_always_allow_rule_pins_single_values_of_the_type_the_schema_fixes() {
    let none = SessionGrants::new();
    let on_request = policy(ApprovalPolicy::OnRequest, "");
    let open = ToolSpec {
        input_schema: json!({"type": "object", "properties": {"to": {"type": "string"}, "force": {}}}),
        ..tool("mcp__mail__send", ToolAnnotations::default())
    };
    let call = json!({"to": "a@x", "force": false});
    let choices = on_request.approval_choices(&open, &call, &none);
    assert_eq!(choices.always_allow, None);
    assert!(
        choices
            .always_allow_note
            .as_deref()
            .unwrap_or_default()
            .contains("does not fix the type of \"force\""),
        "{choices:?}"
    );
    // A `$ref` beside a type is read instead of it by older drafts: the type is not taken as fixed.
    let referenced = ToolSpec {
        input_schema: json!({"type": "object", "properties": {"to": {"type": "string"},
            "force": {"$ref": "#/definitions/flag", "type": "boolean"}}}),
        ..open.clone()
    };
    assert_eq!(
        on_request
            .approval_choices(&referenced, &call, &none)
            .always_allow,
        None
    );
    let typed = ToolSpec {
        input_schema: json!({"type": "object", "properties": {"to": {"type": "string"}, "force": {"type": "boolean"}}}),
        ..open
    };
    let rule = on_request.narrowest_allow_rule(&typed, &call).unwrap();
    let allowed = policy(ApprovalPolicy::OnRequest, &rule.to_string());
    assert_eq!(verdict_kind(&allowed.decide(&typed, &call, &none)), "allow");
    for other in [
        json!({"to": ["a@x", "a@x"], "force": false}),
        json!({"to": "a@x", "force": [false]}),
    ] {
        assert_eq!(
            verdict_kind(&allowed.decide(&typed, &other, &none)),
            "ask",
            "{other}"
        );
    }
}

/// A rule that names an argument no tool it is about takes meets no call, and says so; a schema that takes other
/// names (no `additionalProperties: false`, or `patternProperties`) may take it.
#[test]
fn a_rule_naming_an_argument_its_tool_does_not_take_says_so() {
    let closed = |name: &str, extra: Value| ToolSpec {
        input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}},
            "additionalProperties": false})
        .as_object()
        .unwrap()
        .clone()
        .into_iter()
        .chain(extra.as_object().unwrap().clone())
        .collect(),
        ..tool(name, ToolAnnotations::default())
    };
    let tools = [
        closed("mcp__fs__read", json!({})),
        closed(
            "mcp__fs__tag",
            json!({"patternProperties": {"^x-": {"type": "string"}}}),
        ),
        tool("mcp__fs__open", ToolAnnotations::default()),
    ];
    let warnings = |rule: &str| Rule::parse(rule).unwrap().warnings(&tools);
    assert_eq!(
        warnings("mcp__fs__read(file=a.txt)=deny"),
        ["mcp__fs__read takes no argument file (its arguments are path): the rule meets no call."]
    );
    let none: [&str; 0] = [];
    for fine in [
        "mcp__fs__read(path=a.txt)=deny",
        "mcp__fs__tag(x-colour=red)=deny",
        "mcp__fs__open(anything=a)=deny",
        "mcp__fs__*(path=secrets/**)=deny",
    ] {
        assert_eq!(warnings(fine), none, "{fine}");
    }
}

/// A rule with a last `$` allows single values only: one written by hand for an argument the tool's schema makes a
/// list or an object allows no call that gives it, and says which (the rules API passes that on as a warning).
#[test]
fn a_last_dollar_rule_names_the_list_arguments_it_cannot_meet() {
    let mail = ToolSpec {
        input_schema: json!({"type": "object", "properties": {
            "to": {"type": "array", "items": {"type": "string"}},
            "cc": {"type": ["array", "null"]},
            "headers": {"type": ["object", "array"]},
            "subject": {"type": "string"},
            "body": {},
            "ref": {"$ref": "#/definitions/list", "type": "array"},
        }}),
        ..tool("mcp__mail__send", ToolAnnotations::default())
    };
    let cannot_meet = |rule: &str| -> Vec<String> {
        let rule = Rule::parse(rule).unwrap_or_else(|e| panic!("{e}"));
        let mut names: Vec<String> = rule
            .arguments_it_cannot_meet(&mail)
            .into_iter()
            .map(str::to_owned)
            .collect();
        names.sort();
        names
    };
    // A list, an object, or a list or null (no allow rule meets a null either).
    assert_eq!(
        cannot_meet("mcp__mail__send(to=a@x, headers=*, cc=*, subject=hi, $)=allow"),
        ["cc", "headers", "to"]
    );
    let none: [&str; 0] = [];
    for meets in [
        // A value of a schema read as it may be may be a single value.
        "mcp__mail__send(body=*, ref=*, subject=*, $)=allow",
        // Without `$` a list whose every item fits the glob is met.
        "mcp__mail__send(to=a@x)=allow",
        // Another tool's rule is not about this one.
        "mcp__other__send(to=a@x, $)=allow",
    ] {
        assert_eq!(cannot_meet(meets), none, "{meets}");
    }
    // What the warning says is so: the rule does not allow the call it seems to name.
    let rule = "mcp__mail__send(to=a@x, subject=hi, $)=allow";
    let allowed = policy(ApprovalPolicy::OnRequest, rule);
    let call = json!({"to": ["a@x"], "subject": "hi"});
    assert_eq!(
        verdict_kind(&allowed.decide(&mail, &call, &SessionGrants::new())),
        "ask"
    );
}

#[tokio::test]
async fn an_always_allow_rule_runs_the_same_call_and_asks_for_others() {
    let none = SessionGrants::new();
    let configured = policy(ApprovalPolicy::OnRequest, "");
    let store: Arc<dyn crate::store::Store> = Arc::new(crate::store::memory::MemoryStore::new());
    let book = Arc::new(StoredRuleBook::new(configured.rule_book().rules(), store));
    let base = configured.with_rule_book(Arc::clone(&book) as Arc<dyn RuleBook>);
    let ls = command("ls -la");
    let rule = base.narrowest_allow_rule(&run_command(), &ls).unwrap();
    book.add(rule, "local").await.unwrap();
    assert_eq!(
        verdict_kind(&base.decide(&run_command(), &ls, &none)),
        "allow"
    );
    for other in ["ls -la ..", "ls", "rm -rf x"] {
        assert_eq!(
            verdict_kind(&base.decide(&run_command(), &command(other), &none)),
            "ask",
            "{other}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A prefix matches exactly the argvs that start with its words, compared word by word.
    #[test]
    fn prefixes_match_on_whole_words(
        rule_words in prop::collection::vec("[a-z-]{1,4}", 1..4),
        argv in prop::collection::vec("[a-z-]{1,5}", 1..6),
    ) {
        let text = format!("run_command({})=allow", shell_words(&rule_words[0], &rule_words[1..]));
        let rule = Rule::parse(&text).unwrap();
        let input = json!({"command": argv[0], "args": &argv[1..]});
        let paths = PathContext::lexical();
        let call = CallFacts::named("run_command", &input, &paths);
        let expected = argv.len() >= rule_words.len() && argv[..rule_words.len()] == rule_words[..];
        prop_assert_eq!(rule.matches(&call), expected);
    }

    /// Any word, however quoted, reads back as itself: quoting can neither widen nor narrow a prefix.
    #[test]
    fn quoted_words_read_back_as_themselves(words in prop::collection::vec("[ -~]{0,6}", 1..4)) {
        prop_assume!(!words[0].is_empty());
        let text = format!("run_command({})=deny", shell_words(&words[0], &words[1..]));
        let rule = Rule::parse(&text).unwrap();
        prop_assert_eq!(Rule::parse(&rule.to_string()).unwrap(), rule.clone());
        let input = json!({"command": words[0], "args": &words[1..]});
        let paths = PathContext::lexical();
        let call = CallFacts::named("run_command", &input, &paths);
        prop_assert!(rule.matches(&call), "{}", text);
    }

    /// No arrangement of `.`, `..` and extra slashes gets a path that lands on a denied file past the deny, and
    /// none makes a path that lands outside `src/` fit `src/**`.
    #[test]
    fn dot_dot_never_bypasses_a_path_rule(
        segments in prop::collection::vec(prop_oneof!["src", "docs", "\\.", "\\.\\.", "", "\\.env", "a"], 1..8),
    ) {
        let raw = segments.join("/");
        let none = SessionGrants::new();
        let policy = policy(ApprovalPolicy::OnRequest, "read_file(**/.env)=deny,write_file(src/**)=allow");
        let landed = matcher::normalize_relative(&raw);
        let read = policy.decide(&tool("read_file", READ_ONLY), &json!({"path": raw}), &none);
        let lands_on_env = landed.as_deref().is_some_and(|p| p == ".env" || p.ends_with("/.env"));
        prop_assert_eq!(matches!(read, PermissionDecision::Deny { .. }), lands_on_env, "{} -> {:?}", raw, landed);
        let write = policy.decide(&tool("write_file", DESTRUCTIVE), &json!({"path": raw}), &none);
        let lands_in_src = landed.as_deref().is_some_and(|p| p.starts_with("src/"));
        prop_assert_eq!(matches!(write, PermissionDecision::Allow { .. }), lands_in_src, "{} -> {:?}", raw, landed);
    }

    /// Case: on a case-sensitive file system `.ENV` is another file and the rule for `.env` does not see it; on a
    /// case-insensitive one every spelling is caught.
    #[test]
    fn every_spelling_of_a_denied_name_is_caught_where_case_does_not_count(upper in prop::collection::vec(any::<bool>(), 4)) {
        let name: String = ".env".chars().zip(std::iter::once(false).chain(upper)).map(|(c, up)| if up { c.to_ascii_uppercase() } else { c }).collect();
        let dir = tempfile::tempdir().unwrap();
        let none = SessionGrants::new();
        let read = tool("read_file", READ_ONLY);
        let insensitive = policy(ApprovalPolicy::OnRequest, "read_file(.env)=deny")
            .with_paths(PathContext::with_root(dir.path(), true).unwrap());
        let input = json!({"path": name});
        let denied = matches!(insensitive.decide(&read, &input, &none), PermissionDecision::Deny { .. });
        prop_assert!(denied, "{}", name);
        let sensitive = policy(ApprovalPolicy::OnRequest, "read_file(.env)=deny")
            .with_paths(PathContext::with_root(dir.path(), false).unwrap());
        let denied = matches!(sensitive.decide(&read, &json!({"path": name}), &none), PermissionDecision::Deny { .. });
        prop_assert_eq!(denied, name == ".env");
    }

    /// A grant for one exact command covers that command and nothing else.
    #[test]
    fn an_exact_grant_covers_only_its_own_argv(
        granted_argv in prop::collection::vec("[a-z]{1,3}", 1..4),
        other in prop::collection::vec("[a-z]{1,3}", 1..4),
    ) {
        let spec = run_command();
        let input = |argv: &[String]| json!({"command": argv[0], "args": &argv[1..]});
        let grants = granted(&spec, &input(&granted_argv), DecisionScope::Session);
        prop_assert_eq!(grants.covering(&spec, &input(&other)).is_some(), other == granted_argv);
    }
}

/// A name in another Unicode normalization (`é` as `e` and a combining accent) is the same name to a `deny` or an
/// `ask`, as a file system that ignores normalization (APFS) opens one file by either; not to an `allow`.
#[test]
fn a_name_in_another_unicode_normalization_meets_the_deny_and_ask_rules() {
    let none = SessionGrants::new();
    let read = tool("read_file", READ_ONLY);
    let (composed, decomposed) = ("données", "donne\u{301}es");
    for (written, asked) in [(composed, decomposed), (decomposed, composed)] {
        let input = json!({ "path": format!("{asked}/x") });
        for (rules, expected) in [
            (format!("read_file({written}/**)=deny"), "deny"),
            (format!("read_file({written}/x)=deny"), "deny"),
            (format!("read_file({written}/*)=ask"), "ask"),
        ] {
            let decision = policy(ApprovalPolicy::Trusted, &rules).decide(&read, &input, &none);
            assert_eq!(verdict_kind(&decision), expected, "{rules}: {input}");
        }
        // Listing the directory itself, which a deny on what is under it covers.
        let list = tool("list_files", READ_ONLY);
        let listed = policy(
            ApprovalPolicy::Trusted,
            &format!("list_files({written}/**)=deny"),
        );
        assert_eq!(
            verdict_kind(&listed.decide(&list, &json!({ "path": asked }), &none)),
            "deny",
            "{written}"
        );
        let allow = policy(
            ApprovalPolicy::Strict,
            &format!("read_file({written}/*)=allow"),
        );
        assert_eq!(
            verdict_kind(&allow.decide(&read, &input, &none)),
            "ask",
            "an allow names one spelling"
        );
    }
}
