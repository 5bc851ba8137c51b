//! Change notifications by key (a run, a session), for the readers of this process.
//!
//! A reader subscribes to a key's channel and re-reads the store whenever it changes; the channel carries only a
//! number, never data, so a missed notification costs a read, never an event. Channels exist while someone
//! listens: a key nobody watches costs nothing.

use std::collections::HashMap;
use std::hash::Hash;

use parking_lot::Mutex;
use tokio::sync::watch;

pub struct Watches<K> {
    channels: Mutex<HashMap<K, watch::Sender<u64>>>,
}

impl<K: Eq + Hash + Clone> Default for Watches<K> {
    fn default() -> Self {
        Self {
            channels: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone> Watches<K> {
    /// A receiver that changes whenever `key` is notified.
    pub fn watch(&self, key: &K) -> watch::Receiver<u64> {
        let mut channels = self.channels.lock();
        if let Some(sender) = channels.get(key) {
            return sender.subscribe();
        }
        // Forget channels nobody listens to any more, now and then: when the map doubles.
        if channels.len() >= 64 && channels.len().is_power_of_two() {
            channels.retain(|_, sender| sender.receiver_count() > 0);
        }
        let (sender, receiver) = watch::channel(0);
        channels.insert(key.clone(), sender);
        receiver
    }

    /// Wakes whoever watches `key`, with a new value.
    pub fn notify(&self, key: &K, value: u64) {
        let mut channels = self.channels.lock();
        if let Some(sender) = channels.get(key) {
            if sender.receiver_count() == 0 {
                channels.remove(key);
            } else {
                sender.send_replace(value);
            }
        }
    }

    /// Wakes every watcher (they re-read, and find what changed): after a notification from another instance may
    /// have been lost.
    #[cfg_attr(not(feature = "sql"), allow(dead_code))]
    pub fn notify_all(&self) {
        let channels = self.channels.lock();
        for sender in channels.values() {
            sender.send_modify(|value| *value = value.wrapping_add(1));
        }
    }

    /// How many keys are watched.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.channels.lock().len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_sees_the_newest_value_and_an_unwatched_key_costs_nothing() {
        let watches: Watches<&str> = Watches::default();
        watches.notify(&"nobody", 1);
        assert!(watches.is_empty());
        let mut receiver = watches.watch(&"run");
        watches.notify(&"run", 3);
        assert!(receiver.has_changed().unwrap());
        assert_eq!(*receiver.borrow_and_update(), 3);
        drop(receiver);
        watches.notify(&"run", 4);
        assert!(watches.is_empty(), "a channel nobody listens to goes");
    }
}
