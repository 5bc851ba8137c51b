//! The report: readable tables on stdout, the targets, and the same figures as JSON.

use std::fmt::Write as _;

use serde::Serialize;

use crate::browser::{Asset, ENCODINGS, Hydration};
use crate::roundtrip::Level;
use crate::scale::Scale;
use crate::server::Store;
use crate::stats::{Spread, Summary};
use crate::system::{Machine, Memory};

const MIB: f64 = 1024.0 * 1024.0;

/// Where and what was measured.
#[derive(Clone, Debug, Serialize)]
pub struct Meta {
    pub date_utc: String,
    pub commit: String,
    pub server: String,
    pub workspace_dir: String,
    pub command: String,
    pub machine: Machine,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub meta: Option<Meta>,
    /// Round trips over the approval API's routes.
    pub roundtrip: Vec<Level>,
    /// Round trips over the AG-UI interrupt flow.
    pub agui_roundtrip: Vec<Level>,
    pub scale: Option<Scale>,
    pub assets: Option<Vec<Asset>>,
    pub hydration: Option<Hydration>,
    pub targets: Vec<Target>,
}

impl Report {
    /// Every trip verified, nothing lost or doubled, the browser part without errors.
    pub fn is_clean(&self) -> bool {
        self.roundtrips().all(Level::is_clean)
            && self.scale.as_ref().is_none_or(Scale::is_clean)
            && self.hydration.as_ref().is_none_or(|h| h.errors.is_empty())
    }

    /// Every round-trip level, of every flow.
    pub fn roundtrips(&self) -> impl Iterator<Item = &Level> {
        self.roundtrip.iter().chain(&self.agui_roundtrip)
    }
}

/// Left-aligned first column, right-aligned numbers.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::from("  ");
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i == 0 {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str("  ");
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&line(rule.iter().map(String::as_str).collect()));
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB)
}

