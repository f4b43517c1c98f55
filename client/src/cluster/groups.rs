//! Consumer groups on the client: `client.group(t, ns, stream, group)` polls every shard's
//! leader for claimed records and answers them (ack, nack, extend), following leaders as a
//! publish does (docs/groups.md).
//!
//! Invariant: a poll that was sent is never abandoned: a shard's poll still parked when
//! `poll` returns (another shard answered first) keeps running, and what it claims is
//! returned by the next `poll`, so the client never drops records it holds claims on. Only
//! requests the broker certainly did not act on are re-sent, and acks (which the broker
//! answers ok again for a record already retired) also after an unknown outcome.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use felix_wire::groups::{
    ClaimRef, GroupConfig, GroupInfo, GroupRequest, GroupResponse, GroupShardInfo,
};
use felix_wire::protocol::{Request, Response};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchIter, DecodedBatch, Header, Record};
use tokio::sync::mpsc;

use super::group_spread;
use super::retry::{Backoff, Deadline, may_retry};
use super::{Client, TryFailure};
use crate::{ClientError, StreamKey, stream_key};

/// Bytes a shard's poll asks for at most.
const POLL_BYTES: u64 = 4 << 20;

/// Who consumes: a group of a stream, and this consumer's name in it.
struct Target {
    client: Client,
    key: StreamKey,
    group: String,
    consumer: String,
}

/// A record claimed from a group: answer it with [`GroupRecord::ack`] (or `nack`) before
/// `deadline_ms`, or it is handed to another consumer.
#[derive(Clone)]
pub struct GroupRecord {
    pub shard: u32,
    pub offset: u64,
    /// 1 for the first delivery.
    pub attempt: u32,
    /// When the claim lapses (ms since the Unix epoch).
    pub deadline_ms: i64,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub payload: Bytes,
    /// Headers; a null header value reads as empty.
    pub headers: Vec<(String, Bytes)>,
    target: Arc<Target>,
}

impl std::fmt::Debug for GroupRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupRecord")
            .field("shard", &self.shard)
            .field("offset", &self.offset)
            .field("attempt", &self.attempt)
            .finish()
    }
}

impl GroupRecord {
    fn claim(&self) -> ClaimRef {
        ClaimRef {
            offset: self.offset,
            attempt: self.attempt,
        }
    }

    /// Retires the record for good: once this returns ok it is never delivered again.
    pub async fn ack(&self) -> Result<(), ClientError> {
        self.target
            .answer(self.shard, vec![self.claim()], Answer::Ack)
            .await
            .map(|_| ())
    }

    /// Releases the record: handed out again at once, or after `delay`. `reason` travels
    /// to the dead-letter stream if this was its last attempt.
    pub async fn nack(
        &self,
        delay: Option<Duration>,
        reason: Option<&str>,
    ) -> Result<(), ClientError> {
        let answer = Answer::Nack {
            delay_ms: delay.map_or(0, |d| d.as_millis() as u64),
            reason: reason.map(str::to_owned),
        };
        self.target
            .answer(self.shard, vec![self.claim()], answer)
            .await
            .map(|_| ())
    }

    /// Holds the record `visibility` longer from now (default: the group's timeout);
    /// returns the new deadline.
    pub async fn extend(&self, visibility: Option<Duration>) -> Result<i64, ClientError> {
        let answer = Answer::Extend {
            visibility_ms: visibility.map(|d| d.as_millis() as u64),
        };
        let deadlines = self
            .target
            .answer(self.shard, vec![self.claim()], answer)
            .await?;
        Ok(deadlines.first().copied().unwrap_or(self.deadline_ms))
    }
}

enum Answer {
    Ack,
    Nack {
        delay_ms: u64,
        reason: Option<String>,
    },
    Extend {
        visibility_ms: Option<u64>,
    },
}

type ShardPoll = (u32, Result<Vec<GroupRecord>, ClientError>);

/// A consumer of a group: see [`Client::group`].
pub struct GroupConsumer {
    target: Arc<Target>,
    ready: VecDeque<GroupRecord>,
    tx: mpsc::UnboundedSender<ShardPoll>,
    rx: mpsc::UnboundedReceiver<ShardPoll>,
    /// Shards with a poll outstanding, and what each may bring.
    polling: HashMap<u32, Outstanding>,
    /// Where the next round of polls starts (fairness when the budget is short).
    next_shard: u32,
    /// Claim the next poll's records while the caller handles these ([`GroupConsumer::prefetch`]).
    prefetch: bool,
}

/// A shard's poll in flight.
struct Outstanding {
    max: u32,
    wait: Duration,
}

