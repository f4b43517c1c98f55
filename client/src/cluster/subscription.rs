//! A subscription to one shard of a cluster that survives leadership moving: when the
//! leader's subscription ends for a reason that a new leader cures, it is opened again on
//! the shard's current leader.
//!
//! Invariant: it resumes at the offset after the last record handed out (or where the
//! first subscription started, before any), so across any number of resumptions records
//! come out in log order with nothing repeated and nothing skipped. It gives up, with the
//! last error, when `request_timeout` passes without a subscription being opened.

use felix_wire::protocol::StartAt;
use tokio::time::Instant;

use super::retry::{Backoff, Deadline, may_retry, resumable_end};
use super::{Client, TryFailure};
use crate::{ClientError, Event, StreamKey, Subscription, stream_key};

/// A subscription to one shard of a stream on a cluster, from
/// [`Client::subscribe_shard`]. Like a [`Subscription`], but when the leader's
/// subscription ends with `not_leader`, `shard_unavailable` (`fenced`, `stopping`, ...),
/// `subscription_lagged` or a lost connection, it subscribes again on the current leader
/// from [`ClusterSubscription::next_offset`]. Dropping it ends it.
///
/// ```no_run
/// # async fn demo(cluster: felix_client::Client) -> Result<(), felix_client::ClientError> {
/// use felix_client::StartAt;
/// let mut sub = cluster.subscribe_shard("acme", "prod", "orders", 0, StartAt::Earliest).await?;
/// while let Some(event) = sub.next_event().await? {
///     println!("{} {:?} (from broker {:?})", event.offset, event.payload, sub.broker_id());
/// }
/// # Ok(()) }
/// ```
pub struct ClusterSubscription {
    cluster: Client,
    key: StreamKey,
    shard: u32,
    /// Where the next subscription starts.
    from: StartAt,
    current: Option<Opened>,
    /// When the current run of failures began (cleared by a subscription opening).
    failing_since: Option<Instant>,
    backoff: Backoff,
    /// Whether a record came from the current subscription (an end right after opening,
    /// with nothing delivered, waits before resubscribing).
    delivered: bool,
    resumptions: u64,
    done: bool,
}

struct Opened {
    sub: Subscription,
    broker: u64,
    version: Option<u64>,
}

impl std::fmt::Debug for ClusterSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSubscription")
            .field("stream", &self.key)
            .field("shard", &self.shard)
            .field("from", &self.from)
            .field("broker", &self.broker_id())
            .field("resumptions", &self.resumptions)
            .field("done", &self.done)
            .finish()
    }
}

impl Client {
    /// Subscribes to one shard of a stream from `from`, on the shard's leader (waiting for
    /// one within the request timeout). Records then come from
    /// [`ClusterSubscription::next_event`], across leadership changes.
    pub async fn subscribe_shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        from: StartAt,
    ) -> Result<ClusterSubscription, ClientError> {
        let mut sub = ClusterSubscription {
            cluster: self.clone(),
            key: stream_key(tenant, namespace, stream),
            shard,
            from,
            current: None,
            failing_since: None,
            backoff: Backoff::new(),
            delivered: false,
            resumptions: 0,
            done: false,
        };
        sub.open().await?;
        Ok(sub)
    }
}

impl ClusterSubscription {
    /// The shard this subscription reads.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The broker whose subscription is open now (`None` between two).
    pub fn broker_id(&self) -> Option<u64> {
        self.current.as_ref().map(|o| o.broker)
    }

    /// One past the last record returned so far (or where delivery starts, before any):
    /// where the next resumption starts. `None` until the first subscription has opened
    /// from `Earliest`/`Latest`/a timestamp.
    pub fn next_offset(&self) -> Option<u64> {
        match (&self.current, self.from) {
            (Some(opened), _) => Some(opened.sub.next_offset()),
            (None, StartAt::Offset(offset)) => Some(offset),
            (None, _) => None,
        }
    }

    /// How many times the subscription was opened again after an end.
    pub fn resumptions(&self) -> u64 {
        self.resumptions
    }

