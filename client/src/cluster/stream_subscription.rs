//! A subscription to a whole stream: one [`ClusterSubscription`] per shard, their events
//! read as one sequence (the spec's `client.subscribe(tenant, namespace, stream)`).
//!
//! Invariant: each shard's events come out in that shard's log order (each shard is read by
//! one task into one bounded queue, so a slow reader slows the shards' reads rather than
//! growing memory); shards interleave in no promised order. The first shard to end with an
//! error ends the whole subscription with it.

use felix_wire::protocol::StartAt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{Client, ClusterSubscription};
use crate::{ClientError, Event};

/// How many events the shards may have read ahead of the caller.
const READ_AHEAD: usize = 1024;

type ShardEvent = (u32, Result<Option<Event>, ClientError>);

/// Every shard of a stream, from [`Client::subscribe`]. Dropping it ends it.
///
/// ```no_run
/// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
/// let mut sub = client.subscribe("acme", "sensors", "temperature").await?;
/// while let Some(event) = sub.next_event().await? {
///     println!("shard {:?} offset {}", sub.last_shard(), event.offset);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct StreamSubscription {
    events: mpsc::Receiver<ShardEvent>,
    readers: JoinSet<()>,
    /// Shards whose subscription has not ended yet.
    open: usize,
    last_shard: Option<u32>,
    done: bool,
}

impl Client {
    /// Subscribes to every shard of a stream from the latest record on (what arrives from
    /// now), following each shard's leader. Records then come from
    /// [`StreamSubscription::next_event`].
    pub async fn subscribe(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<StreamSubscription, ClientError> {
        self.subscribe_from(tenant, namespace, stream, StartAt::Latest)
            .await
    }

    /// Subscribes to every shard of a stream from `from` (an offset means the same offset
    /// in each shard).
    pub async fn subscribe_from(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        from: StartAt,
    ) -> Result<StreamSubscription, ClientError> {
        let shards = self.shard_count(tenant, namespace, stream).await?;
        let mut subs = Vec::with_capacity(shards as usize);
        for shard in 0..shards {
            subs.push(
                self.subscribe_shard(tenant, namespace, stream, shard, from)
                    .await?,
            );
        }
        let (tx, events) = mpsc::channel(READ_AHEAD);
        let mut readers = JoinSet::new();
        for sub in subs {
            readers.spawn(read_shard(sub, tx.clone()));
        }
        Ok(StreamSubscription {
            events,
            readers,
            open: shards as usize,
            last_shard: None,
            done: false,
        })
    }
}

/// Forwards one shard's events until it ends or the stream subscription is dropped.
async fn read_shard(mut sub: ClusterSubscription, tx: mpsc::Sender<ShardEvent>) {
    loop {
        let next = sub.next_event().await;
        let end = !matches!(next, Ok(Some(_)));
        if tx.send((sub.shard(), next)).await.is_err() || end {
            return;
        }
    }
}

impl StreamSubscription {
    /// The next record of any shard. `Ok(None)` once every shard's subscription ended
    /// cleanly; an error when one ended for a reason a new leader does not cure. After an
    /// error or `None` it keeps answering `Ok(None)`.
    pub async fn next_event(&mut self) -> Result<Option<Event>, ClientError> {
        while !self.done && self.open > 0 {
            let Some((shard, next)) = self.events.recv().await else {
                break;
            };
            match next {
                Ok(Some(event)) => {
                    self.last_shard = Some(shard);
                    return Ok(Some(event));
                }
                Ok(None) => self.open -= 1,
                Err(e) => {
                    self.done = true;
                    self.readers.abort_all();
                    return Err(e);
                }
            }
        }
        self.done = true;
        Ok(None)
    }

    /// The shard of the last record returned.
    pub fn last_shard(&self) -> Option<u32> {
        self.last_shard
    }
}