static CONSUMERS: AtomicU64 = AtomicU64::new(0);

/// A consumer name unique to this process and call.
fn consumer_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "c-{}-{nanos:x}-{}",
        std::process::id(),
        CONSUMERS.fetch_add(1, Ordering::Relaxed)
    )
}

impl Client {
    /// A consumer of `group` on a stream (the group must exist: [`Client::create_group`]).
    ///
    /// ```no_run
    /// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
    /// use std::time::Duration;
    /// let mut orders = client.group("acme", "prod", "orders", "billing");
    /// for record in orders.poll(100, Duration::from_secs(5)).await? {
    ///     // handle record.payload, then:
    ///     record.ack().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn group(&self, tenant: &str, namespace: &str, stream: &str, group: &str) -> GroupConsumer {
        let (tx, rx) = mpsc::unbounded_channel();
        GroupConsumer {
            target: Arc::new(Target {
                client: self.clone(),
                key: stream_key(tenant, namespace, stream),
                group: group.to_owned(),
                consumer: consumer_name(),
            }),
            ready: VecDeque::new(),
            tx,
            rx,
            polling: HashMap::new(),
            next_shard: 0,
            prefetch: false,
        }
    }

    /// Creates a consumer group of a durable stream.
    pub async fn create_group(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        group: &str,
        config: GroupConfig,
    ) -> Result<GroupInfo, ClientError> {
        let request = Request::Group(GroupRequest::Create {
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
            group: group.into(),
            config,
        });
        match self.admin(request, false).await? {
            Response::Group(GroupResponse::Group { group }) => Ok(group),
            other => Err(unexpected(&other)),
        }
    }

    /// Changes the settings `config` sets (`dead_letter: Some("")` removes the dead-letter
    /// stream; the start position cannot change).
    pub async fn alter_group(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        group: &str,
        config: GroupConfig,
    ) -> Result<GroupInfo, ClientError> {
        let request = Request::Group(GroupRequest::Alter {
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
            group: group.into(),
            config,
        });
        match self.admin(request, false).await? {
            Response::Group(GroupResponse::Group { group }) => Ok(group),
            other => Err(unexpected(&other)),
        }
    }

    /// Deletes a group: its progress goes with it.
    pub async fn delete_group(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        group: &str,
    ) -> Result<(), ClientError> {
        let request = Request::Group(GroupRequest::Delete {
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
            group: group.into(),
        });
        self.admin(request, false).await.map(|_| ())
    }

    /// The groups of a stream (settings only).
    pub async fn list_groups(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<Vec<GroupInfo>, ClientError> {
        let request = Request::Group(GroupRequest::List {
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
        });
        match self.admin(request, true).await? {
            Response::Group(GroupResponse::Groups { groups }) => Ok(groups),
            other => Err(unexpected(&other)),
        }
    }

    /// A group's settings and its progress on every shard (each from the shard's leader).
    pub async fn describe_group(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        group: &str,
    ) -> Result<GroupInfo, ClientError> {
        let key = stream_key(tenant, namespace, stream);
        let shards = self.shard_count(tenant, namespace, stream).await?;
        let request = Request::Group(GroupRequest::Describe {
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
            group: group.into(),
        });
        let mut info: Option<GroupInfo> = None;
        let mut found: BTreeMap<u32, GroupShardInfo> = BTreeMap::new();
        for shard in 0..shards {
            if found.contains_key(&shard) {
                continue;
            }
            // A broker describes only the shards it leads: an answer without `shard` came by
            // a stale route (the shard just moved), so the routes are loaded again and the
            // shard asked again, until the request timeout; then what was found is returned.
            let deadline = self.budget();
            let mut backoff = Backoff::new();
            loop {
                let (response, _) = self
                    .on_shard_leader(&key, shard, &request, Duration::ZERO, true)
                    .await?;
                let Response::Group(GroupResponse::Group { group }) = response else {
                    return Err(unexpected(&response));
                };
                for s in &group.shards {
                    found.insert(s.shard, s.clone());
                }
                info.get_or_insert(group);
                let wait = backoff.next_delay(&ClientError::Timeout);
                if found.contains_key(&shard) || !deadline.allows(wait) {
                    break;
                }
                tokio::time::sleep(wait).await;
                let _ = self.load_routes(&key, &deadline, None).await;
            }
        }
        let mut info = info.ok_or_else(|| ClientError::Protocol("no shards to describe".into()))?;
        info.shards = found.into_values().collect();
        Ok(info)
    }

    /// Sends a request to a shard's leader and reads its answer with its body, following
    /// leadership; `extra` lengthens the wait for the answer (a poll's wait).
    async fn on_shard_leader(
        &self,
        key: &StreamKey,
        shard: u32,
        request: &Request,
        extra: Duration,
        idempotent: bool,
    ) -> Result<(Response, Bytes), ClientError> {
        self.on_shard_leader_with(key, shard, request, Bytes::new(), extra, idempotent)
            .await
    }

    /// [`Client::on_shard_leader`] for a request with a body (a conditional publish).
    pub(super) async fn on_shard_leader_with(
        &self,
        key: &StreamKey,
        shard: u32,
        request: &Request,
        body: Bytes,
        extra: Duration,
        idempotent: bool,
    ) -> Result<(Response, Bytes), ClientError> {
        let deadline = Deadline::after(self.inner.config.request_timeout + extra);
        let mut backoff = Backoff::new();
        loop {
            let failure = match self.leader_client(key, shard, &deadline).await {
                Ok((client, version)) => {
                    let timeout = client.request_timeout() + extra;
                    match client.call_with_body(request, body.clone(), timeout).await {
                        Ok(answer) => return Ok(answer),
                        Err(f) => TryFailure {
                            error: f.error,
                            sent: f.sent,
                            broker: Some(client.broker_id()),
                            version,
                        },
                    }
                }
                Err(f) => f,
            };
            if !may_retry(&failure.error, failure.sent, idempotent) {
                return Err(failure.error);
            }
            let hinted = self.learn(key, shard, &failure, &deadline).await?;
            let wait = if hinted {
                Duration::ZERO
            } else {
                backoff.next_delay(&failure.error)
            };
            if !deadline.allows(wait) {
                return Err(failure.error);
            }
            tokio::time::sleep(wait).await;
        }
    }
}

