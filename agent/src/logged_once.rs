//! A condition that a periodic look meets again and again (a row this version cannot read, found by every sweep),
//! logged as an error the first time and at debug level after.

use std::collections::HashSet;
use std::hash::Hash;

use parking_lot::Mutex;

/// The keys already logged. It holds at most [`LoggedOnce::CAP`] of them: past that it starts over, and each is
/// logged once more, so that what it remembers stays bounded whatever it meets.
pub(crate) struct LoggedOnce<K> {
    seen: Mutex<HashSet<K>>,
}

impl<K> Default for LoggedOnce<K> {
    fn default() -> Self {
        Self {
            seen: Mutex::new(HashSet::new()),
        }
    }
}

impl<K: Eq + Hash> LoggedOnce<K> {
    const CAP: usize = 4096;

    /// Whether `key` is met for the first time (to be logged as an error), remembering it.
    pub(crate) fn first(&self, key: K) -> bool {
        let mut seen = self.seen.lock();
        if seen.len() >= Self::CAP {
            seen.clear();
        }
        seen.insert(key)
    }

    /// Forgets `key`, once what it stood for is over.
    pub(crate) fn forget(&self, key: &K) {
        self.seen.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::LoggedOnce;

    #[test]
    fn a_key_is_first_once_until_it_is_forgotten_and_what_is_held_stays_bounded() {
        let logged = LoggedOnce::default();
        assert!(logged.first(1));
        assert!(!logged.first(1));
        logged.forget(&1);
        assert!(logged.first(1));
        for key in 2..=LoggedOnce::<u32>::CAP as u32 {
            assert!(logged.first(key));
        }
        assert!(logged.first(0), "past the cap it starts over");
        assert!(logged.first(1), "and logs each once more");
        assert!(logged.seen.lock().len() <= LoggedOnce::<u32>::CAP);
    }
}
