//! Ranged GETs a reader waits for: a large range is fetched as several parallel GETs,
//! because a bandwidth-capped store (S3 caps one connection at roughly 50–100 MB/s)
//! delivers each at its own rate, so the wait is one first-byte latency plus a fraction of
//! the transfer.

use std::ops::Range;

use bytes::Bytes;

use crate::error::ColdError;
use crate::store::TierStore;

/// A split fetch is split into parts of at least this size...
const SPLIT_PART_BYTES: u64 = 1 << 20;
/// ...and at most this many.
const SPLIT_PARTS: u64 = 4;

/// `range` of `key`, as up to [`SPLIT_PARTS`] parallel ranged GETs when it is large.
pub(crate) async fn split_get(
    store: &TierStore,
    key: &str,
    range: Range<u64>,
) -> Result<Bytes, ColdError> {
    let len = range.end - range.start;
    let parts = (len / SPLIT_PART_BYTES).clamp(1, SPLIT_PARTS);
    if parts == 1 {
        return Ok(store.get_range(key, range).await?);
    }
    let step = len.div_ceil(parts);
    let gets = (0..parts).map(|p| {
        let start = range.start + p * step;
        store.get_range(key, start..(start + step).min(range.end))
    });
    let pieces = futures::future::try_join_all(gets).await?;
    Ok(concat(&pieces, len as usize))
}

/// `pieces` one after the other, in one buffer of `len` bytes (their total).
pub(crate) fn concat(pieces: &[Bytes], len: usize) -> Bytes {
    let mut out = bytes::BytesMut::with_capacity(len);
    for piece in pieces {
        out.extend_from_slice(piece);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreConfig;

    /// A large range fetched as parallel parts comes back as exactly the range's bytes,
    /// in order, from one GET per part.
    #[tokio::test]
    async fn a_split_demand_fetch_reassembles_exactly_the_range() {
        let store = TierStore::open(&StoreConfig {
            url: "memory://".into(),
            ..StoreConfig::default()
        })
        .await
        .expect("memory store");
        let data: Vec<u8> = (0..(7u32 << 19)).map(|i| (i % 251) as u8).collect();
        store
            .put("k", Bytes::from(data.clone()))
            .await
            .expect("put");
        let range = 100..(data.len() as u64 - 7);
        let before = store.stats().gets;
        let got = split_get(&store, "k", range.clone()).await.expect("get");
        assert_eq!(&got[..], &data[range.start as usize..range.end as usize]);
        assert_eq!(
            store.stats().gets - before,
            3,
            "3.5 MiB: three parts of >= 1 MiB"
        );
        // A small range is one GET.
        let before = store.stats().gets;
        let got = split_get(&store, "k", 5..1000).await.expect("get");
        assert_eq!(&got[..], &data[5..1000]);
        assert_eq!(store.stats().gets - before, 1);
    }
}
