//! Scenario 3: what the browser downloads (wasm, js, css; raw, gzip, brotli, as the server sends them), and the
//! time from navigation to a hydrated, clickable ApprovalBar in headless Chromium (end2end/bench/hydration.mjs).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::server::{Server, ServerOptions};
use crate::stats::Spread;

/// The encodings asked for, as `Accept-Encoding` values.
pub const ENCODINGS: [&str; 3] = ["identity", "gzip", "br"];

/// The files the page needs whatever its HTML says: the hydration script builds the wasm's address itself.
const REQUIRED: [&str; 3] = [
    "/pkg/toolgate.wasm",
    "/pkg/toolgate.js",
    "/pkg/toolgate.css",
];

/// One file fetched with one `Accept-Encoding`.
#[derive(Clone, Debug, Serialize)]
pub struct Fetched {
    pub requested: &'static str,
    /// The `Content-Encoding` the server answered with (`identity` when none).
    pub served: String,
    /// Body bytes as sent on the wire (not decompressed).
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Asset {
    pub path: String,
    pub kind: String,
    pub fetches: Vec<Fetched>,
}

impl Asset {
    pub fn bytes(&self, requested: &str) -> Option<&Fetched> {
        self.fetches.iter().find(|f| f.requested == requested)
    }
}

fn kind(path: &str) -> String {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("wasm") => "wasm",
        Some("js" | "mjs") => "js",
        Some("css") => "css",
        _ if path == "/" => "html",
        _ => "other",
    }
    .to_owned()
}

/// Same-origin addresses in `href="..."` and `src="..."` attributes.
fn linked_paths(html: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for attribute in ["href=\"", "src=\""] {
        for (at, _) in html.match_indices(attribute) {
            let rest = &html[at + attribute.len()..];
            if let Some(end) = rest.find('"') {
                let path = &rest[..end];
                if path.starts_with('/')
                    && !path.starts_with("//")
                    && !paths.iter().any(|p| p == path)
                {
                    paths.push(path.to_owned());
                }
            }
        }
    }
    paths
}