fn unexpected(r: &Response) -> ClientError {
    ClientError::Protocol(format!("unexpected answer to a group request: {r:?}"))
}

impl Target {
    fn names(&self) -> (String, String, String, String) {
        let (t, n, s) = &self.key;
        (t.clone(), n.clone(), s.clone(), self.group.clone())
    }

    async fn poll_shard(
        self: Arc<Self>,
        shard: u32,
        max_records: u32,
        wait: Duration,
    ) -> Result<Vec<GroupRecord>, ClientError> {
        let (tenant, namespace, stream, group) = self.names();
        let request = Request::Group(GroupRequest::Poll {
            tenant,
            namespace,
            stream,
            group,
            shard,
            consumer: self.consumer.clone(),
            max_records,
            max_bytes: POLL_BYTES,
            wait_ms: wait.as_millis() as u64,
        });
        let (response, body) = self
            .client
            .on_shard_leader(&self.key, shard, &request, wait, false)
            .await?;
        let Response::Group(GroupResponse::Claimed { shard, records }) = response else {
            return Err(unexpected(&response));
        };
        if records.is_empty() {
            return Ok(Vec::new());
        }
        // The stored batches holding the claimed records, which may hold others too.
        let wanted: HashMap<u64, usize> = records
            .iter()
            .enumerate()
            .map(|(i, m)| (m.offset, i))
            .collect();
        let mut found: Vec<Option<Record>> = vec![None; records.len()];
        for item in BatchIter::new(&body, usize::MAX) {
            let (header, batch) =
                item.map_err(|(_, e)| ClientError::Protocol(format!("poll answer: {e}")))?;
            // The iterator has checked the batch's CRC: decoded without checking again, the
            // records' keys and payloads slices of the answer (as a subscription's are).
            let decoded = DecodedBatch::decode_shared_validated(
                &body.slice_ref(batch),
                header,
                DEFAULT_MAX_DECOMPRESSED,
            )
            .map_err(|e| ClientError::Protocol(format!("poll answer: {e}")))?;
            for r in decoded.records {
                if let Some(&i) = wanted.get(&(r.offset as u64)) {
                    found[i] = Some(r);
                }
            }
        }
        records
            .into_iter()
            .zip(found)
            .map(|(meta, r)| {
                let r = r.ok_or_else(|| {
                    ClientError::Protocol(format!(
                        "poll answer names offset {} but does not carry it",
                        meta.offset
                    ))
                })?;
                Ok(GroupRecord {
                    shard,
                    offset: meta.offset,
                    attempt: meta.attempt,
                    deadline_ms: meta.deadline_ms,
                    timestamp: r.timestamp,
                    key: r.key,
                    payload: r.value.unwrap_or_default(),
                    headers: r
                        .headers
                        .into_iter()
                        .map(|h: Header| (h.key, h.value.unwrap_or_default()))
                        .collect(),
                    target: self.clone(),
                })
            })
            .collect()
    }

