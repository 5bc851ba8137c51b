//! Accepting connections and serving HTTP/1.1 on them, tuned for many long-lived event streams.
//!
//! `axum::serve` would do, but it leaves three costs that matter here: it does not set `TCP_NODELAY` (so the first
//! small SSE event of a run waits for the client's delayed ACK, about 40 ms), it rebuilds the router for every
//! connection (about 15 KiB each), and it does not bound hyper's buffers (which grow to 16 KiB a side on an idle
//! stream). With 10,000 open streams those are hundreds of MiB. This loop serves the one router it was given, sets
//! `TCP_NODELAY`, keeps hyper's buffers at their minimum, times out clients that never finish their headers, tells
//! each request its client's address (as axum's `ConnectInfo`), and shuts down gracefully.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// The smallest buffer hyper allows, per direction and connection.
const BUFFER_BYTES: usize = 8 * 1024;
/// A client gets this long to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `router` on `listener` until `stop` resolves, then stops accepting and lets open connections finish
/// their current response, for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    stop: impl Future<Output = ()>,
    grace: Duration,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.max_buf_size(BUFFER_BYTES)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);

    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, or a connection reset before it was accepted: back off a little
                    // rather than spin, and keep serving.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        // Each request knows its client's address: login attempts and open streams are bounded per client.
        let service = router
            .clone()
            .map_request(move |request: Request<Incoming>| {
                let mut request = request.map(Body::new);
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            });
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::trace!(%error, "connection ended with an error");
            }
        });
    }

    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the grace period; exiting anyway");
    }
}
