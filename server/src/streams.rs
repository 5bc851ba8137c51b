//! How many event streams one client may hold open at once. A client is the address its connection comes from
//! (behind a reverse proxy, the proxy's), an IPv6 one by its /64 ([`ClientAddr::counted`]). Past the bound a new stream is refused with a 429 before anything starts;
//! the streams already open are not touched.
//!
//! This is a count per client, taken before a stream starts and given back when the stream ends or its
//! connection closes. No well-kept crate bounds concurrent response bodies per key: tower's `ConcurrencyLimit`
//! counts requests while their handler runs, for all clients at once, and rate limiters count arrivals.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::Poll;

use futures::{Stream, StreamExt};
use parking_lot::{Mutex, MutexGuard};

pub use crate::client::ClientAddr;
use crate::error::ApiError;

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
        let client = client.counted();
        let mut open = lock(&self.open);
        let count = open.entry(client).or_insert(0);
        if *count >= self.per_client {
            return Err(ApiError::TooManyStreams {
                limit: self.per_client,
            });
        }
        *count += 1;
        Ok(StreamPermit {
            client,
            open: Arc::clone(&self.open),
        })
    }

    /// How many streams `client` holds open.
    pub fn open(&self, client: ClientAddr) -> usize {
        lock(&self.open)
            .get(&client.counted())
            .copied()
            .unwrap_or(0)
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
        assert_eq!(limit.open(one), 1);
        let _again = limit.acquire(one).unwrap();
    }

    /// One host has a whole /64 to pick addresses from: a new address for each stream gets it no more of them.
    #[test]
    fn the_addresses_of_one_ipv6_64_are_one_client() {
        let limit = StreamLimit::new(2);
        let from = |address: &str| ClientAddr(address.parse().unwrap());
        let _first = limit.acquire(from("2001:db8::1")).unwrap();
        let _second = limit.acquire(from("2001:db8::2")).unwrap();
        assert!(matches!(
            limit.acquire(from("2001:db8::3")),
            Err(ApiError::TooManyStreams { limit: 2 })
        ));
        assert_eq!(limit.open(from("2001:db8::ffff")), 2);
        let _elsewhere = limit.acquire(from("2001:db8:0:1::1")).unwrap();
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
        assert_eq!(limit.open(client), 0);
        let pending = holding(
            futures::stream::pending::<u8>(),
            limit.acquire(client).unwrap(),
        );
        assert_eq!(limit.open(client), 1);
        drop(pending);
        assert_eq!(limit.open(client), 0);
    }
}
