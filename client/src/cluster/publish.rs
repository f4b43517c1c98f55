//! A cluster client's publishes: each shard's batch goes to the shard's leader, and is sent
//! again while the failure allows it (`retry` decides) and `request_timeout` has not passed.
//!
//! Invariant: a batch is re-sent only when the broker certainly did not act on it (a
//! `tenant_quota` refusal is waited out for its `retry_after_ms`), unless
//! the caller is an idempotent producer (whose re-sends the leader recognises by producer
//! id and sequence); a try in flight to a leader that the rest of the cluster says has been
//! replaced, and that no longer answers on its own connection either, is given up as an
//! unknown outcome rather than waited on until the QUIC idle timeout. A replaced leader that
//! still answers is waited for: it holds, forwards or refuses the publish itself.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use felix_wire::protocol::{AckMode, codes};

use super::retry::{self, Backoff, Deadline, Verdict, classify, may_retry};
use super::routes::Route;
use super::{
    Client, LEADER_CHECK_AFTER, LEADER_CHECK_EVERY, PublishFailure, TryFailure, broker_error,
};
use crate::publish::{self, Message, Published, ShardOutcome};
use crate::request::Failed;
use crate::{ClientError, Connection, StreamKey, Topology, stream_key};

impl Client {
    /// The leader's connection for one shard, and the routes version it was chosen by.
    pub(super) async fn leader_client(
        &self,
        key: &StreamKey,
        shard: u32,
        deadline: &Deadline,
    ) -> Result<(Connection, Option<u64>), TryFailure> {
        let not_sent = |error: ClientError, version| TryFailure {
            error,
            sent: false,
            broker: None,
            version,
        };
        let mut refreshed = false;
        loop {
            let (route, version) = {
                let table = self.routes();
                (table.route(key, shard), table.version(key))
            };
            match route {
                None if !refreshed => {
                    refreshed = true;
                    self.load_routes(key, deadline, None)
                        .await
                        .map_err(|e| not_sent(e, version))?;
                }
                Some(Route::NoShard { .. }) if !refreshed => {
                    // The stream may have been re-created with more shards.
                    refreshed = true;
                    self.load_routes(key, deadline, None)
                        .await
                        .map_err(|e| not_sent(e, version))?;
                }
                None => {
                    let (t, ns, s) = key;
                    let error = broker_error(
                        codes::UNKNOWN_STREAM,
                        "unknown_stream",
                        format!("no topology for {t}/{ns}/{s}"),
                    );
                    return Err(not_sent(error, version));
                }
                Some(Route::NoShard { shards }) => {
                    let error = broker_error(
                        codes::UNKNOWN_SHARD,
                        "unknown_shard",
                        format!("shard {shard} of a stream of {shards} shards"),
                    );
                    return Err(not_sent(error, version));
                }
                Some(Route::NoLeader) => {
                    let error = broker_error(
                        codes::SHARD_UNAVAILABLE,
                        "no_leader",
                        format!("shard {shard} has no reachable leader now"),
                    );
                    return Err(not_sent(error, version));
                }
                Some(Route::Leader { broker, addr }) => {
                    return match self.inner.pool.get(broker, &addr, deadline).await {
                        Ok(client) => Ok((client, version)),
                        Err(error) => Err(TryFailure {
                            error,
                            sent: false,
                            broker: Some(broker),
                            version,
                        }),
                    };
                }
            }
        }
    }

