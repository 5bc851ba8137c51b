//! How many event streams one client may hold open at once. A client is the address its connection comes from
//! (behind a reverse proxy, the proxy's). Past the bound a new stream is refused with a 429 before anything starts;
//! the streams already open are not touched.
//!
//! This is a count per address, taken before a stream starts and given back when the stream ends or its
//! connection closes. No well-kept crate bounds concurrent response bodies per key: tower's `ConcurrencyLimit`
//! counts requests while their handler runs, for all clients at once, and rate limiters count arrivals.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::task::Poll;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use futures::{Stream, StreamExt};
use parking_lot::{Mutex, MutexGuard};

use crate::error::ApiError;

/// The address a request comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientAddr(pub IpAddr);

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // The serve loop records every connection's peer; a router served some other way (a test calling it
        // directly) has one client.
        Ok(Self(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |info| info.0.ip()),
        ))
    }
}

type OpenCounts = Arc<Mutex<HashMap<IpAddr, usize>>>;

fn lock(open: &OpenCounts) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
    open.lock()
}

/// The open streams of every client, and how many one client may have.
#[derive(Clone, Debug)]
pub struct StreamLimit {
    per_client: usize,
    open: OpenCounts,
}

/// One open stream of a client; dropping it gives the place back.
#[derive(Debug)]
pub struct StreamPermit {
    client: IpAddr,
    open: OpenCounts,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = lock(&self.open);
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

impl StreamLimit {
    pub fn new(per_client: usize) -> Self {
        Self {
            per_client,
            open: Arc::default(),
        }
    }

    /// A place for one more stream of `client`, or a 429 when it holds as many as it may.
    pub fn acquire(&self, client: ClientAddr) -> Result<StreamPermit, ApiError> {
        let mut open = lock(&self.open);
        let count = open.entry(client.0).or_insert(0);
        if *count >= self.per_client {
            return Err(ApiError::TooManyStreams {
                limit: self.per_client,
            });
        }
        *count += 1;
        Ok(StreamPermit {
            client: client.0,
            open: Arc::clone(&self.open),
        })
    }

    /// How many streams `client` holds open.
    pub fn open(&self, client: IpAddr) -> usize {
        lock(&self.open).get(&client).copied().unwrap_or(0)
    }
}

/// `events`, holding `permit` until they end or are dropped (the client went away). The place is given back before
/// the end of the stream reaches the client, so a client that saw its stream end can open another at once.
pub fn holding<S: Stream + Send + 'static>(
    events: S,
    permit: StreamPermit,
) -> impl Stream<Item = S::Item> + Send + 'static {
    let mut permit = Some(permit);
    events.chain(futures::stream::poll_fn(move |_| {
        permit.take();
        Poll::Ready(None)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_holds_at_most_its_bound_and_others_are_not_counted() {
        let limit = StreamLimit::new(2);
        let one = ClientAddr("127.0.0.1".parse().unwrap());
        let two = ClientAddr("127.0.0.2".parse().unwrap());
        let first = limit.acquire(one).unwrap();
        let _second = limit.acquire(one).unwrap();
        assert!(matches!(
            limit.acquire(one),
            Err(ApiError::TooManyStreams { limit: 2 })
        ));
        let _other = limit.acquire(two).unwrap();
        drop(first);
        assert_eq!(limit.open(one.0), 1);
        let _again = limit.acquire(one).unwrap();
    }

    #[tokio::test]
    async fn the_place_is_given_back_when_the_stream_ends_or_is_dropped() {
        let limit = StreamLimit::new(1);
        let client = ClientAddr("127.0.0.1".parse().unwrap());
        let events = holding(
            futures::stream::iter([1, 2]),
            limit.acquire(client).unwrap(),
        );
        assert_eq!(events.collect::<Vec<_>>().await, [1, 2]);
        assert_eq!(limit.open(client.0), 0);
        let pending = holding(
            futures::stream::pending::<u8>(),
            limit.acquire(client).unwrap(),
        );
        assert_eq!(limit.open(client.0), 1);
        drop(pending);
        assert_eq!(limit.open(client.0), 0);
    }
}
