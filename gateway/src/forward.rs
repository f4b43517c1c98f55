//! Forwarding a publish: in a cluster, a publish that reaches a broker which does not lead
//! the shard is sent on to the leader over the internal network and answered with the
//! leader's answer.
//!
//! Invariant: a publish is forwarded at most once — except one held by an old leader across
//! a shard's hand-over, which that broker forwards once more, to the new leader — the leader checks it again as if the
//! client had sent it there (existence, limits, backpressure, leadership) and never forwards
//! it further; its tenant's publish quota is charged once, by the broker the client sent it
//! to, before it is forwarded, and never again by the leader; a failure to connect is a
//! refusal (nothing was sent), a failure after sending leaves the outcome unknown and says
//! so.

use std::time::Duration;

use bytes::Bytes;
use felix_meta::auth::{Action, Resource};
use felix_meta::model::ShardKey;
use felix_wire::protocol::{AckMode, ErrorBody, codes};
use serde::{Deserialize, Serialize};

use crate::broker::Broker;
use crate::groups::duty::BrokerDuty;
use crate::publish::{Publisher, QuotaCharge};
use crate::quota::PublishCost;
use crate::replication::transport::{PeerClient, PeerFailure};
use crate::shard::shard_key;

/// A publish forwarded by a broker that does not lead the shard (the batches are the body).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardedPublish {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u32,
    pub ack: AckMode,
    /// The token the client presented at the broker it reached: the owner verifies it and
    /// checks `stream.publish` again, so forwarding does not launder a credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A broker's own publish (no caller token): the duty it is for, checked by the owner
    /// against the control plane (`crate::groups::duty`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duty: Option<BrokerDuty>,
}

/// The owner's answer to a forwarded publish.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ForwardedAnswer {
    Published { base_offset: u64, last_offset: u64 },
    Done,
    Error { error: ErrorBody },
}

/// Header carrying a forwarded publish's JSON description.
const PUBLISH_HEADER: &str = "x-felix-publish";

/// Applies a publish another broker forwarded here (its description in the
/// [`PUBLISH_HEADER`], its batches in the body).
pub(crate) async fn serve_forwarded_publish(
    broker: &Broker,
    headers: &axum::http::HeaderMap,
    body: Bytes,
) -> ForwardedAnswer {
    let refuse = |message: String| ForwardedAnswer::Error {
        error: ErrorBody::new(codes::BAD_REQUEST, "bad_request", message),
    };
    let req: ForwardedPublish = match headers
        .get(PUBLISH_HEADER)
        .map(|v| serde_json::from_slice(v.as_bytes()))
    {
        Some(Ok(req)) => req,
        Some(Err(e)) => return refuse(format!("bad {PUBLISH_HEADER} header: {e}")),
        None => return refuse(format!("no {PUBLISH_HEADER} header")),
    };
    // Checked and applied here as if the client had sent it here: the caller's token,
    // existence, limits, backpressure, leadership. Never forwarded again, and not charged
    // to the tenant's quota again: the broker the client sent it to did that.
    let access = broker.access();
    if access.enabled() {
        let resource = Resource::stream(&req.tenant, &req.namespace, &req.stream);
        let checked = match (req.token.as_deref(), &req.duty) {
            (Some(token), _) => access
                .authenticate_cached(token)
                .and_then(|c| access.authorize(Some(&c), Action::StreamPublish, &resource)),
            // Signed by a broker of the cluster (checked before this handler): allowed what
            // its duty needs, nothing more.
            (None, Some(duty)) => {
                broker.check_duty(duty, (&req.tenant, &req.namespace, &req.stream))
            }
            (None, None) => access.authorize(None, Action::StreamPublish, &resource),
        };
        if let Err(error) = checked {
            broker.metrics().auth_refused(&error.reason);
            return ForwardedAnswer::Error { error };
        }
    }
    let key = ShardKey {
        tenant: req.tenant,
        namespace: req.namespace,
        stream: req.stream,
        shard: req.shard,
    };
    let mut result = broker
        .publish_here(&key, req.ack, body.clone(), QuotaCharge::Charged)
        .await;
    // Held here across a hand-over, and the shard is now led elsewhere: the one case a
    // publish is forwarded twice (the first hop reached the old leader).
    if let Err(e) = &result
        && e.code == codes::NOT_LEADER
        && e.reason == crate::moves::hold::MOVED
        && let Some(addr) = e.leader.and_then(|l| broker.node.internal_addr_of(l))
    {
        let timeout = Duration::from_millis(broker.node.config.publish_quorum_timeout_ms)
            + Duration::from_secs(5);
        broker.node.metrics.publishes_forwarded.inc();
        let again = ForwardedPublish {
            tenant: key.tenant.clone(),
            namespace: key.namespace.clone(),
            stream: key.stream.clone(),
            shard: key.shard,
            ack: req.ack,
            token: req.token.clone(),
            duty: req.duty.clone(),
        };
        result = forward_publish(&broker.node.peers, &addr, &again, body, timeout).await;
    }
    match result {
        Ok(Some((base_offset, last_offset))) => ForwardedAnswer::Published {
            base_offset,
            last_offset,
        },
        Ok(None) => ForwardedAnswer::Done,
        Err(error) => ForwardedAnswer::Error { error },
    }
}

