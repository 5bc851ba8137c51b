//! Safe by default: nobody approves what they should not, bad input is refused, nothing is lost under races, and no
//! client makes the server hold more than its share. Each module proves one rule over real HTTP (or against the
//! real binary).

mod bad_input;
mod binary;
mod escaping;
mod limits;
mod origin;
mod races;
mod run_command;
mod sessions;
mod token;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use crate::helpers::TestApp;

/// An origin no page of toolgate has.
pub const EVIL: &str = "http://evil.example";

/// The origin of the server's own page: `http://{Host}`.
pub fn own_origin(app: &TestApp) -> String {
    format!("http://{}", app.addr)
}

/// Headers from name/value pairs.
pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).expect("a valid header name"),
            HeaderValue::from_str(value).expect("a valid header value"),
        );
    }
    map
}

/// A client that shows redirects instead of following them.
pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

/// The `error` text of a JSON refusal, after checking its shape.
pub async fn refusal(response: reqwest::Response, status: u16) -> String {
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.expect("a JSON body");
    assert_eq!(body["ok"], false, "{body}");
    body["error"].as_str().expect("an error message").to_owned()
}

/// Every pending approval on the server.
pub async fn pending(app: &TestApp) -> Vec<Value> {
    let body: Value = app
        .get("/api/agent/approvals")
        .await
        .json()
        .await
        .expect("JSON");
    body["pending"].as_array().expect("a list").clone()
}

/// Logs in through the form of the server at `origin` (`http://host:port`), as its own page does, and returns the
/// cookie pair (`name=value`) the server set.
pub async fn log_in_at(origin: &str, token: &str) -> String {
    let response = post_form(
        &no_redirects(),
        format!("{origin}/login"),
        &[("token", token)],
    )
    .header("origin", origin)
    .send()
    .await
    .unwrap();
    assert_eq!(response.status(), 303);
    assert_eq!(response.headers()["location"], "/");
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    cookie.split(';').next().unwrap().to_owned()
}

/// A POST of an HTML form's fields, `application/x-www-form-urlencoded`.
pub fn post_form(
    client: &reqwest::Client,
    url: String,
    fields: &[(&str, &str)],
) -> reqwest::RequestBuilder {
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish();
    client
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
}
