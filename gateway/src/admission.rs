//! Admission of a publish: each tenant's own publish slots, what happens when they are full,
//! and when an acknowledgement is sent.
//!
//! Each tenant has `pub_queue_depth` slots of its own, so a flooding tenant exhausts only its
//! own and queues behind itself, never behind another tenant. When its slots are full a
//! publish is refused with `publish_queue_full` (`overloaded`, retryable); one acknowledged
//! after the write waits for a slot up to `publish_queue_wait_timeout_ms` instead, and a
//! fire-and-forget one is shed (or waits, with `pub_ingress_wait`). Every outcome is counted
//! in `felix_publish_queue_full_total` by tenant and action.
//!
//! Invariant: a publish holds one slot of its own tenant from admission until it is answered
//! (or, unacknowledged, written); slots are never shared between tenants.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use felix_wire::protocol::{AckMode, ErrorBody, codes};
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::BrokerConfig;
use crate::errors::err;
use crate::metrics::{Metrics, TenantAction};

/// Per-tenant publish slots: each tenant gets `depth` of its own, so one tenant's flood
/// queues behind its own slots and never behind another tenant's.
pub struct TenantQueues {
    depth: usize,
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl TenantQueues {
    pub(crate) fn new(depth: usize) -> TenantQueues {
        TenantQueues {
            depth: depth.max(1),
            tenants: Mutex::new(HashMap::new()),
        }
    }
    fn of(&self, tenant: &str) -> Arc<Semaphore> {
        self.tenants
            .lock()
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.depth)))
            .clone()
    }
}

/// Whether a publish with `ack` is answered after the write (else on enqueue, or not at all
/// for `AckMode::None`).
pub(crate) fn acks_after_write(ack: AckMode, config: &BrokerConfig) -> bool {
    match ack {
        AckMode::Commit => true,
        AckMode::Batch => config.ack_on_commit,
        AckMode::None => false,
    }
}

impl TenantQueues {
    /// Takes one of the tenant's publish slots: `Ok(Some)` to go on, `Ok(None)` when a
    /// fire-and-forget publish was shed, `Err` when the publisher is told its queue is full.
    pub(crate) async fn admit(
        &self,
        tenant: &str,
        ack: AckMode,
        config: &BrokerConfig,
        metrics: &Metrics,
    ) -> Result<Option<OwnedSemaphorePermit>, ErrorBody> {
        let slots = self.of(tenant);
        let commit_ack = acks_after_write(ack, config);
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let action = match ack {
                    AckMode::None if !config.pub_ingress_wait => "shed",
                    // With pub_ingress_wait a fire-and-forget publish waits as a
                    // commit-acked one does.
                    AckMode::None => "waited",
                    _ if commit_ack => "waited",
                    _ => "rejected",
                };
                metrics
                    .publish_queue_full
                    .get_or_create(&TenantAction {
                        tenant: tenant.to_owned(),
                        action: action.to_owned(),
                    })
                    .inc();
                let full = || {
                    err(
                        codes::OVERLOADED,
                        "publish_queue_full",
                        format!(
                            "tenant {tenant}'s publish queue ({} slots) is full",
                            self.depth
                        ),
                    )
                    .retry_after(50)
                };
                match action {
                    "waited" => {
                        let wait = Duration::from_millis(config.publish_queue_wait_timeout_ms);
                        match tokio::time::timeout(wait, slots.acquire_owned()).await {
                            Ok(Ok(p)) => p,
                            // Nobody to tell: shed after all, and counted as such.
                            _ if ack == AckMode::None => {
                                metrics
                                    .publish_queue_full
                                    .get_or_create(&TenantAction {
                                        tenant: tenant.to_owned(),
                                        action: "shed".to_owned(),
                                    })
                                    .inc();
                                return Ok(None);
                            }
                            _ => return Err(full()),
                        }
                    }
                    "shed" => return Ok(None),
                    _ => return Err(full()),
                }
            }
        };
        Ok(Some(permit))
    }
}