    /// Opens a subscription on the shard's leader, retrying retryable failures until
    /// `request_timeout` after the first of them.
    async fn open(&mut self) -> Result<(), ClientError> {
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        let budget = self.cluster.inner.config.request_timeout;
        let deadline = Deadline::after(budget.saturating_sub(since.elapsed()));
        let mut hinted_before = false;
        loop {
            let failure = match self.open_once(&deadline).await {
                Ok(opened) => {
                    self.current = Some(opened);
                    self.failing_since = None;
                    self.delivered = false;
                    return Ok(());
                }
                Err(failure) => failure,
            };
            // A subscription is read-only: re-sending it is always safe.
            if !may_retry(&failure.error, failure.sent, true) {
                return Err(failure.error);
            }
            let hinted = match self
                .cluster
                .learn(&self.key, self.shard, &failure, &deadline)
                .await
            {
                Ok(hinted) => hinted,
                Err(e) => return Err(e),
            };
            // Follow a leader named by `not_leader` at once, but not twice in a row.
            let wait = if hinted && !hinted_before {
                std::time::Duration::ZERO
            } else {
                self.backoff.next_delay(&failure.error)
            };
            hinted_before = hinted;
            if !deadline.allows(wait) {
                return Err(failure.error);
            }
            tracing::debug!(shard = self.shard, error = %failure.error, ?wait, "cannot subscribe yet; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    async fn open_once(&self, deadline: &Deadline) -> Result<Opened, TryFailure> {
        let (client, version) = self
            .cluster
            .leader_client(&self.key, self.shard, deadline)
            .await?;
        let (t, ns, s) = &self.key;
        match client.subscribe(t, ns, s, self.shard, self.from).await {
            Ok(sub) => Ok(Opened {
                sub,
                broker: client.broker_id(),
                version,
            }),
            Err(error) => Err(TryFailure {
                error,
                sent: true,
                broker: Some(client.broker_id()),
                version,
            }),
        }
    }

    /// The next record, from whichever broker leads the shard now. `Ok(None)` when a
    /// broker ended the subscription cleanly; an error when it ended for a reason a new
    /// leader does not cure (`offset_too_old`, the stream deleted, ...) or when no leader
    /// could be subscribed to within `request_timeout`. After an error or `None` it keeps
    /// answering `Ok(None)`.
    ///
    /// Cancel-safe, like [`Subscription::next_event`]: a cancelled call loses no record
    /// (a resumption cut short starts again on the next call, from the same offset).
    pub async fn next_event(&mut self) -> Result<Option<Event>, ClientError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let Some(opened) = self.current.as_mut() else {
                if let Err(e) = self.open().await {
                    self.done = true;
                    return Err(e);
                }
                continue;
            };
            let error = match opened.sub.next_event().await {
                Ok(Some(event)) => {
                    self.delivered = true;
                    self.backoff.reset();
                    return Ok(Some(event));
                }
                Ok(None) => {
                    self.done = true;
                    self.current = None;
                    return Ok(None);
                }
                Err(error) => error,
            };
            let (broker, version) = (opened.broker, opened.version);
            self.from = StartAt::Offset(opened.sub.next_offset());
            self.current = None;
            if !resumable_end(&error) {
                self.done = true;
                return Err(error);
            }
            self.resumptions += 1;
            tracing::debug!(
                shard = self.shard,
                broker,
                from = ?self.from,
                %error,
                "subscription ended; resuming on the shard's leader"
            );
            if matches!(error, ClientError::SubscriptionLagged { .. }) {
                continue; // the leader is fine: only this subscriber was slow
            }
            let failure = TryFailure {
                error,
                sent: true,
                broker: Some(broker),
                version,
            };
            self.failing_since.get_or_insert_with(Instant::now);
            let deadline = Deadline::after(self.cluster.inner.config.request_timeout);
            let hinted = match self
                .cluster
                .learn(&self.key, self.shard, &failure, &deadline)
                .await
            {
                Ok(hinted) => hinted,
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            };
            if !hinted && !self.delivered {
                // Ended again before a single record: do not spin on a flapping leader.
                tokio::time::sleep(self.backoff.next_delay(&failure.error)).await;
            }
        }
    }
}
