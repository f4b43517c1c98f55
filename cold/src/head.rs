//! An object's first bytes, fetched beside its footer when a reader is about to start at
//! the object's beginning (a replay from its first offset, or read-ahead crossing into it),
//! so that its first row group arrives after one round trip to the store instead of two
//! (the footer, then the row group it names).
//!
//! Before the footer arrives nobody knows where row groups end, so the head's length is a
//! guess: a little more than one row group as objects are written (`tier_row_group_bytes`
//! of input, about as many bytes once in Parquet). Its bytes then serve every row group
//! they reach: a row group inside the head costs no GET, one that starts in the head and
//! ends past it fetches only its rest. A guess too long therefore fetches nothing twice, and
//! one too short costs a second, smaller GET for the rest of the first row group.
//!
//! Memory: a head is dropped once the row group reaching its end (or the object's last
//! row group) has been taken from it, and at most [`MAX_HEADS`] are held at once (the
//! oldest goes first; its row groups are then fetched whole).

use std::collections::VecDeque;
use std::ops::Range;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use parking_lot::Mutex;

use crate::ranged::split_get;
use crate::store::TierStore;

/// Heads held at once, across all readers (each up to `len` bytes).
const MAX_HEADS: usize = 8;

type HeadFetch = Shared<BoxFuture<'static, Option<Bytes>>>;

/// The heads being fetched or not yet used up, by object id.
pub(crate) struct Heads {
    len: u64,
    heads: Mutex<VecDeque<(String, HeadFetch)>>,
}

impl Heads {
    /// Heads of `len` bytes; 0 turns the speculative fetch off.
    pub(crate) fn new(len: u64) -> Heads {
        Heads {
            len,
            heads: Mutex::new(VecDeque::new()),
        }
    }

    /// Starts fetching the first bytes of object `id` (`key`, `size` bytes), unless they
    /// are already held or being fetched.
    pub(crate) fn start(&self, store: &TierStore, id: String, key: &str, size: u64) {
        let len = self.len.min(size);
        if len == 0 {
            return;
        }
        let mut heads = self.heads.lock();
        if heads.iter().any(|(k, _)| *k == id) {
            return;
        }
        let (store, key) = (store.clone(), key.to_owned());
        let fetch = async move {
            match split_get(&store, &key, 0..len).await {
                Ok(bytes) => Some(bytes),
                // The row groups are then fetched on their own, which reports the error
                // if it persists.
                Err(e) => {
                    tracing::debug!(key, error = %e, "speculative fetch of an object's head failed");
                    None
                }
            }
        }
        .boxed()
        .shared();
        // Driven to completion even before a reader waits for it.
        tokio::spawn(fetch.clone());
        heads.push_back((id, fetch));
        while heads.len() > MAX_HEADS {
            heads.pop_front();
        }
    }

    /// What the head of object `id` holds of `range`: the range's first bytes, up to the
    /// head's end, once the head has arrived (waiting for it if it is on its way). `None`
    /// if no head of the object is held or it does not reach `range.start`. `last` is the
    /// end of the object's last row group: taking a range that reaches it, or the head's
    /// end, uses the head up and drops it.
    pub(crate) async fn take(&self, id: &str, range: Range<u64>, last: u64) -> Option<Bytes> {
        if range.start >= self.len {
            return None;
        }
        let fetch = {
            let heads = self.heads.lock();
            heads.iter().find(|(k, _)| k == id)?.1.clone()
        };
        let head = fetch.clone().await;
        let end = head.as_ref().map_or(0, |h| h.len() as u64);
        if head.is_none() || range.end >= end.min(last) {
            self.heads
                .lock()
                .retain(|(k, f)| !(k == id && f.ptr_eq(&fetch)));
        }
        let head = head?;
        (range.start < end).then(|| head.slice(range.start as usize..range.end.min(end) as usize))
    }

    /// Heads held or being fetched now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.heads.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreConfig;

    async fn store_with(key: &str, data: &[u8]) -> TierStore {
        let store = TierStore::open(&StoreConfig {
            url: "memory://".into(),
            ..StoreConfig::default()
        })
        .await
        .expect("memory store");
        store
            .put(key, Bytes::copy_from_slice(data))
            .await
            .expect("put");
        store
    }

    /// A head serves the row groups it reaches, whole or as a prefix, and is dropped once
    /// the range reaching its end is taken; a range past it, or of another object, gets
    /// nothing.
    #[tokio::test]
    async fn a_head_serves_the_ranges_it_reaches_then_is_dropped() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        let store = store_with("o", &data).await;
        let heads = Heads::new(3_000);
        heads.start(&store, "o@1".into(), "o", data.len() as u64);
        heads.start(&store, "o@1".into(), "o", data.len() as u64);
        assert_eq!(heads.held(), 1, "one head per object");
        assert_eq!(heads.take("other", 4..100, 9_000).await, None);
        let whole = heads.take("o@1", 4..1_000, 9_000).await.expect("inside");
        assert_eq!(&whole[..], &data[4..1_000]);
        assert_eq!(heads.held(), 1);
        assert_eq!(heads.take("o@1", 3_000..4_000, 9_000).await, None);
        let prefix = heads
            .take("o@1", 1_000..5_000, 9_000)
            .await
            .expect("prefix");
        assert_eq!(&prefix[..], &data[1_000..3_000]);
        assert_eq!(heads.held(), 0, "used up");
        assert_eq!(heads.take("o@1", 1_000..2_000, 9_000).await, None);
    }

    /// An object smaller than the head is fetched whole; the head is dropped once its last
    /// row group is taken.
    #[tokio::test]
    async fn a_small_object_is_one_head_dropped_after_its_last_row_group() {
        let data = vec![7u8; 500];
        let store = store_with("s", &data).await;
        let heads = Heads::new(3_000);
        heads.start(&store, "s@1".into(), "s", data.len() as u64);
        assert_eq!(
            heads.take("s@1", 4..200, 400).await.as_deref(),
            Some(&data[4..200])
        );
        assert_eq!(heads.held(), 1);
        assert_eq!(
            heads.take("s@1", 200..400, 400).await.as_deref(),
            Some(&data[200..400])
        );
        assert_eq!(heads.held(), 0);
    }

    /// Never more than MAX_HEADS held: the oldest is dropped.
    #[tokio::test]
    async fn heads_are_bounded() {
        let store = store_with("b", &[1u8; 100]).await;
        let heads = Heads::new(50);
        for i in 0..MAX_HEADS + 3 {
            heads.start(&store, format!("b@{i}"), "b", 100);
        }
        assert_eq!(heads.held(), MAX_HEADS);
        assert_eq!(heads.take("b@0", 4..10, 90).await, None, "dropped");
        assert!(
            heads
                .take(&format!("b@{}", MAX_HEADS + 2), 4..10, 90)
                .await
                .is_some()
        );
    }
}