async fn fetch(
    client: &reqwest::Client,
    url: &str,
    encoding: &'static str,
) -> Result<(Fetched, String)> {
    let response = client
        .get(url)
        .header(reqwest::header::ACCEPT_ENCODING, encoding)
        .send()
        .await
        .with_context(|| format!("GET {url} failed"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("GET {url} with Accept-Encoding {encoding} answered {status}");
    }
    let served = response
        .headers()
        .get(reqwest::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .to_owned();
    // No decompression is configured in the client: these are the bytes on the wire.
    let body = response
        .bytes()
        .await
        .with_context(|| format!("reading the body of {url} failed"))?;
    let text = if served == "identity" {
        String::from_utf8_lossy(&body).into_owned()
    } else {
        String::new()
    };
    Ok((
        Fetched {
            requested: encoding,
            served,
            bytes: body.len() as u64,
        },
        text,
    ))
}

/// The page and every file it needs, each fetched with every encoding, from a running server.
pub async fn assets(server: &Server) -> Result<Vec<Asset>> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .context("cannot build the HTTP client")?;
    let mut paths = vec!["/".to_owned()];
    let (_, html) = fetch(&client, &server.url("/"), "identity").await?;
    for path in linked_paths(&html)
        .into_iter()
        .chain(REQUIRED.map(str::to_owned))
    {
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    let mut assets = Vec::new();
    for path in paths {
        let mut fetches = Vec::new();
        for encoding in ENCODINGS {
            fetches.push(fetch(&client, &server.url(&path), encoding).await?.0);
        }
        assets.push(Asset {
            kind: kind(&path),
            path,
            fetches,
        });
    }
    Ok(assets)
}

/// Where the hydration script and its tools are.
#[derive(Clone, Debug)]
pub struct HydrationSettings {
    pub node: PathBuf,
    pub script: PathBuf,
    pub chromium: PathBuf,
    pub runs: usize,
    pub warmup: usize,
}

/// One navigation as the script measured it; times in ms since the navigation started.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Navigation {
    pub clickable_ms: f64,
    pub hydrated_ms: Option<f64>,
    pub card_ms: Option<f64>,
    pub document_ms: Option<f64>,
    pub dom_content_loaded_ms: Option<f64>,
    pub load_ms: Option<f64>,
    pub wasm_response_end_ms: Option<f64>,
    pub transfer_bytes: Option<f64>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Repetition {
    #[serde(rename = "runId")]
    pub run_id: String,
    pub cold: Navigation,
    pub warm: Navigation,
}

#[derive(Clone, Debug, Deserialize)]
struct ScriptOutput {
    chromium: String,
    runs: Vec<Repetition>,
    errors: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Hydration {
    pub chromium: String,
    pub repetitions: usize,
    pub errors: Vec<String>,
    /// Navigation to a hydrated, clickable Approve button, empty cache.
    pub cold_clickable_ms: Spread,
    pub cold_card_visible_ms: Spread,
    pub cold_wasm_loaded_ms: Spread,
    pub cold_transfer_bytes: Spread,
    /// The same after a reload (files revalidated).
    pub warm_clickable_ms: Spread,
    pub warm_transfer_bytes: Spread,
    pub runs: Vec<Repetition>,
}

/// Runs the Playwright script against a running server.
pub async fn hydration(server: &Server, settings: &HydrationSettings) -> Result<Hydration> {
    if !settings.script.is_file() {
        bail!("no hydration script at {}", settings.script.display());
    }
    if !settings.chromium.is_file() {
        bail!(
            "no Chromium at {} (scripts/bootstrap.sh installs Debian's); pass --chromium PATH or skip the \
             hydration scenario",
            settings.chromium.display()
        );
    }
    let patience = Duration::from_secs(60 + 30 * (settings.runs + settings.warmup) as u64);
    let child = tokio::process::Command::new(&settings.node)
        .arg(&settings.script)
        .args(["--url", &server.base_url()])
        .args(["--runs", &settings.runs.to_string()])
        .args(["--warmup", &settings.warmup.to_string()])
        .arg("--chromium")
        .arg(&settings.chromium)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| {
            format!(
                "cannot run {} (Node.js with end2end's packages: scripts/bootstrap.sh installs them)",
                settings.node.display()
            )
        })?;
    let output = tokio::time::timeout(patience, child.wait_with_output())
        .await
        .with_context(|| {
            format!(
                "the hydration script did not finish within {} s",
                patience.as_secs()
            )
        })?
        .context("cannot wait for the hydration script")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let parsed: ScriptOutput = serde_json::from_str(stdout.trim()).with_context(|| {
        format!(
            "the hydration script ({}) printed no result; stderr:\n{}",
            output.status,
            stderr.trim()
        )
    })?;

    let spread = |pick: &dyn Fn(&Repetition) -> Option<f64>| {
        Spread::of(&parsed.runs.iter().filter_map(pick).collect::<Vec<_>>())
    };
    Ok(Hydration {
        chromium: parsed.chromium.clone(),
        repetitions: parsed.runs.len(),
        errors: parsed.errors.clone(),
        cold_clickable_ms: spread(&|r| Some(r.cold.clickable_ms)),
        cold_card_visible_ms: spread(&|r| r.cold.card_ms),
        cold_wasm_loaded_ms: spread(&|r| r.cold.wasm_response_end_ms),
        cold_transfer_bytes: spread(&|r| r.cold.transfer_bytes),
        warm_clickable_ms: spread(&|r| Some(r.warm.clickable_ms)),
        warm_transfer_bytes: spread(&|r| r.warm.transfer_bytes),
        runs: parsed.runs,
    })
}

/// Both browser figures, on one fresh server.
pub async fn run(
    server_options: &ServerOptions,
    measure_assets: bool,
    hydration_settings: Option<&HydrationSettings>,
) -> Result<(Option<Vec<Asset>>, Option<Hydration>)> {
    let server = Server::start(server_options).await?;
    let sizes = if measure_assets {
        Some(assets(&server).await?)
    } else {
        None
    };
    let timings = match hydration_settings {
        Some(settings) => Some(hydration(&server, settings).await?),
        None => None,
    };
    server.stop().await?;
    Ok((sizes, timings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linked_files_are_found_in_the_html() {
        let html = r#"<link rel="icon" href="/favicon.svg"><link rel="modulepreload" href="/pkg/toolgate.js">
            <a href="https://example.invalid/x">x</a><script src="/pkg/toolgate.js"></script>"#;
        assert_eq!(linked_paths(html), ["/favicon.svg", "/pkg/toolgate.js"]);
        assert_eq!(kind("/pkg/toolgate.wasm"), "wasm");
        assert_eq!(kind("/"), "html");
    }
}