fn kib(bytes: u64) -> String {
    if bytes >= 10 * 1024 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

fn ms3(value: f64) -> String {
    format!("{value:.3}")
}

fn latency_row(name: String, s: &Summary) -> Vec<String> {
    vec![
        name,
        s.count.to_string(),
        ms3(s.p50_ms),
        ms3(s.p95_ms),
        ms3(s.p99_ms),
        ms3(s.max_ms),
        ms3(s.mean_ms),
    ]
}

pub fn header(meta: &Meta) -> String {
    let m = &meta.machine;
    format!(
        "toolgate-bench · {date} · commit {commit}\n\
         machine: {cpus} CPUs ({model}), {mem} MiB RAM, Linux {kernel}, {ticks} clock ticks/s, load {load}\n\
         server:  {server} (workspace under {workspace})\n\
         command: {command}\n",
        date = meta.date_utc,
        commit = meta.commit,
        cpus = m.cpus,
        model = m.cpu_model,
        mem = m.memory_mib,
        kernel = m.kernel,
        ticks = m.clock_ticks_per_second,
        load = m.load_average,
        server = meta.server,
        workspace = meta.workspace_dir,
        command = meta.command,
    )
}

pub fn roundtrip(levels: &[Level]) -> String {
    let mut out = String::new();
    let Some(first) = levels.first() else {
        return out;
    };
    let _ = writeln!(
        out,
        "== Approval round trip ({}, {} store, scripted model): {}",
        first.flow,
        first.store.as_str(),
        first.legs.trip
    );
    if first.instances > 1 {
        let _ = writeln!(
            out,
            "   {} toolgate instances on one PostgreSQL database: the run started and streamed on the first, the \
             decision posted to the last (it reaches the run through the database); server CPU and RSS are summed \
             over the instances, PostgreSQL's own CPU (postmaster and backends) is apart",
            first.instances
        );
        let _ = writeln!(
            out,
            "   each level on fresh instances and a fresh database; figures per round as median [min–max] over the \
             rounds\n"
        );
    } else {
        let _ = writeln!(
            out,
            "   each level on a fresh server; figures per round as median [min–max] over the rounds\n"
        );
    }
    let database = levels.iter().any(|l| l.database_cpu_per_trip_us.is_some());
    let rows: Vec<Vec<String>> = levels
        .iter()
        .map(|l| {
            let mut row = vec![
                l.concurrency.to_string(),
                format!("{} + {} warm-up", l.measured_trips, l.warmup_trips),
                format!("{}", l.failed + l.unverified_files),
                l.trips_per_second.show(0),
                l.server_cpu_per_trip_us.show(1),
                format!("{:.1}", l.server_sys_per_trip_us.median),
                format!("±{:.1}", l.cpu_resolution_per_trip_us),
                l.bench_cpu_per_trip_us.show(1),
            ];
            if database {
                row.push(
                    l.database_cpu_per_trip_us
                        .map_or_else(|| "n/a".to_owned(), |s| s.show(1)),
                );
            }
            row
        })
        .collect();
    let mut headers = vec![
        "concurrency",
        "trips",
        "failed",
        "trips/s",
        "server CPU µs/trip",
        "of it sys",
        "(tick)",
        "bench CPU µs/trip",
    ];
    if database {
        headers.push("PostgreSQL CPU µs/trip");
    }
    out.push_str(&table(&headers, &rows));
    out.push('\n');
    let mut rows = Vec::new();
    for l in levels {
        let c = l.concurrency;
        rows.push(latency_row(format!("c={c} whole trip"), &l.whole_trip));
        rows.push(latency_row(
            format!("c={c} {}", l.legs.decision_to_resolved),
            &l.decision_to_resolved,
        ));
        rows.push(latency_row(
            format!("c={c} {}", l.legs.decision_response),
            &l.decision_response,
        ));
        rows.push(latency_row(
            format!("c={c} {}", l.legs.to_approval),
            &l.to_approval,
        ));
    }
    out.push_str(&table(
        &["latency (ms)", "n", "p50", "p95", "p99", "max", "mean"],
        &rows,
    ));
    for l in levels {
        let _ = writeln!(
            out,
            "  c={}: server RSS {} at start, {} after; files verified in the workspace: {} missing or wrong",
            l.concurrency,
            mib(l.server_rss_idle_bytes),
            mib(l.server_rss_after_bytes),
            l.unverified_files
        );
        failures(&mut out, &l.failures_by_kind, &l.failure_examples);
    }
    out
}

/// The round trips of every store side by side, level by level (medians over the rounds, latency percentiles).
pub fn by_store(levels: &[Level]) -> String {
    let mut out = String::new();
    let Some(first) = levels.first() else {
        return out;
    };
    let _ = writeln!(
        out,
        "== Approval round trip by store ({}): trips/s and server CPU as medians over the rounds (server CPU summed \
         over the instances; PostgreSQL's own CPU apart)\n",
        first.flow
    );
    let rows: Vec<Vec<String>> = levels
        .iter()
        .map(|l| {
            vec![
                l.store.as_str().to_owned(),
                l.concurrency.to_string(),
                format!("{}", l.failed + l.unverified_files),
                format!("{:.0}", l.trips_per_second.median),
                format!("{:.1}", l.server_cpu_per_trip_us.median),
                l.database_cpu_per_trip_us
                    .map_or_else(|| "-".to_owned(), |s| format!("{:.1}", s.median)),
                format!(
                    "{} / {} / {}",
                    ms3(l.whole_trip.p50_ms),
                    ms3(l.whole_trip.p95_ms),
                    ms3(l.whole_trip.p99_ms)
                ),
                format!(
                    "{} / {} / {}",
                    ms3(l.decision_to_resolved.p50_ms),
                    ms3(l.decision_to_resolved.p95_ms),
                    ms3(l.decision_to_resolved.p99_ms)
                ),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "store",
            "concurrency",
            "failed",
            "trips/s",
            "server CPU µs/trip",
            "PostgreSQL CPU µs/trip",
            "whole trip p50 / p95 / p99 ms",
            "decision -> approvalResolved p50 / p95 / p99 ms",
        ],
        &rows,
    ));
    out
}

fn failures(
    out: &mut String,
    by_kind: &std::collections::BTreeMap<String, usize>,
    examples: &[String],
) {
    if by_kind.is_empty() && examples.is_empty() {
        return;
    }
    let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    let _ = writeln!(out, "  FAILURES ({})", kinds.join(", "));
    for example in examples {
        let _ = writeln!(out, "    {example}");
    }
}

pub fn scale(s: &Scale) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== Scale: {} runs waiting for approval at once, first with no stream open, then each with its SSE stream \
         ({} requests in flight)\n",
        s.runs, s.in_flight
    );
    let row = |phase: String, memory: &Memory| {
        vec![
            phase,
            mib(memory.rss_bytes),
            mib(memory.anon_bytes),
            mib(memory.file_bytes),
        ]
    };
    let rows = vec![
        row("idle (started, no run yet)".to_owned(), &s.idle),
        row(
            format!("{} pending, no stream open", s.pending_listed_by_server),
            &s.pending_memory,
        ),
        row(
            format!("{} pending, each with its stream open", s.pending),
            &s.streams_memory,
        ),
        row("after all resolved, streams closed".to_owned(), &s.after),
        vec![
            "peak (VmHWM)".to_owned(),
            mib(s.after.peak_rss_bytes),
            String::new(),
            String::new(),
        ],
    ];
    out.push_str(&table(
        &[
            "server resident memory",
            "VmRSS",
            "anonymous",
            "files mapped",
        ],
        &rows,
    ));
    let per = |bytes: u64, n: usize| bytes as f64 / n.max(1) as f64 / 1024.0;
    let _ = writeln!(
        out,
        "  about {:.1} KiB per pending run, and {:.1} KiB more per open stream (files mapped: the binary's own code \
         and data, shared with the system's page cache)",
        per(
            s.pending_memory.rss_bytes.saturating_sub(s.idle.rss_bytes),
            s.pending_listed_by_server
        ),
        per(
            s.streams_memory
                .rss_bytes
                .saturating_sub(s.pending_memory.rss_bytes),
            s.pending
        ),
    );
    out.push('\n');
    let runs = s.runs.max(1) as f64;
    let rows = vec![
        vec![
            "start all until the server lists them waiting".to_owned(),
            format!("{:.2}", s.create_s),
            format!("{:.0}", s.runs as f64 / s.create_s),
            format!("{:.1}", s.server_cpu_create_ms * 1000.0 / runs),
        ],
        vec![
            "open a stream for each until approvalRequired".to_owned(),
            format!("{:.2}", s.open_s),
            format!("{:.0}", s.runs as f64 / s.open_s),
            format!("{:.1}", s.server_cpu_open_ms * 1000.0 / runs),
        ],
        vec![
            "resolve all (decision -> done)".to_owned(),
            format!("{:.2}", s.resolve_s),
            format!("{:.0}", s.runs as f64 / s.resolve_s),
            format!("{:.1}", s.server_cpu_resolve_ms * 1000.0 / runs),
        ],
    ];
    out.push_str(&table(
        &["phase", "seconds", "runs/s", "server CPU µs/run"],
        &rows,
    ));
    out.push('\n');
    out.push_str(&table(
        &["latency (ms)", "n", "p50", "p95", "p99", "max", "mean"],
        &[latency_row(
            "decision -> approvalResolved, all at once".to_owned(),
            &s.decision_to_resolved,
        )],
    ));
    let verdict = |ok: bool| if ok { "ok" } else { "FAILED" };
    let _ = writeln!(
        out,
        "  checks: pending {}/{} (server listed {}) · decisions 200 {}/{} · streams resolved+done {}/{} · lost {} · \
         doubled {} · second decisions 404 {}/{} · files missing {} -> {}",
        s.pending,
        s.runs,
        s.pending_listed_by_server,
        s.decisions_ok,
        s.pending,
        s.streams_resolved,
        s.pending,
        s.lost,
        s.doubled,
        s.second_decisions_404,
        s.second_decisions,
        s.files_missing,
        verdict(s.is_clean())
    );
    failures(&mut out, &s.failures_by_kind, &s.failure_examples);
    out
}

