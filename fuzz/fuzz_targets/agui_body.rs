//! An AG-UI run's request body as the route reads it: straight into the input's fields when the body reads so,
//! else as a JSON value first. Whatever the bytes, both readings give the same input or the same refusal, and
//! nothing panics.

#![no_main]

use libfuzzer_sys::fuzz_target;
use server::agui::run_input::RunInput;
use server::body::JsonBody;
use server::error::ApiError;

fuzz_target!(|data: &[u8]| {
    let body = JsonBody(axum::body::Bytes::copy_from_slice(data));
    let read = RunInput::from_body(&body).map_err(|error| format!("{error:?}"));
    let by_value = body
        .value()
        .and_then(|value| RunInput::from_json(value).map_err(ApiError::Invalid))
        .map_err(|error| format!("{error:?}"));
    assert_eq!(read, by_value);
});
