//! Deleting a durable shard's oldest records up to an offset (Kafka's DeleteRecords): the
//! shard's retention floor, raised through the control plane as total retention raises it.
//!
//! Decides where the floor lands and what goes. The floor is recorded with the manifest's
//! trim (`TrimManifest`), so every broker and both tiers agree on the earliest readable
//! offset at once: reads below it are `offset_too_old` from then on. Objects wholly below
//! it leave the manifest and are deleted from the store, and local segments wholly below it
//! are deleted now (not at the next retention pass).
//!
//! The invariant: the uploader's next object starts where the manifest ends, at a batch
//! boundary. So on a tiered stream a floor past everything uploaded stops at the start of
//! the batch holding the offset (the answer's low watermark says where); elsewhere the
//! floor is the offset asked for.

use felix_cold::ColdError;
use felix_cold::ManifestKeeper;
use felix_wire::BatchHeader;
use felix_wire::protocol::{ErrorBody, codes};

use crate::broker::Broker;
use crate::errors::{cold_error, err};
use crate::shard::shard_key;

impl Broker {
    /// Raises a durable shard's floor to `below` (`None`: its high watermark), on the broker
    /// that leads the shard. The shard's earliest offset afterwards.
    pub async fn delete_records(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        below: Option<u64>,
    ) -> Result<u64, ErrorBody> {
        let (shard, tier) = self.durable_tier(&shard_key(tenant, namespace, stream, shard_no))?;
        let high_watermark = shard.visible_end();
        let below = below.unwrap_or(high_watermark);
        if below > high_watermark {
            return Err(err(
                codes::OFFSET_OUT_OF_RANGE,
                "offset_out_of_range",
                format!(
                    "cannot delete records below {below}: the partition ends at {high_watermark}"
                ),
            ));
        }
        let tiered = self.shards.open(&tier.key)?.1.tiered;
        let mut floor = below;
        if tiered && below > tier.manifest.uploaded_end() && below < high_watermark {
            let read = tier.log.read(below, 1, Some(high_watermark)).map_err(|e| {
                cold_error(&ColdError::Inconsistent(format!(
                    "read the batch holding {below}: {e}"
                )))
            })?;
            if let Ok(h) = BatchHeader::parse(&read.batches) {
                floor = (h.base_offset as u64).max(tier.manifest.uploaded_end());
            }
        }
        if floor <= tier.earliest_offset() {
            return Ok(tier.earliest_offset());
        }
        let removed = self
            .node
            .meta
            .trim(&tier.key, floor)
            .await
            .map_err(|e| cold_error(&felix_cold::ColdError::from(e)))?
            .unwrap_or_default();
        tier.manifest.trim(floor);
        for entry in &removed {
            // No manifest names these objects any more: deleting them only frees space, and
            // a failure leaves an orphan, logged.
            let (Some(objref), Some(cache)) =
                (felix_cold::cache::ObjectRef::of(entry), tier.cache())
            else {
                continue;
            };
            cache.forget(&objref);
            if let Err(e) = cache.store().delete(&objref.key).await {
                tracing::warn!(shard = %tier.key, key = objref.key, error = %e, "could not delete an object below a DeleteRecords floor; it is orphaned");
            }
        }
        // Whole local segments below the floor go now; the rest of the segment holding it
        // stays on disk, unreadable, until retention removes that segment.
        let local_floor = if tiered {
            floor.min(tier.manifest.uploaded_end())
        } else {
            floor
        };
        if let Err(e) = tier.log.enforce_retention_with_floor(0, local_floor) {
            tracing::warn!(shard = %tier.key, error = %e, "could not delete local segments below a DeleteRecords floor; retention will");
        }
        tracing::info!(shard = %tier.key, floor, objects = removed.len(), "records deleted below the floor");
        Ok(tier.earliest_offset())
    }
}
