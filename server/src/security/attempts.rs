//! Wrong access tokens per client address, so that a token cannot be guessed at network speed through
//! `Authorization: Bearer` any more than through the login form.
//!
//! An address may send a few wrong tokens at once, then one more every while (the login form's allowance). While it
//! has none left, its requests with a token are refused before the token is looked at: a guess then cannot be told
//! right or wrong. Requests with the right token, and an address's cookie, are not counted.
//!
//! Not `tower_governor`, which limits the login form: its limiters count every request they are asked about, and
//! here only wrong tokens count, so the allowance must be looked at without using it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::client::counted_as;

/// Wrong tokens an address may send at once.
pub const BURST: u32 = 5;
/// How often an address that used its allowance gets one more try.
pub const REFILL: Duration = Duration::from_secs(12);
/// Past this many clients, those back to a full allowance are forgotten (at most once a second).
const REMEMBERED: usize = 1_024;
/// The most clients remembered at once: past it, after a sweep, the allowances start over (a flood from that
/// many addresses gets that many guesses anyway).
const MOST: usize = 65_536;

/// Each address's allowance, as the time at which it is whole again (a generic cell rate: each wrong token moves it
/// one `REFILL` later; an address may try while it is at most `BURST - 1` refills ahead of now).
#[derive(Debug, Default)]
pub struct WrongTokens {
    clients: Mutex<Clients>,
}

#[derive(Debug, Default)]
struct Clients {
    whole_at: HashMap<IpAddr, Instant>,
    swept: Option<Instant>,
}

impl WrongTokens {
    /// Whether `client` may try a token now; if not, how long until it may.
    pub fn may_try(&self, client: IpAddr, now: Instant) -> Result<(), Duration> {
        let clients = self.clients.lock();
        match clients.whole_at.get(&counted_as(client)) {
            Some(&at) => {
                let ahead = at.saturating_duration_since(now);
                let allowed = REFILL * (BURST - 1);
                if ahead > allowed {
                    Err(ahead - allowed)
                } else {
                    Ok(())
                }
            }
            None => Ok(()),
        }
    }

    /// Counts a wrong token from `client`.
    pub fn failed(&self, client: IpAddr, now: Instant) {
        let client = counted_as(client);
        let mut clients = self.clients.lock();
        let Clients { whole_at, swept } = &mut *clients;
        if whole_at.len() >= REMEMBERED
            && !whole_at.contains_key(&client)
            && swept.is_none_or(|at| now.saturating_duration_since(at) >= Duration::from_secs(1))
        {
            whole_at.retain(|_, at| *at > now);
            *swept = Some(now);
            if whole_at.len() >= MOST {
                whole_at.clear();
            }
        }
        let at = whole_at.entry(client).or_insert(now);
        *at = (*at).max(now) + REFILL;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_a_few_tries_then_one_every_refill() {
        let wrong = WrongTokens::default();
        let (client, other) = ([192, 0, 2, 1].into(), [192, 0, 2, 2].into());
        let start = Instant::now();
        for _ in 0..BURST {
            assert_eq!(wrong.may_try(client, start), Ok(()));
            wrong.failed(client, start);
        }
        assert_eq!(wrong.may_try(client, start), Err(REFILL));
        assert_eq!(wrong.may_try(other, start), Ok(()), "another address");
        let later = start + REFILL;
        assert_eq!(wrong.may_try(client, later), Ok(()));
        wrong.failed(client, later);
        assert!(wrong.may_try(client, later).is_err());
        assert_eq!(wrong.may_try(client, later + REFILL * (BURST + 1)), Ok(()));
    }

    #[test]
    fn addresses_back_to_a_whole_allowance_are_forgotten() {
        let wrong = WrongTokens::default();
        let start = Instant::now();
        for i in 0..REMEMBERED as u32 {
            wrong.failed(IpAddr::from(i.to_be_bytes()), start);
        }
        wrong.failed([198, 51, 100, 1].into(), start + REFILL * 2);
        assert_eq!(wrong.clients.lock().whole_at.len(), 1);
    }

    /// One host has a whole IPv6 /64 to pick addresses from: they count as one client.
    #[test]
    fn the_addresses_of_one_ipv6_network_are_one_client() {
        let wrong = WrongTokens::default();
        let start = Instant::now();
        for host in 0..BURST as u16 {
            let address = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, host + 1);
            wrong.failed(address.into(), start);
        }
        let neighbour = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0xffff, 0, 0, 9);
        assert!(wrong.may_try(neighbour.into(), start).is_err());
        let elsewhere = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 2, 0, 0, 0, 1);
        assert_eq!(wrong.may_try(elsewhere.into(), start), Ok(()));
    }
}