    /// Learns from a failed try at a shard: follows a `not_leader` hint, else refreshes the
    /// stream's routes (once among callers that failed on the same version). Returns whether
    /// a hint re-routed the shard; an error only when the stream cannot be routed at all
    /// any more (deleted, ...).
    pub(super) async fn learn(
        &self,
        key: &StreamKey,
        shard: u32,
        failure: &TryFailure,
        deadline: &Deadline,
    ) -> Result<bool, ClientError> {
        if let ClientError::Broker(body) = &failure.error
            && body.code == codes::NOT_LEADER
        {
            let leader = match (body.leader, body.leader_addr.as_deref()) {
                (Some(id), _) if Some(id) != failure.broker => Some(id),
                (None, Some(addr)) => match self.inner.pool.dial(addr, deadline).await {
                    Ok(client) => {
                        let client = self.inner.pool.insert(client).await;
                        Some(client.broker_id()).filter(|&id| Some(id) != failure.broker)
                    }
                    Err(e) => {
                        tracing::debug!(addr, error = %e, "cannot reach the leader named");
                        None
                    }
                },
                _ => None,
            };
            if let Some(leader) = leader {
                self.routes()
                    .apply_hint(key, shard, leader, body.leader_addr.as_deref());
                return Ok(true);
            }
        }
        if self.routes().version(key) != failure.version {
            return Ok(false); // someone refreshed since this try was routed
        }
        match self.load_routes(key, deadline, failure.broker).await {
            Ok(_) => Ok(false),
            Err(e) if classify(&e, true) == Verdict::Final => Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "cannot refresh the routes");
                Ok(false)
            }
        }
    }

    /// One try at publishing `batch` to `shard`'s leader.
    async fn publish_once(
        &self,
        key: &StreamKey,
        shard: u32,
        batch: Bytes,
        ack: AckMode,
        deadline: &Deadline,
    ) -> Result<Option<Published>, TryFailure> {
        let (client, version) = self.leader_client(key, shard, deadline).await?;
        let (t, ns, s) = key;
        let leader = client.broker_id();
        let call = client.publish_raw_tracked(t, ns, s, shard, batch, ack);
        // A leader killed mid-call is only noticed at the QUIC idle timeout (6 s); the rest
        // of the cluster names its successor sooner. Give up on the call then: its outcome
        // is unknown, which an idempotent producer answers by re-sending.
        let result = tokio::select! {
            result = call => result,
            topology = self.leader_moved(key, shard, &client, deadline) => {
                // Route the next publish to the successor at once: an unknown outcome is
                // not retried here (unless idempotent), and the caller's next publish must
                // not go back to a leader that only it still believes in.
                self.routes().apply_topology(key, &topology);
                Err(Failed {
                    error: ClientError::Transport(format!(
                        "broker {leader} stopped leading shard {shard} while the publish was in flight"
                    )),
                    sent: true,
                })
            }
        };
        match result {
            Ok(Some(published)) => Ok(Some(published)),
            Ok(None) if ack == AckMode::None => Ok(None),
            Ok(None) => Err(TryFailure {
                error: ClientError::Protocol("the broker did not acknowledge".into()),
                sent: true,
                broker: Some(client.broker_id()),
                version,
            }),
            Err(Failed { error, sent }) => Err(TryFailure {
                error,
                sent,
                broker: Some(client.broker_id()),
                version,
            }),
        }
    }

    /// Resolves, with that topology, once another broker's topology names a leader of
    /// `shard` other than `leader` and `leader` dead, and `leader` itself does not answer a
    /// topology request on its connection within half a second (checked every half second
    /// after the first second); never otherwise.
    ///
    /// "Dead" in a topology is the control plane's judgement of a lease, and a loaded broker
    /// can lose its lease for a moment while it lives: during a shard move it still holds
    /// the publish at its fence and then forwards it to the new owner or refuses it as
    /// `moving`, unwritten (docs/shard-moves.md). Giving up on such a call would turn a
    /// held publish into an unknown outcome, so only a leader that is silent as well (killed,
    /// paused, cut off from this client) is given up on.
    async fn leader_moved(
        &self,
        key: &StreamKey,
        shard: u32,
        old: &Connection,
        deadline: &Deadline,
    ) -> Topology {
        tokio::time::sleep(LEADER_CHECK_AFTER).await;
        let leader = old.broker_id();
        let (t, ns, s) = key;
        loop {
            let open = self
                .inner
                .pool
                .open_all()
                .into_iter()
                .find(|c| c.broker_id() != leader);
            let other = match open {
                Some(c) => Some(c),
                None => self
                    .live_client(deadline, Some(leader))
                    .await
                    .ok()
                    .filter(|c| c.broker_id() != leader),
            };
            if let Some(other) = other
                && let Ok(Ok(topology)) =
                    tokio::time::timeout(LEADER_CHECK_EVERY, other.topology(t, ns, s)).await
                && topology
                    .shard(shard)
                    .is_some_and(|r| r.leader.is_some_and(|l| l != leader))
                && !topology.broker(leader).is_some_and(|b| b.alive)
                && !matches!(
                    tokio::time::timeout(LEADER_CHECK_EVERY, old.topology(t, ns, s)).await,
                    // Any answer, a refusal too, says it is there to answer the publish.
                    Ok(Ok(_) | Err(ClientError::Broker(_)))
                )
            {
                return topology;
            }
            tokio::time::sleep(LEADER_CHECK_EVERY).await;
        }
    }

    /// Publishes an encoded batch to `shard`, following its leader, re-sending while the
    /// failure allows (see [`retry`]) and `request_timeout` has not passed.
    pub(crate) async fn send_to_shard(
        &self,
        key: &StreamKey,
        shard: u32,
        batch: Bytes,
        ack: AckMode,
        idempotent: bool,
    ) -> Result<Option<Published>, PublishFailure> {
        let deadline = self.budget();
        let mut backoff = Backoff::new();
        // The error of the last try whose outcome is unknown: reported rather than a
        // later, plainer refusal, so that the caller knows the records may have landed.
        let mut unknown: Option<ClientError> = None;
        let mut hinted_before = false;
        loop {
            let failure = match self
                .publish_once(key, shard, batch.clone(), ack, &deadline)
                .await
            {
                Ok(published) => return Ok(published),
                Err(failure) => failure,
            };
            if classify(&failure.error, failure.sent) == Verdict::Ambiguous {
                unknown = retry::copy_of_unknown(&failure.error);
            }
            let give_up = |last: ClientError, unknown: Option<ClientError>| PublishFailure {
                maybe_written: unknown.is_some(),
                error: unknown.unwrap_or(last),
            };
            if !may_retry(&failure.error, failure.sent, idempotent) {
                return Err(give_up(failure.error, unknown));
            }
            // Over its tenant's quota the route was right: wait as asked, re-route nothing.
            let hinted = if retry::over_quota(&failure.error) {
                false
            } else {
                match self.learn(key, shard, &failure, &deadline).await {
                    Ok(hinted) => hinted,
                    Err(e) => return Err(give_up(e, unknown)),
                }
            };
            let wait = if hinted && !hinted_before {
                Duration::ZERO
            } else {
                backoff.next_delay(&failure.error)
            };
            hinted_before = hinted;
            if !deadline.allows(wait) {
                return Err(give_up(failure.error, unknown));
            }
            tracing::debug!(shard, error = %failure.error, ?wait, "publish failed; retrying");
            tokio::time::sleep(wait).await;
        }
    }

    /// Which shard gets which messages (as a [`Connection`] places them).
    pub(super) fn plan(&self, messages: &[Message], shards: u32) -> Vec<(u32, Vec<usize>)> {
        publish::place_in_turn(messages, shards, &self.inner.round_robin)
    }

    /// The publish of `publish_batch_detailed` through the cluster: one batch per shard,
    /// each to its shard's leader concurrently. A refusal (`not_leader`,
    /// `shard_unavailable`, no connection) is retried on the new leader with backoff until
    /// `request_timeout`; an unknown outcome (connection lost after sending,
    /// `quorum_timeout`) is returned at once, since re-sending could write it twice: use
    /// [`Client::idempotent_producer`] to have those re-sent too.
    pub(super) async fn publish_each_shard(
        &self,
        key: &StreamKey,
        messages: Arc<Vec<Message>>,
        ack: AckMode,
    ) -> Result<Vec<ShardOutcome>, ClientError> {
        let shards = self.shard_count_of(key, &self.budget()).await?;
        let plan = self.plan(&messages, shards);
        let compression = self.inner.config.compression;
        let now = publish::now_ms();
        let outcomes = publish::send_each(plan, false, |shard, indices| {
            let (cluster, key, messages) = (self.clone(), key.clone(), messages.clone());
            async move {
                let batch = publish::encode_batch(&messages, &indices, compression, now, None)?;
                cluster
                    .send_to_shard(&key, shard, batch, ack, false)
                    .await
                    .map_err(|f| f.error)
            }
        })
        .await;
        Ok(outcomes)
    }

    /// Publishes `messages` as one batch to `shard` and waits for the acknowledgement
    /// (`AckMode::Batch`), retrying as `publish_batch_detailed` does.
    pub async fn publish_to_shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        messages: &[Message],
    ) -> Result<Published, ClientError> {
        let batch = publish::encode_shard_batch(messages, self.inner.config.compression, None)?;
        let key = stream_key(tenant, namespace, stream);
        self.send_to_shard(&key, shard, batch, AckMode::Batch, false)
            .await
            .map_err(|f| f.error)?
            .ok_or_else(|| ClientError::Protocol("no acknowledgement".into()))
    }
}
