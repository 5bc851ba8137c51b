//! The site's static files (wasm, js, css, public files), embedded in the release binary.
//!
//! Release builds carry every file of `target/site`, with the brotli and gzip copies cargo-leptos precompressed;
//! a browser that accepts one of those encodings gets it. Debug builds read the same folder from disk, so
//! `cargo leptos watch` serves fresh files.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use rust_embed::Embed;

#[derive(Embed)]
#[folder = "../target/site"]
#[allow_missing = true]
struct Site;

/// The encodings we have precompressed copies for, best first.
const ENCODINGS: [(&str, &str); 2] = [("br", ".br"), ("gzip", ".gz")];

fn accepts(headers: &HeaderMap, encoding: &str) -> bool {
    headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value.split(',').any(|part| {
                let mut pieces = part.split(';');
                let name = pieces.next().unwrap_or("").trim();
                let refused = pieces.any(|p| p.trim().replace(' ', "") == "q=0");
                name.eq_ignore_ascii_case(encoding) && !refused
            })
        })
}

/// Serves a file of the site, or 404.
pub async fn static_file(uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path().trim_start_matches('/');
    if path.is_empty() || path.ends_with(".br") || path.ends_with(".gz") {
        return not_found();
    }
    let Some(original) = Site::get(path) else {
        return not_found();
    };
    let mime = mime_guess::from_path(path)
        .first_or_octet_stream()
        .to_string();
    let hash = hex::encode(original.metadata.sha256_hash());
    let compressed = ENCODINGS.iter().find_map(|&(encoding, suffix)| {
        accepts(&headers, encoding)
            .then(|| Site::get(&format!("{path}{suffix}")))
            .flatten()
            .map(|file| (encoding, suffix, file))
    });
    // Each representation has its own tag, so a cache never mixes encodings.
    let etag = format!(
        "\"{hash}{}\"",
        compressed.as_ref().map_or("", |(_, suffix, _)| *suffix)
    );

    let mut response_headers = HeaderMap::new();
    response_headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    // The file names carry no hash: the browser revalidates, and an unchanged file costs a 304.
    response_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(&mime) {
        response_headers.insert(header::CONTENT_TYPE, value);
    }
    if let Ok(value) = HeaderValue::from_str(&etag) {
        response_headers.insert(header::ETAG, value);
    }
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.split(',').any(|tag| tag.trim() == etag));
    if unchanged {
        return (StatusCode::NOT_MODIFIED, response_headers).into_response();
    }
    let body = match compressed {
        Some((encoding, _, file)) => {
            response_headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(encoding));
            file.data
        }
        None => original.data,
    };
    (
        StatusCode::OK,
        response_headers,
        Body::from(body.into_owned()),
    )
        .into_response()
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not found").into_response()
}

/// Every embedded file, for a log line at start-up.
pub fn file_count() -> usize {
    Site::iter().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_is_read_with_its_q_values() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip, deflate, br;q=0"),
        );
        assert!(accepts(&headers, "gzip"));
        assert!(!accepts(&headers, "br"));
        assert!(!accepts(&HeaderMap::new(), "gzip"));
    }
}
