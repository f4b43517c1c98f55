//! An object store that fails on demand, for tests of what the tier does when its store
//! misbehaves in ways a real server cannot be made to: down, hanging, slow, failing the next
//! few GETs or PUTs, or storing a PUT but losing the answer.
//!
//! [`FaultyStore`] wraps any `ObjectStore`; its [`Faults`] handle (cloneable) flips the
//! switches while a test runs and counts the calls that reached the wrapper. Every call goes
//! through the same switches, multipart uploads included (starting one, each part, and
//! completing it).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, UploadPart,
};

/// How often a hanging call looks whether it has been released.
const HANG_POLL: Duration = Duration::from_millis(5);

/// The switches and counters of a [`FaultyStore`]. Cheap to clone; all clones control the
/// same store.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    down: AtomicBool,
    hang: AtomicBool,
    latency_us: AtomicU64,
    fail_gets: AtomicU64,
    fail_puts: AtomicU64,
    ack_lost_puts: AtomicU64,
    calls: AtomicU64,
    gets: AtomicU64,
    heads: AtomicU64,
    puts: AtomicU64,
    parts: AtomicU64,
    deletes: AtomicU64,
    lists: AtomicU64,
    injected: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
enum Call {
    Get,
    Head,
    Put,
    Part,
    Delete,
    List,
    Other,
}

