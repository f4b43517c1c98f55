//! The bounds on every object-store call: one of `max_concurrency` permits, `op_timeout`
//! per attempt, and retries with exponential backoff and equal jitter for the failures
//! retrying can change (a timeout, a connection error, a 5xx, 408 or 429). Invariant: an
//! answer that retrying cannot change (not found, conflict, precondition, access denied,
//! another 4xx) is returned at once, and no attempt outlives its timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::stream::{self, BoxStream};
use object_store::ObjectMeta;
use object_store::path::Path;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{Counters, bump};

/// Backoff between retries never exceeds this.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
#[error("{op} of {location} did not complete within {after:?}")]
pub(super) struct AttemptTimedOut {
    pub(super) op: &'static str,
    pub(super) location: String,
    pub(super) after: Duration,
}

pub(super) fn timeout_error(
    op: &'static str,
    location: &Path,
    after: Duration,
) -> object_store::Error {
    object_store::Error::Generic {
        store: "TierStore",
        source: Box::new(AttemptTimedOut {
            op,
            location: location.to_string(),
            after,
        }),
    }
}

pub(super) fn timed_out(e: &object_store::Error) -> Option<&AttemptTimedOut> {
    match e {
        object_store::Error::Generic { source, .. } => source.downcast_ref(),
        _ => None,
    }
}

/// Whether retrying `e` might succeed: timeouts, connection errors, 5xx, 408 and 429 may;
/// "not found", conflicts, preconditions, auth failures and other 4xx will not.
pub(super) fn is_transient(e: &object_store::Error) -> bool {
    let object_store::Error::Generic { source, .. } = e else {
        return false;
    };
    if source.downcast_ref::<AttemptTimedOut>().is_some() {
        return true;
    }
    match http_status_of(e) {
        Some(status) => !(400..500).contains(&status) || status == 408 || status == 429,
        None => true,
    }
}