    async fn answer(
        &self,
        shard: u32,
        records: Vec<ClaimRef>,
        answer: Answer,
    ) -> Result<Vec<i64>, ClientError> {
        let (tenant, namespace, stream, group) = self.names();
        let consumer = self.consumer.clone();
        // An ack re-sent after an unknown outcome is answered ok again; a nack or an
        // extend is not (the claim it answered is gone), so those are sent once.
        let idempotent = matches!(answer, Answer::Ack);
        let request = Request::Group(match answer {
            Answer::Ack => GroupRequest::Ack {
                tenant,
                namespace,
                stream,
                group,
                shard,
                consumer,
                records,
            },
            Answer::Nack { delay_ms, reason } => GroupRequest::Nack {
                tenant,
                namespace,
                stream,
                group,
                shard,
                consumer,
                records,
                delay_ms,
                reason,
            },
            Answer::Extend { visibility_ms } => GroupRequest::Extend {
                tenant,
                namespace,
                stream,
                group,
                shard,
                consumer,
                records,
                visibility_ms,
            },
        });
        let (response, _) = self
            .client
            .on_shard_leader(&self.key, shard, &request, Duration::ZERO, idempotent)
            .await?;
        match response {
            Response::Group(GroupResponse::Answered { deadlines_ms, .. }) => Ok(deadlines_ms),
            other => Err(unexpected(&other)),
        }
    }
}

impl GroupConsumer {
    /// This consumer's name in the group (what `describe` lists).
    pub fn consumer(&self) -> &str {
        &self.target.consumer
    }