impl Faults {
    /// While down, every call fails at once with a connection-refused error (retryable).
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, Ordering::SeqCst);
    }

    /// While hanging, calls do not complete; calls already waiting resume when this is
    /// cleared.
    pub fn set_hang(&self, hang: bool) {
        self.state.hang.store(hang, Ordering::SeqCst);
    }

    /// Every call sleeps this long before doing anything (`Duration::ZERO` for none).
    pub fn set_latency(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.state.latency_us.store(us, Ordering::SeqCst);
    }

    /// The next `n` GETs (not HEADs) fail with a retryable server error.
    pub fn fail_next_gets(&self, n: u64) {
        self.state.fail_gets.store(n, Ordering::SeqCst);
    }

    /// The next `n` PUTs (single PUTs, multipart parts and completions) fail with a retryable
    /// server error, storing nothing.
    pub fn fail_next_puts(&self, n: u64) {
        self.state.fail_puts.store(n, Ordering::SeqCst);
    }

    /// The next `n` PUTs (single PUTs and multipart completions) reach the inner store — the
    /// object exists afterwards — but the caller gets an error, like a lost response.
    pub fn ack_lost_next_puts(&self, n: u64) {
        self.state.ack_lost_puts.store(n, Ordering::SeqCst);
    }

    /// Clears every switch (counters are kept).
    pub fn heal(&self) {
        self.set_down(false);
        self.set_hang(false);
        self.set_latency(Duration::ZERO);
        self.fail_next_gets(0);
        self.fail_next_puts(0);
        self.ack_lost_next_puts(0);
    }

    /// Calls that reached the store, of every kind.
    pub fn calls(&self) -> u64 {
        self.state.calls.load(Ordering::SeqCst)
    }

    /// GET calls (not HEADs).
    pub fn gets(&self) -> u64 {
        self.state.gets.load(Ordering::SeqCst)
    }

    /// HEAD calls.
    pub fn heads(&self) -> u64 {
        self.state.heads.load(Ordering::SeqCst)
    }

    /// Single PUTs, multipart starts and multipart completions.
    pub fn puts(&self) -> u64 {
        self.state.puts.load(Ordering::SeqCst)
    }

    /// Multipart parts.
    pub fn parts(&self) -> u64 {
        self.state.parts.load(Ordering::SeqCst)
    }

    /// Delete requests (a bulk delete counts once).
    pub fn deletes(&self) -> u64 {
        self.state.deletes.load(Ordering::SeqCst)
    }

    /// Listings started.
    pub fn lists(&self) -> u64 {
        self.state.lists.load(Ordering::SeqCst)
    }

    /// Calls failed on purpose (down, fail_next_*, ack-lost).
    pub fn injected_failures(&self) -> u64 {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// Calls in progress now (including their latency and hang).
    pub fn in_flight(&self) -> u64 {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    /// The most calls ever in progress at once.
    pub fn max_in_flight(&self) -> u64 {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    /// Starts counting [`Faults::max_in_flight`] again from the calls in progress now.
    pub fn reset_max_in_flight(&self) {
        let now = self.state.in_flight.load(Ordering::SeqCst);
        self.state.max_in_flight.store(now, Ordering::SeqCst);
    }

    /// Admits one call: counts it, waits out the latency and any hang, and fails it if the
    /// store is down. The returned guard keeps the call counted as in flight.
    async fn enter(&self, call: Call) -> object_store::Result<InFlight> {
        let s = &self.state;
        s.calls.fetch_add(1, Ordering::SeqCst);
        let counter = match call {
            Call::Get => Some(&s.gets),
            Call::Head => Some(&s.heads),
            Call::Put => Some(&s.puts),
            Call::Part => Some(&s.parts),
            Call::Delete => Some(&s.deletes),
            Call::List => Some(&s.lists),
            Call::Other => None,
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::SeqCst);
        }
        let in_flight = InFlight::new(self.state.clone());
        let latency = Duration::from_micros(s.latency_us.load(Ordering::SeqCst));
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        while s.hang.load(Ordering::SeqCst) {
            tokio::time::sleep(HANG_POLL).await;
        }
        if s.down.load(Ordering::SeqCst) {
            return Err(self.injected(
                std::io::ErrorKind::ConnectionRefused,
                "object store down (connection refused)",
            ));
        }
        Ok(in_flight)
    }

    /// Takes one from `counter` if it is positive.
    fn take(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    fn injected(&self, kind: std::io::ErrorKind, what: &str) -> object_store::Error {
        self.state.injected.fetch_add(1, Ordering::SeqCst);
        object_store::Error::Generic {
            store: "FaultyStore",
            source: Box::new(std::io::Error::new(kind, format!("injected fault: {what}"))),
        }
    }

    fn maybe_fail_put(&self) -> object_store::Result<()> {
        if Self::take(&self.state.fail_puts) {
            return Err(self.injected(
                std::io::ErrorKind::Other,
                "PUT failed (503 Service Unavailable)",
            ));
        }
        Ok(())
    }

    fn ack_lost(&self) -> Option<object_store::Error> {
        Self::take(&self.state.ack_lost_puts).then(|| {
            self.injected(
                std::io::ErrorKind::ConnectionReset,
                "PUT stored but its response was lost (connection reset)",
            )
        })
    }
}

/// Counts a call as in flight until dropped.
struct InFlight(Arc<State>);

impl InFlight {
    fn new(state: Arc<State>) -> Self {
        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An `ObjectStore` that injects the failures its [`Faults`] ask for, then passes calls to
/// the inner store.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: Faults,
}

impl FaultyStore {
    /// Wraps `inner`, with every switch off.
    pub fn new(inner: Arc<dyn ObjectStore>) -> FaultyStore {
        FaultyStore {
            inner,
            faults: Faults::default(),
        }
    }

    /// The switches and counters of this store.
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

/// A stream that first admits itself as one `call`, then yields `start()`'s items, staying
/// in flight until it ends.
fn admitted_stream<T: Send + 'static>(
    faults: Faults,
    call: Call,
    start: impl FnOnce() -> BoxStream<'static, object_store::Result<T>> + Send + 'static,
) -> BoxStream<'static, object_store::Result<T>> {
    stream::once(async move {
        match faults.enter(call).await {
            Ok(in_flight) => start()
                .map(move |item| {
                    let _keep = &in_flight;
                    item
                })
                .boxed(),
            Err(e) => stream::once(async move { Err(e) }).boxed(),
        }
    })
    .flatten()
    .boxed()
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let _in_flight = self.faults.enter(Call::Put).await?;
        self.faults.maybe_fail_put()?;
        let result = self.inner.put_opts(location, payload, opts).await?;
        match self.faults.ack_lost() {
            Some(e) => Err(e),
            None => Ok(result),
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let _in_flight = self.faults.enter(Call::Put).await?;
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(FaultyUpload {
            inner: upload,
            faults: self.faults.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let call = if options.head { Call::Head } else { Call::Get };
        let _in_flight = self.faults.enter(call).await?;
        if !options.head && Faults::take(&self.faults.state.fail_gets) {
            return Err(self.faults.injected(
                std::io::ErrorKind::Other,
                "GET failed (503 Service Unavailable)",
            ));
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let inner = self.inner.clone();
        admitted_stream(self.faults.clone(), Call::Delete, move || {
            inner.delete_stream(locations)
        })
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        admitted_stream(self.faults.clone(), Call::List, move || {
            inner.list(prefix.as_ref())
        })
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        let offset = offset.clone();
        admitted_stream(self.faults.clone(), Call::List, move || {
            inner.list_with_offset(prefix.as_ref(), &offset)
        })
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let _in_flight = self.faults.enter(Call::List).await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let _in_flight = self.faults.enter(Call::Other).await?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        let _in_flight = self.faults.enter(Call::Other).await?;
        self.inner.rename_opts(from, to, options).await
    }
}

/// A multipart upload through the same switches: each part can fail (`fail_next_puts`), and
/// the completion can fail or lose its answer like a single PUT.
#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    faults: Faults,
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        // The inner upload numbers its parts as they are created, so create it now.
        let part = self.inner.put_part(data);
        let faults = self.faults.clone();
        Box::pin(async move {
            let _in_flight = faults.enter(Call::Part).await?;
            faults.maybe_fail_put()?;
            part.await
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let _in_flight = self.faults.enter(Call::Put).await?;
        self.faults.maybe_fail_put()?;
        let result = self.inner.complete().await?;
        match self.faults.ack_lost() {
            Some(e) => Err(e),
            None => Ok(result),
        }
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        let _in_flight = self.faults.enter(Call::Other).await?;
        self.inner.abort().await
    }
}
