//! A broker's own publishes: what a broker may write on its own account, and the check the
//! receiving broker makes.
//!
//! Decides who a publish is from when no client is behind it. A broker publishes on its own
//! account for one duty only: a consumer group's dead letter, which the broker leading the
//! source shard writes to the group's dead-letter stream. When another broker leads the
//! dead-letter shard, the publish is forwarded over the internal network with no caller
//! token; with `auth` on it then names its [`BrokerDuty`], and the owner allows it only if
//! the request is from a broker of the cluster (every internal request is signed with the
//! cluster secret and checked before any handler runs: `felix_meta::network::require_signed`)
//! and the control plane gives that duty: the named group exists and its dead-letter stream
//! is exactly the stream written to. Nothing else is allowed on a duty (docs/security.md).
//!
//! Invariant: a duty never widens what a client's token allows (a publish with a token is
//! checked against the token alone), and a duty allows writing to one stream: the group's
//! configured dead-letter stream.

use felix_meta::model::group_key;
use felix_wire::protocol::{ErrorBody, codes};
use serde::{Deserialize, Serialize};

use crate::broker::Broker;
use crate::errors::err;

/// Why a broker publishes on its own account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "duty", rename_all = "snake_case")]
pub enum BrokerDuty {
    /// A dead letter of group `group` of stream `tenant/namespace/stream`.
    DeadLetter {
        tenant: String,
        namespace: String,
        stream: String,
        group: String,
    },
}

impl Broker {
    /// Whether the control plane gives `duty` the right to publish to
    /// `tenant/namespace/stream` (called for a signed internal request only).
    pub(crate) fn check_duty(
        &self,
        duty: &BrokerDuty,
        (tenant, namespace, stream): (&str, &str, &str),
    ) -> Result<(), ErrorBody> {
        let BrokerDuty::DeadLetter {
            tenant: gt,
            namespace: gn,
            stream: gs,
            group,
        } = duty;
        let target = format!("{tenant}/{namespace}/{stream}");
        let configured = self.node.meta.local(|s| {
            s.groups
                .get(&group_key(gt, gn, gs, group))
                .and_then(|g| g.settings.dead_letter.clone())
        });
        if configured.as_deref() == Some(target.as_str()) {
            return Ok(());
        }
        Err(err(
            codes::FORBIDDEN,
            "duty_not_allowed",
            format!(
                "group {gt}/{gn}/{gs}/{group} does not dead-letter to {target}: a broker may \
                 publish on its own account only to a group's configured dead-letter stream"
            ),
        ))
    }
}