pub fn assets(assets: &[Asset]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== What the browser downloads: body bytes as sent, per Accept-Encoding (the encoding served when it differs)\n"
    );
    let cell = |asset: &Asset, encoding: &str| match asset.bytes(encoding) {
        Some(f) if f.served == encoding || (encoding == "identity" && f.served == "identity") => {
            kib(f.bytes)
        }
        Some(f) => format!("{} ({})", kib(f.bytes), f.served),
        None => "n/a".to_owned(),
    };
    let mut rows: Vec<Vec<String>> = assets
        .iter()
        .map(|a| {
            let mut row = vec![format!("{} [{}]", a.path, a.kind)];
            row.extend(ENCODINGS.iter().map(|e| cell(a, e)));
            row
        })
        .collect();
    let needed: Vec<&Asset> = assets
        .iter()
        .filter(|a| matches!(a.kind.as_str(), "wasm" | "js" | "css"))
        .collect();
    let mut total = vec!["wasm + js + css".to_owned()];
    for encoding in ENCODINGS {
        let sum: u64 = needed
            .iter()
            .filter_map(|a| a.bytes(encoding))
            .map(|f| f.bytes)
            .sum();
        total.push(kib(sum));
    }
    rows.push(total);
    out.push_str(&table(&["file", "raw", "gzip", "brotli"], &rows));
    if assets.iter().any(|a| a.kind == "html") {
        let _ = writeln!(
            out,
            "  / is rendered per request (so its size may differ between the three fetches) and sent uncompressed"
        );
    }
    out
}