/// The HTTP status behind a `Generic` error, if any. object_store's HTTP error type is
/// private, but its message carries the status.
pub(super) fn http_status_of(e: &object_store::Error) -> Option<u16> {
    let object_store::Error::Generic { source, .. } = e else {
        return None;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
    while let Some(c) = cause {
        let message = c.to_string();
        if let Some((_, rest)) = message.split_once("status code: ")
            && let Some(status) = rest.get(..3).and_then(|s| s.parse().ok())
        {
            return Some(status);
        }
        cause = c.source();
    }
    None
}

/// The limits every call goes through. Cheap to clone (streams and uploads carry one).
#[derive(Debug, Clone)]
pub(super) struct Guard {
    pub(super) permits: Arc<Semaphore>,
    pub(super) counters: Arc<Counters>,
    pub(super) op_timeout: Duration,
    pub(super) max_retries: usize,
    pub(super) retry_backoff: Duration,
}

impl Guard {
    pub(super) async fn permit(&self) -> OwnedSemaphorePermit {
        self.permits
            .clone()
            .acquire_owned()
            .await
            .expect("the store's semaphore is never closed")
    }

    /// The backoff before retry number `retry` (1-based), or `None` if `e` must not be
    /// retried.
    pub(super) fn retry_delay(&self, e: &object_store::Error, retry: usize) -> Option<Duration> {
        if retry > self.max_retries || !is_transient(e) {
            return None;
        }
        let exp = self
            .retry_backoff
            .saturating_mul(1u32 << (retry - 1).min(20))
            .min(MAX_BACKOFF);
        // Equal jitter: half fixed, half random, so concurrent retries spread out.
        let half = exp / 2;
        Some(half + half.mul_f64(jitter()))
    }

    pub(super) fn count_failure(&self, e: &object_store::Error) {
        if !matches!(e, object_store::Error::NotFound { .. }) {
            bump(&self.counters.errors, 1);
        }
    }

    pub(super) fn note_timeout(&self, e: &object_store::Error) {
        if timed_out(e).is_some() {
            bump(&self.counters.timeouts, 1);
        }
    }

    /// Runs `attempt` under a permit and `op_timeout`, retrying transient failures. The
    /// attempt owns its permit (a streaming GET keeps it for the stream's life).
    pub(super) async fn call_owned<T, F, Fut>(
        &self,
        op: &'static str,
        location: &Path,
        mut attempt: F,
    ) -> object_store::Result<T>
    where
        F: FnMut(OwnedSemaphorePermit) -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let mut retry = 0;
        loop {
            let permit = self.permit().await;
            let outcome = match tokio::time::timeout(self.op_timeout, attempt(permit)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(timeout_error(op, location, self.op_timeout)),
            };
            let e = match outcome {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            self.note_timeout(&e);
            retry += 1;
            match self.retry_delay(&e, retry) {
                Some(delay) => {
                    bump(&self.counters.retries, 1);
                    tracing::debug!(op, %location, retry, ?delay, error = %e, "object store call failed; retrying");
                    tokio::time::sleep(delay).await;
                }
                None => {
                    self.count_failure(&e);
                    if !matches!(e, object_store::Error::NotFound { .. }) {
                        tracing::warn!(op, %location, attempts = retry, error = %e, "object store call failed");
                    }
                    return Err(e);
                }
            }
        }
    }

    /// [`Guard::call_owned`] for attempts that need the permit only while they run.
    pub(super) async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        location: &Path,
        mut attempt: F,
    ) -> object_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        self.call_owned(op, location, |permit| {
            let run = attempt();
            async move {
                let outcome = run.await;
                drop(permit);
                outcome
            }
        })
        .await
    }

    /// One attempt, no retry: a permit and the timeout.
    pub(super) async fn once<T>(
        &self,
        op: &'static str,
        location: &Path,
        run: impl Future<Output = object_store::Result<T>>,
    ) -> object_store::Result<T> {
        let _permit = self.permit().await;
        let outcome = match tokio::time::timeout(self.op_timeout, run).await {
            Ok(outcome) => outcome,
            Err(_) => Err(timeout_error(op, location, self.op_timeout)),
        };
        if let Err(e) = &outcome {
            self.note_timeout(e);
            self.count_failure(e);
        }
        outcome
    }

    /// A stream whose items must each arrive within `op_timeout`; ends after the first
    /// error. Holds `permit` until it ends or is dropped.
    pub(super) fn bounded_stream<T: Send + 'static>(
        &self,
        op: &'static str,
        location: Path,
        stream: BoxStream<'static, object_store::Result<T>>,
        permit: OwnedSemaphorePermit,
    ) -> BoxStream<'static, object_store::Result<T>> {
        let guard = self.clone();
        stream::unfold(Some((stream, permit)), move |state| {
            let guard = guard.clone();
            let location = location.clone();
            async move {
                let (mut stream, permit) = state?;
                match tokio::time::timeout(guard.op_timeout, stream.next()).await {
                    Ok(None) => None,
                    Ok(Some(Ok(item))) => Some((Ok(item), Some((stream, permit)))),
                    Ok(Some(Err(e))) => {
                        guard.count_failure(&e);
                        Some((Err(e), None))
                    }
                    Err(_) => {
                        let e = timeout_error(op, &location, guard.op_timeout);
                        guard.note_timeout(&e);
                        guard.count_failure(&e);
                        Some((Err(e), None))
                    }
                }
            }
        })
        .boxed()
    }

    /// A listing: retried until its first item (or its end) arrives, then bounded per item.
    pub(super) fn list_stream(
        &self,
        location: Option<Path>,
        start: impl Fn() -> BoxStream<'static, object_store::Result<ObjectMeta>> + Send + 'static,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let guard = self.clone();
        let first = async move {
            let location = location.unwrap_or_default();
            let mut retry = 0;
            loop {
                let permit = guard.permit().await;
                bump(&guard.counters.lists, 1);
                let mut listing = start();
                let e = match tokio::time::timeout(guard.op_timeout, listing.next()).await {
                    Ok(None) => return stream::empty().boxed(),
                    Ok(Some(Ok(first))) => {
                        let rest = guard.bounded_stream("list", location, listing, permit);
                        return stream::once(async move { Ok(first) }).chain(rest).boxed();
                    }
                    Ok(Some(Err(e))) => e,
                    Err(_) => timeout_error("list", &location, guard.op_timeout),
                };
                drop(permit);
                guard.note_timeout(&e);
                retry += 1;
                match guard.retry_delay(&e, retry) {
                    Some(delay) => {
                        bump(&guard.counters.retries, 1);
                        tracing::debug!(%location, retry, ?delay, error = %e, "object store listing failed; retrying");
                        tokio::time::sleep(delay).await;
                    }
                    None => {
                        guard.count_failure(&e);
                        return stream::once(async move { Err(e) }).boxed();
                    }
                }
            }
        };
        stream::once(first).flatten().boxed()
    }
}

/// Uniform in [0, 1), from a per-thread xorshift seeded by the clock; good enough to spread
/// retries.
fn jitter() -> f64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x9E37_79B9_7F4A_7C15)
                | 1,
        );
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_failures_are_retried() {
        let generic = |msg: &str| object_store::Error::Generic {
            store: "S3",
            source: msg.to_string().into(),
        };
        assert!(is_transient(&generic(
            "Server returned non-2xx status code: 503 Service Unavailable: "
        )));
        assert!(is_transient(&generic(
            "Server returned non-2xx status code: 429 Too Many Requests: "
        )));
        assert!(!is_transient(&generic(
            "Server returned non-2xx status code: 400 Bad Request: "
        )));
        assert!(is_transient(&generic("connection refused")));
        assert!(is_transient(&timeout_error(
            "get",
            &Path::from("k"),
            Duration::from_secs(1)
        )));
        assert!(!is_transient(&object_store::Error::NotFound {
            path: "k".into(),
            source: "gone".into()
        }));
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let guard = Guard {
            permits: Arc::new(Semaphore::new(1)),
            counters: Arc::default(),
            op_timeout: Duration::from_secs(1),
            max_retries: 30,
            retry_backoff: Duration::from_millis(100),
        };
        let e = timeout_error("get", &Path::from("k"), Duration::from_secs(1));
        for retry in 1..=30 {
            let d = guard.retry_delay(&e, retry).unwrap();
            let full = Duration::from_millis(100)
                .saturating_mul(1 << (retry - 1).min(20))
                .min(MAX_BACKOFF);
            assert!(
                d >= full / 2 && d <= full,
                "retry {retry}: {d:?} vs {full:?}"
            );
        }
        assert!(guard.retry_delay(&e, 31).is_none());
    }
}