impl Broker {
    /// Publishes the batches in `body` (one or more RecordBatch v2) to one shard. With
    /// `AckMode::None` nothing is answered (`Ok(None)`); otherwise the first and last
    /// offsets given.
    ///
    /// In a cluster, a publish for a shard another broker leads is forwarded to it over the
    /// internal network and answered with its answer (it is checked again there).
    ///
    /// The publish is charged to its tenant's publish quota here, forwarded or not.
    pub async fn publish(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        ack: AckMode,
        body: Bytes,
    ) -> Result<Option<(u64, u64)>, ErrorBody> {
        self.publish_by(
            Publisher::client(None),
            tenant,
            namespace,
            stream,
            shard_no,
            ack,
            body,
        )
        .await
    }

    /// [`publish`](Self::publish) for `by`: the caller's token travels with a forwarded
    /// publish to the shard's owner, which checks it again; a publish already charged to
    /// its tenant's quota (the Kafka listener throttles a produce itself) is not charged
    /// again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn publish_by(
        &self,
        by: Publisher<'_>,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        ack: AckMode,
        body: Bytes,
    ) -> Result<Option<(u64, u64)>, ErrorBody> {
        let target = (tenant, namespace, stream, shard_no);
        self.publish_for(by, None, target, ack, body).await
    }

    /// [`publish_by`](Self::publish_by) for a broker's own publish on `duty` (`by` has no
    /// token): forwarded, it names the duty for the owner to check.
    pub(crate) async fn publish_for(
        &self,
        by: Publisher<'_>,
        duty: Option<BrokerDuty>,
        (tenant, namespace, stream, shard_no): (&str, &str, &str, u32),
        ack: AckMode,
        body: Bytes,
    ) -> Result<Option<(u64, u64)>, ErrorBody> {
        let key = shard_key(tenant, namespace, stream, shard_no);
        let result = self.publish_here(&key, ack, body.clone(), by.quota).await;
        let leader = match &result {
            Err(e) if self.node.cluster && e.code == codes::NOT_LEADER => e.leader,
            _ => None,
        };
        let Some(addr) = leader.and_then(|l| self.node.internal_addr_of(l)) else {
            return result;
        };
        // Led elsewhere, so not charged above (leadership is checked first): charge it here,
        // once; the leader will not.
        if by.quota == QuotaCharge::Here {
            let cost = PublishCost::of(&body);
            if self
                .quotas
                .admit(tenant, ack, cost, &self.node.metrics)?
                .is_none()
            {
                return Ok(None);
            }
        }
        let req = ForwardedPublish {
            tenant: key.tenant,
            namespace: key.namespace,
            stream: key.stream,
            shard: key.shard,
            ack,
            token: by.token.map(str::to_owned),
            duty,
        };
        // Long enough for a Quorum acknowledgement at the owner.
        let timeout = Duration::from_millis(self.node.config.publish_quorum_timeout_ms)
            + Duration::from_secs(5);
        self.node.metrics.publishes_forwarded.inc();
        forward_publish(&self.node.peers, &addr, &req, body, timeout).await
    }
}

/// Forwards a publish to the shard's leader at `addr`. A failure to connect is a refusal
/// (nothing was sent); a failure after sending leaves the outcome unknown.
async fn forward_publish(
    peers: &PeerClient,
    addr: &str,
    req: &ForwardedPublish,
    body: Bytes,
    timeout: Duration,
) -> Result<Option<(u64, u64)>, ErrorBody> {
    let target = ForwardTarget {
        what: "the publish",
        whom: "the shard's leader",
        addr,
    };
    let header = serde_json::to_string(req).map_err(|e| target.unknown(e.to_string()))?;
    let mut headers = hyper::HeaderMap::new();
    headers.insert(
        PUBLISH_HEADER,
        hyper::header::HeaderValue::try_from(header).map_err(|e| target.unknown(e.to_string()))?,
    );
    let bytes = peers
        .send(addr, "/repl/publish", headers, body, timeout)
        .await
        .map_err(|f| target.refusal(f))?
        .body;
    match serde_json::from_slice::<ForwardedAnswer>(&bytes) {
        Ok(ForwardedAnswer::Published {
            base_offset,
            last_offset,
        }) => Ok(Some((base_offset, last_offset))),
        Ok(ForwardedAnswer::Done) => Ok(None),
        Ok(ForwardedAnswer::Error { error }) => Err(error),
        Err(e) => Err(target.unknown(format!("unreadable answer: {e}"))),
    }
}

/// Where a forwarded operation went, to word the caller's error.
pub(crate) struct ForwardTarget<'a> {
    /// What was forwarded ("the publish").
    pub what: &'a str,
    /// To whom ("the shard's leader").
    pub whom: &'a str,
    pub addr: &'a str,
}

impl ForwardTarget<'_> {
    /// The operation may have been carried out: the caller must not assume either way.
    pub(crate) fn unknown(&self, why: String) -> ErrorBody {
        ErrorBody::new(
            codes::INTERNAL,
            "forward_failed",
            format!(
                "forwarding {} to {} at {}: {why}; its outcome is unknown",
                self.what, self.whom, self.addr
            ),
        )
    }

    /// The caller's error for a forward that brought no answer: nothing sent is a
    /// retryable refusal, anything else leaves the outcome unknown.
    pub(crate) fn refusal(&self, failure: PeerFailure) -> ErrorBody {
        match failure {
            PeerFailure::Unsent(why) => ErrorBody::new(
                codes::SHARD_UNAVAILABLE,
                "leader_unreachable",
                format!("cannot reach {} at {}: {why}", self.whom, self.addr),
            )
            .retry_after(500),
            PeerFailure::Unknown(why) => self.unknown(why),
        }
    }
}
