//! A store that answers GETs as a distant one would: each GET waits a first-byte latency
//! (plus jitter) and then delivers its body no faster than a per-request bandwidth. It is a
//! benchmark and test tool, not a production setting: the broker accepts it only with
//! `FELIX_FAULT_INJECTION=1` (`object_store_get_latency_ms`, `object_store_get_jitter_ms`,
//! `object_store_get_bytes_per_sec`).
//!
//! It sits *under* the guard, so the simulated time counts against each attempt's timeout
//! and holds a concurrency permit, as a real slow GET does. Only GETs are slowed (HEADs,
//! listings, PUTs and deletes pass straight through): cold reads are what it is for.
//!
//! It lives in felix-cold rather than with the test doubles of felix-testkit because a
//! benchmark runs the real broker binary, which must not link the test kit.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

/// Bytes delivered per paced chunk: small enough that a reader sees a steady trickle,
/// large enough that the timer is not the bottleneck.
const CHUNK: usize = 256 * 1024;

/// How a simulated distant store answers GETs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimulatedLatency {
    /// Time to the first byte of every GET.
    pub first_byte: Duration,
    /// Up to this much more, uniformly drawn per GET (a tail).
    pub jitter: Duration,
    /// Bytes per second one GET delivers after its first byte; 0 is unlimited.
    pub bytes_per_sec: u64,
}

impl SimulatedLatency {
    /// Whether it changes anything.
    pub fn is_active(&self) -> bool {
        !self.first_byte.is_zero() || !self.jitter.is_zero() || self.bytes_per_sec > 0
    }

    fn transfer_time(&self, bytes: usize) -> Duration {
        if self.bytes_per_sec == 0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec as f64)
    }
}

/// `inner` with [`SimulatedLatency`] applied to its GETs.
#[derive(Debug)]
pub(super) struct SimulatedStore {
    inner: Arc<dyn ObjectStore>,
    latency: SimulatedLatency,
    /// Seed of the jitter draws (splitmix64 over a counter: no RNG dependency needed).
    draws: AtomicU64,
}

impl SimulatedStore {
    pub(super) fn new(inner: Arc<dyn ObjectStore>, latency: SimulatedLatency) -> SimulatedStore {
        SimulatedStore {
            inner,
            latency,
            draws: AtomicU64::new(0x5eed),
        }
    }

    fn first_byte_delay(&self) -> Duration {
        let jitter = self.latency.jitter.as_micros() as u64;
        let extra = if jitter == 0 {
            0
        } else {
            splitmix64(self.draws.fetch_add(1, Ordering::Relaxed)) % (jitter + 1)
        };
        self.latency.first_byte + Duration::from_micros(extra)
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl fmt::Display for SimulatedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Simulated({:?}, {})", self.latency, self.inner)
    }
}

#[async_trait]
impl ObjectStore for SimulatedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if options.head {
            return self.inner.get_opts(location, options).await;
        }
        tokio::time::sleep(self.first_byte_delay()).await;
        let mut result = self.inner.get_opts(location, options).await?;
        // Read the body from the real store at once (it is local: a file or loopback) and
        // hand it on paced, chunk by chunk, as a bandwidth-capped connection would.
        let payload = std::mem::replace(
            &mut result.payload,
            GetResultPayload::Stream(stream::empty().boxed()),
        );
        let whole = GetResult {
            payload,
            meta: result.meta.clone(),
            range: result.range.clone(),
            attributes: result.attributes.clone(),
            extensions: Default::default(),
        };
        let body = whole.bytes().await?;
        let latency = self.latency;
        // Each chunk is due when the bytes up to its end would have arrived, counted from
        // the first byte. Sleeping for each chunk's own transfer time instead adds the
        // timer's rounding and the task's wake-up per chunk: at 100 MB/s a 4 MiB GET took
        // 62-66 ms instead of 42 (about 65 MB/s); paced against the first byte it takes
        // 43-45 ms.
        let started = tokio::time::Instant::now();
        let chunks = (0..body.len().div_ceil(CHUNK)).map(move |i| {
            let end = ((i + 1) * CHUNK).min(body.len());
            (body.slice(i * CHUNK..end), end)
        });
        result.payload = GetResultPayload::Stream(
            stream::iter(chunks)
                .then(move |(chunk, end): (Bytes, usize)| async move {
                    tokio::time::sleep_until(started + latency.transfer_time(end)).await;
                    Ok(chunk)
                })
                .boxed(),
        );
        Ok(result)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    /// A GET takes at least the first-byte latency plus its size over the bandwidth, and
    /// returns exactly the stored bytes.
    #[tokio::test]
    async fn a_get_waits_its_latency_and_transfer_time_and_returns_the_bytes() {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let data = Bytes::from((0..600_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        inner
            .put(&Path::from("k"), data.clone().into())
            .await
            .expect("put");
        let latency = SimulatedLatency {
            first_byte: Duration::from_millis(50),
            jitter: Duration::from_millis(10),
            bytes_per_sec: 6_000_000,
        };
        let store = SimulatedStore::new(inner, latency);
        let started = std::time::Instant::now();
        let got = store
            .get_range(&Path::from("k"), 0..600_000)
            .await
            .expect("get");
        // 50 ms first byte + 100 ms of transfer, at least.
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert_eq!(got, data);
    }
}
