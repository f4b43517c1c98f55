//! Single-writer fencing on the client (docs/groups.md, "Single-writer projections"):
//! `publish_if` writes only at the shard's expected next offset, following the shard's
//! leader; a refusal says the actual next offset ([`ClientError::next_offset`]).

use std::time::Duration;

use felix_wire::Compression;
use felix_wire::protocol::{Request, Response};

use super::Client;
use crate::publish::{Message, Published, encode_shard_batch};
use crate::{ClientError, stream_key};

impl Client {
    /// Publishes `messages` as one batch to `shard` only if the shard's next offset is
    /// `expected_offset`; otherwise nothing is written and the error is
    /// `expected_offset_mismatch` with the actual next offset.
    ///
    /// ```no_run
    /// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
    /// use felix_client::{Message, codes};
    /// match client.publish_if("acme", "prod", "totals", 0, 42, vec![Message::new("sum=7")]).await {
    ///     Ok(p) => println!("written at {}", p.base_offset),
    ///     Err(e) if e.code() == Some(codes::EXPECTED_OFFSET_MISMATCH) => {
    ///         println!("another writer got there first; the shard is at {:?}", e.next_offset());
    ///     }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn publish_if(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        expected_offset: u64,
        messages: Vec<Message>,
    ) -> Result<Published, ClientError> {
        let batch = encode_shard_batch(&messages, Compression::None, None)?;
        let request = Request::PublishIf {
            tenant: tenant.into(),
            namespace: namespace.into(),
            stream: stream.into(),
            shard,
            expected_offset,
        };
        let key = stream_key(tenant, namespace, stream);
        // Not re-sent after an unknown outcome: the writer reads the shard to learn whether
        // it landed (a re-send would be refused anyway once it had).
        let response = self
            .on_shard_leader_with(&key, shard, &request, batch, Duration::ZERO, false)
            .await?
            .0;
        match response {
            Response::Published {
                shard,
                base_offset,
                last_offset,
            } => Ok(Published {
                shard,
                base_offset,
                last_offset,
            }),
            other => Err(ClientError::Protocol(format!(
                "unexpected answer to publish_if: {other:?}"
            ))),
        }
    }
}
