//! The compiled steps a session keeps, one per step shape: once their buffers pass a byte
//! budget, the least recently used go (a server meets a new row count with almost every mix
//! of prompts and running jobs, and a step of many rows holds hundreds of megabytes).

use std::collections::HashMap;
use std::hash::Hash;

/// Entries with their sizes, dropped least recently used first beyond a byte budget.
pub struct StepCache<K, V> {
    entries: HashMap<K, Entry<V>>,
    budget: u64,
    bytes: u64,
    /// Counts uses; an entry's `last_use` is the count at its last use.
    clock: u64,
}

struct Entry<V> {
    value: V,
    bytes: u64,
    last_use: u64,
}

impl<K: Copy + Eq + Hash, V> StepCache<K, V> {
    /// An empty cache that keeps at most `budget` bytes of entries beyond the newest.
    pub fn new(budget: u64) -> Self {
        StepCache {
            entries: HashMap::new(),
            budget,
            bytes: 0,
            clock: 0,
        }
    }

    /// The entry for `key`, without counting a use.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|entry| &entry.value)
    }

    /// Counts a use of `key`'s entry; false where there is none.
    pub fn touch(&mut self, key: &K) -> bool {
        self.clock += 1;
        match self.entries.get_mut(key) {
            Some(entry) => {
                entry.last_use = self.clock;
                true
            }
            None => false,
        }
    }

    /// Adds `value` (holding `bytes`) as just used, then drops the least recently used
    /// others until the entries fit the budget, sparing those `pinned` says must stay (the
    /// new one always stays, even alone above the budget). Returns the dropped keys.
    pub fn insert(&mut self, key: K, value: V, bytes: u64, pinned: impl Fn(&K) -> bool) -> Vec<K> {
        self.clock += 1;
        let entry = Entry {
            value,
            bytes,
            last_use: self.clock,
        };
        if let Some(old) = self.entries.insert(key, entry) {
            self.bytes -= old.bytes;
        }
        self.bytes += bytes;
        self.shrink(|k| *k == key || pinned(k))
    }

    /// Sets the budget and drops entries as [`StepCache::insert`] does (sparing the most
    /// recently used one and those `pinned`). Returns the dropped keys.
    pub fn set_budget(&mut self, budget: u64, pinned: impl Fn(&K) -> bool) -> Vec<K> {
        self.budget = budget;
        let newest = self.entries.iter().max_by_key(|(_, e)| e.last_use).map(|(k, _)| *k);
        self.shrink(|k| Some(*k) == newest || pinned(k))
    }

    fn shrink(&mut self, spared: impl Fn(&K) -> bool) -> Vec<K> {
        let mut dropped = Vec::new();
        while self.bytes > self.budget {
            let oldest = self
                .entries
                .iter()
                .filter(|(k, _)| !spared(k))
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| *k);
            let Some(oldest) = oldest else { break };
            if let Some(entry) = self.entries.remove(&oldest) {
                self.bytes -= entry.bytes;
            }
            dropped.push(oldest);
        }
        dropped
    }

    /// How many entries are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The bytes the kept entries hold.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_the_least_recently_used_beyond_the_budget() {
        let mut cache = StepCache::new(100);
        assert!(cache.insert(1, "a", 40, |_| false).is_empty());
        assert!(cache.insert(2, "b", 40, |_| false).is_empty());
        assert!(cache.touch(&1));
        // 120 bytes: 2 is the least recently used.
        assert_eq!(cache.insert(3, "c", 40, |_| false), vec![2]);
        assert_eq!((cache.len(), cache.bytes()), (2, 80));
        assert_eq!(cache.get(&1), Some(&"a"));
        assert_eq!(cache.get(&2), None);
        assert!(!cache.touch(&2));
    }

    #[test]
    fn keeps_the_newest_and_the_pinned_even_above_the_budget() {
        let mut cache = StepCache::new(50);
        cache.insert(1, "a", 40, |_| false);
        cache.insert(2, "b", 40, |_| false);
        assert_eq!(cache.get(&1), None, "one entry over the budget goes");
        // Pinned, 2 stays; the new entry stays alone above the budget too.
        assert!(cache.insert(3, "c", 200, |k| *k == 2).is_empty());
        assert_eq!((cache.len(), cache.bytes()), (2, 240));
        assert_eq!(cache.set_budget(0, |_| false), vec![2]);
        assert_eq!((cache.len(), cache.bytes()), (1, 200));
        assert_eq!(cache.get(&3), Some(&"c"));
    }

    #[test]
    fn replacing_an_entry_counts_its_bytes_once() {
        let mut cache = StepCache::new(100);
        cache.insert(1, "a", 60, |_| false);
        cache.insert(1, "b", 70, |_| false);
        assert_eq!((cache.len(), cache.bytes()), (1, 70));
        assert_eq!(cache.get(&1), Some(&"b"));
    }
}
