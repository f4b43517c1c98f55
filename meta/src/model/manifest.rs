//! A shard's segment manifest: which segments and objects hold its records, and in which
//! tier.
//!
//! Decides which manifest changes are valid. The invariants: entries never overlap; an
//! uploaded object is recorded only where the manifest ends (or, for the first, at or above
//! the shard's floor), so two uploaders racing for one range cannot both succeed and the
//! cold tier has no gap and no overlap; a cold segment always names its object; and total
//! retention only raises the floor, answering the entries it removed so their objects can
//! be deleted once that is committed.

use std::collections::BTreeSet;

use super::command::Applied;
use super::errors::{CommandError, exists, missing};
use super::names::ShardKey;
use super::state::{MetaState, SegmentEntry, TierState};

impl MetaState {
    /// [`Command::AddSegment`](super::Command::AddSegment).
    pub(super) fn add_segment(
        &mut self,
        shard: &ShardKey,
        segment: &SegmentEntry,
    ) -> Result<Applied, CommandError> {
        self.require_shard(shard)?;
        if segment.last_offset < segment.base_offset {
            return Err(CommandError::Invalid(
                "segment ends before it starts".into(),
            ));
        }
        let manifest = self.manifests.entry(shard.clone()).or_default();
        let overlaps = manifest
            .range(..=segment.last_offset)
            .next_back()
            .is_some_and(|(_, s)| s.last_offset >= segment.base_offset);
        if overlaps {
            return Err(exists(
                "segment",
                format!("{shard}@{}..={}", segment.base_offset, segment.last_offset),
            ));
        }
        manifest.insert(segment.base_offset, segment.clone());
        Ok(Applied::Done)
    }

    /// [`Command::SetSegmentTier`](super::Command::SetSegmentTier).
    pub(super) fn set_segment_tier(
        &mut self,
        shard: &ShardKey,
        base_offset: u64,
        tier: TierState,
        object_key: &Option<String>,
        checksum: &Option<String>,
    ) -> Result<Applied, CommandError> {
        let seg = self.segment_mut(shard, base_offset)?;
        if matches!(tier, TierState::Cold) && object_key.is_none() && seg.object_key.is_none() {
            return Err(CommandError::Invalid(
                "a cold segment needs its object key".into(),
            ));
        }
        seg.tier = tier;
        if object_key.is_some() {
            seg.object_key = object_key.clone();
        }
        if checksum.is_some() {
            seg.checksum = checksum.clone();
        }
        Ok(Applied::Done)
    }

    /// [`Command::SetSegmentCopies`](super::Command::SetSegmentCopies).
    pub(super) fn set_segment_copies(
        &mut self,
        shard: &ShardKey,
        base_offset: u64,
        brokers: &BTreeSet<u64>,
    ) -> Result<Applied, CommandError> {
        let seg = self.segment_mut(shard, base_offset)?;
        seg.local_copies = brokers.clone();
        Ok(Applied::Done)
    }

    /// [`Command::RemoveSegment`](super::Command::RemoveSegment).
    pub(super) fn remove_segment(
        &mut self,
        shard: &ShardKey,
        base_offset: u64,
    ) -> Result<Applied, CommandError> {
        let manifest = self
            .manifests
            .get_mut(shard)
            .ok_or_else(|| missing("shard", shard.to_string()))?;
        manifest
            .remove(&base_offset)
            .ok_or_else(|| missing("segment", format!("{shard}@{base_offset}")))?;
        Ok(Applied::Done)
    }

    /// [`Command::RecordObject`](super::Command::RecordObject).
    pub(super) fn record_object(
        &mut self,
        shard: &ShardKey,
        segment: &SegmentEntry,
    ) -> Result<Applied, CommandError> {
        self.require_shard(shard)?;
        if segment.last_offset < segment.base_offset {
            return Err(CommandError::Invalid("object ends before it starts".into()));
        }
        if segment.tier != TierState::Cold || segment.object_key.is_none() {
            return Err(CommandError::Invalid(
                "a recorded object is cold and has an object key".into(),
            ));
        }
        let floor = self.manifest_floors.get(shard).copied().unwrap_or(0);
        let manifest = self.manifests.entry(shard.clone()).or_default();
        let fits = match manifest.values().next_back() {
            Some(last) => segment.base_offset == last.last_offset + 1,
            None => segment.base_offset >= floor,
        };
        if !fits {
            let next = manifest
                .values()
                .next_back()
                .map_or(floor, |l| l.last_offset + 1);
            return Err(exists(
                "object range",
                format!(
                    "{shard}@{}..={} (the manifest continues at {next})",
                    segment.base_offset, segment.last_offset
                ),
            ));
        }
        manifest.insert(segment.base_offset, segment.clone());
        Ok(Applied::Done)
    }

    /// [`Command::TrimManifest`](super::Command::TrimManifest).
    pub(super) fn trim_manifest(
        &mut self,
        shard: &ShardKey,
        below: u64,
    ) -> Result<Applied, CommandError> {
        self.require_shard(shard)?;
        let floor = self.manifest_floors.entry(shard.clone()).or_insert(0);
        *floor = (*floor).max(below);
        let mut removed = Vec::new();
        if let Some(manifest) = self.manifests.get_mut(shard) {
            while let Some(entry) = manifest.first_entry() {
                if entry.get().last_offset >= below {
                    break;
                }
                removed.push(entry.remove());
            }
        }
        Ok(Applied::Trimmed { removed })
    }

    fn segment_mut(
        &mut self,
        shard: &ShardKey,
        base: u64,
    ) -> Result<&mut SegmentEntry, CommandError> {
        self.manifests
            .get_mut(shard)
            .and_then(|m| m.get_mut(&base))
            .ok_or_else(|| missing("segment", format!("{shard}@{base}")))
    }
}
