//! The small in-memory maps of the cold cache (parsed footers, indexed row groups for
//! sequential readers): least recently used first out, weighed in bytes.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

/// A small least-recently-used map, weighed in bytes. Linear eviction is fine: it holds
/// tens of entries.
pub(crate) struct Lru<K, V> {
    entries: HashMap<K, (Arc<V>, u64, usize)>,
    tick: u64,
    weight: usize,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Lru {
            entries: HashMap::new(),
            tick: 0,
            weight: 0,
            capacity,
        }
    }

    pub(crate) fn get(&mut self, k: &K) -> Option<Arc<V>> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(k).map(|e| {
            e.1 = tick;
            e.0.clone()
        })
    }

    pub(crate) fn insert(&mut self, k: K, v: Arc<V>, weight: usize) {
        self.tick += 1;
        if let Some(old) = self.entries.insert(k, (v, self.tick, weight)) {
            self.weight -= old.2;
        }
        self.weight += weight;
        while self.weight > self.capacity && self.entries.len() > 1 {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.1)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest
                && let Some(e) = self.entries.remove(&k)
            {
                self.weight -= e.2;
            }
        }
    }

    pub(crate) fn remove_where(&mut self, mut f: impl FnMut(&K) -> bool) {
        let gone: Vec<K> = self.entries.keys().filter(|k| f(k)).cloned().collect();
        for k in gone {
            if let Some(e) = self.entries.remove(&k) {
                self.weight -= e.2;
            }
        }
    }
}