    /// Claims up to `max` records from the stream's shards, waiting up to `wait` for the
    /// first to arrive (zero: answer with what is there now). Records claimed by a shard
    /// that answers after this returns come with the next call.
    ///
    /// First the shards are asked without waiting, each for its share of `max` (`max` over
    /// the shards), for no more records in total than asked for (less what earlier polls
    /// still outstanding may bring); only if none has any does
    /// the consumer park a poll on each shard, and only then can more than `max` be claimed
    /// (records arriving on several shards at once): the rest come with the next call.
    pub async fn poll(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<GroupRecord>, ClientError> {
        if max == 0 {
            return Err(ClientError::InvalidArgument(
                "poll at least one record".into(),
            ));
        }
        let mut error = None;
        self.harvest(&mut error);
        if self.ready.len() < max {
            let (t, n, s) = &self.target.key;
            let shards = self.target.client.shard_count(t, n, s).await?;
            self.spread(shards, max, Duration::ZERO);
            let until =
                tokio::time::Instant::now() + self.target.client.inner.config.request_timeout;
            self.gather(until, false, &mut error).await;
            if self.ready.is_empty() && !wait.is_zero() {
                self.spread(shards, max, wait);
                self.gather(until + wait, true, &mut error).await;
            }
        }
        if self.ready.is_empty()
            && let Some(e) = error
        {
            return Err(e);
        }
        let n = max.min(self.ready.len());
        let records = self.ready.drain(..n).collect();
        if self.prefetch && n > 0 {
            // The next call's polls go out now, within the same budget (`max` less what is
            // still ready or outstanding), so the broker claims them while the caller
            // handles and answers these: one consumer no longer waits a poll's round trip
            // after every acknowledgement. (The shard count is cached by now; were it not
            // to be had, the records claimed are returned all the same.)
            let (t, ns, s) = &self.target.key;
            if let Ok(shards) = self.target.client.shard_count(t, ns, s).await {
                self.spread(shards, max, Duration::ZERO);
            }
        }
        Ok(records)
    }

    /// With `on`, every [`GroupConsumer::poll`] that returns records starts the polls for
    /// the next call (no more than it asked for) before returning: those records are
    /// claimed, and their visibility timeout runs, while the caller handles the ones
    /// returned. If the consumer stops polling they lapse at their deadline and go to
    /// another consumer, as any unanswered claim does. Off by default.
    pub fn prefetch(mut self, on: bool) -> Self {
        self.prefetch = on;
        self
    }

    /// Starts polls on the shards with none outstanding, as [`group_spread::plan`] shares
    /// what `max` leaves after the records ready and those outstanding polls may bring.
    fn spread(&mut self, shards: u32, max: usize, wait: Duration) {
        let outstanding: HashMap<u32, u32> =
            self.polling.iter().map(|(s, p)| (*s, p.max)).collect();
        let asks = group_spread::plan(
            shards,
            max,
            self.ready.len(),
            &outstanding,
            self.next_shard,
            !wait.is_zero(),
        );
        if asks.is_empty() {
            return;
        }
        self.next_shard = self.next_shard.wrapping_add(1);
        for (shard, take) in asks {
            self.polling.insert(shard, Outstanding { max: take, wait });
            let (target, tx) = (self.target.clone(), self.tx.clone());
            tokio::spawn(async move {
                let result = target.poll_shard(shard, take, wait).await;
                let _ = tx.send((shard, result));
            });
        }
    }

    /// Waits for answers until a record is ready, or (`parked`: every poll, else the
    /// non-waiting ones) have answered, or `until`.
    async fn gather(
        &mut self,
        until: tokio::time::Instant,
        parked: bool,
        error: &mut Option<ClientError>,
    ) {
        loop {
            self.harvest(error);
            let waiting_on = self.polling.values().any(|p| parked || p.wait.is_zero());
            if !self.ready.is_empty() || !waiting_on {
                return;
            }
            match tokio::time::timeout_at(until, self.rx.recv()).await {
                Ok(Some(polled)) => self.take(polled, error),
                _ => return,
            }
        }
    }

    fn harvest(&mut self, error: &mut Option<ClientError>) {
        while let Ok(polled) = self.rx.try_recv() {
            self.take(polled, error);
        }
    }

    fn take(&mut self, (shard, result): ShardPoll, error: &mut Option<ClientError>) {
        self.polling.remove(&shard);
        match result {
            Ok(records) => self.ready.extend(records),
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }

    /// Acknowledges records of one shard by offset and attempt (claims this consumer made,
    /// e.g. remembered across a hand-off); refused whole if any is not held by it.
    pub async fn ack_claims(&self, shard: u32, claims: &[(u64, u32)]) -> Result<(), ClientError> {
        let claims = claims
            .iter()
            .map(|&(offset, attempt)| ClaimRef { offset, attempt })
            .collect();
        self.target
            .answer(shard, claims, Answer::Ack)
            .await
            .map(|_| ())
    }

    /// Single-writer fencing: moves the group's position on `shard` from `expected_offset`
    /// to `offset` (everything below it retired, claimed or not), only if it is still
    /// `expected_offset`; otherwise `expected_offset_mismatch` with the actual position
    /// ([`ClientError::next_offset`]). Returns the new position.
    pub async fn commit(
        &self,
        shard: u32,
        expected_offset: u64,
        offset: u64,
    ) -> Result<u64, ClientError> {
        let t = &self.target;
        let (tenant, namespace, stream, group) = t.names();
        let request = Request::Group(GroupRequest::Commit {
            tenant,
            namespace,
            stream,
            group,
            shard,
            consumer: t.consumer.clone(),
            expected_offset,
            offset,
        });
        let (response, _) = t
            .client
            .on_shard_leader(&t.key, shard, &request, Duration::ZERO, false)
            .await?;
        match response {
            Response::Group(GroupResponse::Committed { offset, .. }) => Ok(offset),
            other => Err(unexpected(&other)),
        }
    }

    /// Acknowledges many records in one request per shard, the shards concurrently; fails
    /// with the first refusal (the other shards' acknowledgements stand).
    pub async fn ack_all(&self, records: &[GroupRecord]) -> Result<(), ClientError> {
        self.answer_all(records, || Answer::Ack).await
    }

    /// Nacks many records in one request per shard, the shards concurrently (see
    /// [`GroupRecord::nack`]).
    pub async fn nack_all(
        &self,
        records: &[GroupRecord],
        delay: Option<Duration>,
        reason: Option<&str>,
    ) -> Result<(), ClientError> {
        let delay_ms = delay.map_or(0, |d| d.as_millis() as u64);
        let reason = reason.map(str::to_owned);
        self.answer_all(records, || Answer::Nack {
            delay_ms,
            reason: reason.clone(),
        })
        .await
    }

    async fn answer_all(
        &self,
        records: &[GroupRecord],
        answer: impl Fn() -> Answer,
    ) -> Result<(), ClientError> {
        let mut by_shard: BTreeMap<u32, Vec<ClaimRef>> = BTreeMap::new();
        for r in records {
            by_shard.entry(r.shard).or_default().push(r.claim());
        }
        let mut answers = tokio::task::JoinSet::new();
        for (shard, claims) in by_shard {
            let (target, answer) = (self.target.clone(), answer());
            answers.spawn(async move { target.answer(shard, claims, answer).await });
        }
        let mut first_error = None;
        while let Some(done) = answers.join_next().await {
            let result = done.map_err(|e| ClientError::Transport(format!("answer task: {e}")));
            if let Err(e) = result.and_then(|r| r.map(|_| ())) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
