//! The small in-memory maps of the cold cache: [`Lru`] (parsed footers, decoded row
//! groups: least recently used first out, weighed in bytes) and [`InFlight`] (the fetches
//! and decodes under way, shared by everyone who asks meanwhile).

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;

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

/// Work under way, by key: whoever asks for a key while its work runs waits for that work
/// instead of doing it again.
pub(crate) struct InFlight<K, V> {
    cells: Mutex<HashMap<K, Arc<tokio::sync::OnceCell<Arc<V>>>>>,
}

impl<K: Hash + Eq + Clone, V> InFlight<K, V> {
    pub(crate) fn new() -> Self {
        InFlight {
            cells: Mutex::new(HashMap::new()),
        }
    }

    /// The outcome of `work` for `key`, run by the first to ask while none runs. The first
    /// to finish retires the key's entry and, on a success, hands it to `keep` before anyone
    /// can ask again (so a caller finds it kept or under way, never neither). A failure is
    /// not kept: the next to ask runs `work` again.
    pub(crate) async fn run<E, Fut>(
        &self,
        key: &K,
        work: impl FnOnce() -> Fut,
        keep: impl FnOnce(&Arc<V>),
    ) -> Result<Arc<V>, E>
    where
        Fut: Future<Output = Result<Arc<V>, E>>,
    {
        let cell = self.cells.lock().entry(key.clone()).or_default().clone();
        let result = cell.get_or_try_init(work).await.cloned();
        let mut cells = self.cells.lock();
        if cells.get(key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            cells.remove(key);
            if let Ok(v) = &result {
                keep(v);
            }
        }
        result
    }
}