pub fn hydration(h: &Hydration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== Navigation -> hydrated, clickable ApprovalBar (headless Chromium {}, {} repetitions, fresh context each)\n",
        h.chromium, h.repetitions
    );
    let rows = vec![
        vec![
            "cold (empty cache): card visible (server-rendered)".to_owned(),
            h.cold_card_visible_ms.show(1),
        ],
        vec![
            "cold: wasm downloaded".to_owned(),
            h.cold_wasm_loaded_ms.show(1),
        ],
        vec![
            "cold: Approve hydrated and enabled".to_owned(),
            h.cold_clickable_ms.show(1),
        ],
        vec![
            "warm (reload, files revalidated): Approve clickable".to_owned(),
            h.warm_clickable_ms.show(1),
        ],
    ];
    out.push_str(&table(
        &["milliseconds since navigation start", "median [min–max]"],
        &rows,
    ));
    let _ = writeln!(
        out,
        "  transferred per navigation (headers included): cold {}, warm {}",
        bytes_spread(&h.cold_transfer_bytes),
        bytes_spread(&h.warm_transfer_bytes)
    );
    for error in &h.errors {
        let _ = writeln!(out, "  FAILED {error}");
    }
    out
}

fn bytes_spread(spread: &Spread) -> String {
    if spread.count == 0 {
        return "n/a".to_owned();
    }
    kib(spread.median as u64)
}

/// One of the targets, against what was measured.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub what: String,
    pub target: String,
    pub measured: String,
    pub met: Option<bool>,
}

pub fn targets(report: &Report) -> Vec<Target> {
    let mut targets = Vec::new();
    for levels in [&report.roundtrip, &report.agui_roundtrip] {
        for level in levels {
            let cpu = level.server_cpu_per_trip_us.median;
            targets.push(Target {
                what: format!(
                    "server CPU per round trip ({}, {} store), concurrency {}",
                    level.flow,
                    level.store.as_str(),
                    level.concurrency
                ),
                target: "≤ 100 µs".to_owned(),
                measured: format!("{cpu:.1} µs"),
                met: level.is_clean().then_some(cpu <= 100.0),
            });
        }
        for level in levels.iter().filter(|l| l.concurrency == 1) {
            let p99 = level.decision_to_resolved.p99_ms;
            targets.push(Target {
                what: format!(
                    "{} p99 ({}, {} store), concurrency 1",
                    level.legs.decision_to_resolved,
                    level.flow,
                    level.store.as_str()
                ),
                target: "< 1 ms".to_owned(),
                measured: format!("{p99:.3} ms"),
                met: level.is_clean().then_some(p99 < 1.0),
            });
        }
        // What durability costs: the SQLite store's CPU per trip over the memory store's, level by level.
        for durable in levels.iter().filter(|l| l.store == Store::Sqlite) {
            let Some(memory) = levels
                .iter()
                .find(|l| l.store == Store::Memory && l.concurrency == durable.concurrency)
            else {
                continue;
            };
            let ratio =
                durable.server_cpu_per_trip_us.median / memory.server_cpu_per_trip_us.median;
            targets.push(Target {
                what: format!(
                    "durability's CPU cost (sqlite ÷ memory, {}), concurrency {}",
                    durable.flow, durable.concurrency
                ),
                target: "≤ 1.3x".to_owned(),
                measured: format!("{ratio:.2}x"),
                met: (durable.is_clean() && memory.is_clean()).then_some(ratio <= 1.3),
            });
        }
    }
    let idle = report.scale.as_ref().map(|s| s.idle.rss_bytes).or_else(|| {
        // One instance's: the two-instance levels report the sum.
        report
            .roundtrips()
            .find(|l| l.instances == 1)
            .map(|l| l.server_rss_idle_bytes)
    });
    if let Some(idle) = idle {
        targets.push(Target {
            what: "server resident memory at idle".to_owned(),
            target: "< 20 MiB".to_owned(),
            measured: mib(idle),
            met: Some((idle as f64) < 20.0 * MIB),
        });
    }
    if let Some(scale) = &report.scale {
        let full = scale.runs >= 10_000;
        targets.push(Target {
            what: format!(
                "server resident memory with {} pending",
                scale.pending_listed_by_server
            ),
            target: "< 100 MiB with 10,000 pending".to_owned(),
            measured: mib(scale.pending_memory.rss_bytes),
            met: (full && scale.is_clean())
                .then_some((scale.pending_memory.rss_bytes as f64) < 100.0 * MIB),
        });
    }
    targets
}

pub fn targets_table(targets: &[Target]) -> String {
    let mut out = String::from("== Targets\n\n");
    let rows: Vec<Vec<String>> = targets
        .iter()
        .map(|t| {
            vec![
                t.what.clone(),
                t.target.clone(),
                t.measured.clone(),
                match t.met {
                    Some(true) => "met".to_owned(),
                    Some(false) => "MISSED".to_owned(),
                    None => "n/a (smaller scale or failed trips)".to_owned(),
                },
            ]
        })
        .collect();
    out.push_str(&table(&["figure", "target", "measured", "verdict"], &rows));
    out
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The current time as `YYYY-MM-DD HH:MM UTC`.
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (year, month, day) = civil(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(20_512), (2026, 2, 28));
    }

    #[test]
    fn tables_align() {
        let out = table(
            &["a", "bb"],
            &[
                vec!["x".into(), "1".into()],
                vec!["yyy".into(), "22".into()],
            ],
        );
        assert_eq!(out, "  a    bb\n  ---  --\n  x     1\n  yyy  22\n");
    }
}
