//! Stream management: creating, altering, describing, listing and deleting streams, and
//! the settings a stream takes from the protocol and the broker's defaults.
//!
//! Every change goes through the control plane; the answer is read back from the registry
//! once this broker has applied the change. An alter applies new rolling and retention
//! settings to the open shards at once. A delete closes the stream's shards here and removes
//! its files; its objects are removed by the Raft leader's broker (`object_deletes`).
//!
//! Invariant: durability never changes on a live stream; a stream's settings are the
//! registry's, never a copy kept here.

use std::sync::atomic::Ordering;
use std::time::Duration;

use felix_cold::cache::ObjectRef;
use felix_cold::tiered::{TieredShard, upload_backlog};
use felix_meta::model::{Command, Consistency, Durability, StreamSettings, StreamSettingsPatch};
use felix_wire::protocol::{ErrorBody, SegmentInfo, ShardInfo, StreamConfig, StreamInfo, codes};
use tracing::warn;

use crate::broker::{Broker, StreamShape};
use crate::errors::err;
use crate::node::require_namespace;
use crate::shard::shard_key;

fn settings_to_config(s: &StreamSettings) -> StreamConfig {
    StreamConfig {
        durable: Some(s.durability == Durability::Durable),
        consistency: Some(
            match s.consistency {
                Consistency::Leader => "leader",
                Consistency::Quorum => "quorum",
            }
            .to_owned(),
        ),
        replicas: Some(s.replicas),
        shards: Some(s.shards),
        segment_bytes: Some(s.segment_bytes),
        segment_ms: Some(s.segment_ms),
        retention_ms: Some(s.retention_ms.unwrap_or(0)),
        retention_bytes: Some(s.retention_bytes.unwrap_or(0)),
        hot_retention_ms: Some(s.hot_retention_ms.unwrap_or(HOT_UNLIMITED)),
        hot_retention_bytes: Some(s.hot_retention_bytes.unwrap_or(HOT_UNLIMITED)),
        tiered: Some(s.tiered),
    }
}

fn consistency(s: &str) -> Result<Consistency, ErrorBody> {
    match s {
        "leader" => Ok(Consistency::Leader),
        "quorum" => Ok(Consistency::Quorum),
        other => Err(err(
            codes::INVALID_ARGUMENT,
            "invalid_argument",
            format!("consistency {other:?} is not leader or quorum"),
        )),
    }
}

/// A total-retention setting from the protocol: `0` means no limit.
fn limit(v: Option<u64>) -> Option<Option<u64>> {
    v.map(|v| (v > 0).then_some(v))
}

/// A hot-retention setting from the protocol: `0` keeps no uploaded segment locally, and
/// [`HOT_UNLIMITED`] (`u64::MAX`) means no limit.
fn hot_limit(v: Option<u64>) -> Option<Option<u64>> {
    v.map(|v| (v != HOT_UNLIMITED).then_some(v))
}

const HOT_UNLIMITED: u64 = u64::MAX;

impl Broker {
    pub async fn create_tenant(&self, name: &str) -> Result<(), ErrorBody> {
        self.node
            .propose(Command::CreateTenant {
                name: name.to_owned(),
            })
            .await
            .map(|_| ())
    }

    pub async fn create_namespace(&self, tenant: &str, name: &str) -> Result<(), ErrorBody> {
        self.node
            .propose(Command::CreateNamespace {
                tenant: tenant.to_owned(),
                name: name.to_owned(),
            })
            .await
            .map(|_| ())
    }

    pub async fn create_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        config: StreamConfig,
    ) -> Result<StreamInfo, ErrorBody> {
        if crate::cache::names::is_cache_stream(name) {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                format!(
                    "stream names starting {:?} are the caches' own",
                    crate::cache::names::CACHE_STREAM_PREFIX
                ),
            ));
        }
        let d = StreamSettings::default();
        let settings = StreamSettings {
            // The spec: a stream is ephemeral unless declared durable.
            durability: if config.durable.unwrap_or(false) {
                Durability::Durable
            } else {
                Durability::Ephemeral
            },
            consistency: config
                .consistency
                .as_deref()
                .map(consistency)
                .transpose()?
                .unwrap_or_default(),
            // Three copies in a cluster (fewer if it is smaller), one on a single node.
            replicas: config
                .replicas
                .unwrap_or(self.node.config.cluster.len().clamp(1, 3) as u32),
            shards: config.shards.unwrap_or(1),
            segment_bytes: config
                .segment_bytes
                .unwrap_or(self.node.config.segment_bytes),
            segment_ms: config.segment_ms.unwrap_or(self.node.config.segment_ms),
            retention_ms: limit(config.retention_ms).flatten(),
            retention_bytes: limit(config.retention_bytes).flatten(),
            hot_retention_ms: hot_limit(config.hot_retention_ms).flatten(),
            hot_retention_bytes: hot_limit(config.hot_retention_bytes).flatten(),
            tiered: config.tiered.unwrap_or(d.tiered),
        };
        self.node
            .propose(Command::CreateStream {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                settings,
            })
            .await?;
        self.describe_stream(tenant, namespace, name).await
    }

    pub async fn alter_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        config: StreamConfig,
    ) -> Result<StreamInfo, ErrorBody> {
        if config.durable.is_some() {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                "durability cannot be changed on a live stream",
            ));
        }
        let patch = StreamSettingsPatch {
            consistency: config.consistency.as_deref().map(consistency).transpose()?,
            replicas: config.replicas,
            shards: config.shards,
            segment_bytes: config.segment_bytes,
            segment_ms: config.segment_ms,
            retention_ms: limit(config.retention_ms),
            retention_bytes: limit(config.retention_bytes),
            hot_retention_ms: hot_limit(config.hot_retention_ms),
            hot_retention_bytes: hot_limit(config.hot_retention_bytes),
            tiered: config.tiered,
        };
        self.node
            .propose(Command::AlterStream {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                patch,
                expected_version: None,
            })
            .await?;
        let info = self.describe_stream(tenant, namespace, name).await?;
        // Apply rolling and retention settings to open shard logs at once.
        for shard in self.shards.of_stream(tenant, namespace, name) {
            if let Some(log) = &shard.log {
                let c = info.config.clone();
                log.alter(|l| {
                    l.segment_bytes = c.segment_bytes.unwrap_or(l.segment_bytes);
                    l.segment_age = c.segment_ms.map(Duration::from_millis);
                });
            }
            // New retention settings apply now rather than at the next periodic pass.
            shard.retention_now.notify_one();
        }
        Ok(info)
    }

    fn info(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        version: u64,
        settings: &StreamSettings,
    ) -> StreamInfo {
        let shards = (0..settings.shards)
            .filter_map(|k| {
                let key = shard_key(tenant, namespace, name, k);
                let shard = self.shards.get(&key)?;
                Some(match &shard.tier {
                    Some(tier) => shard_info(k, tier),
                    None => ShardInfo {
                        shard: k,
                        first_offset: 0,
                        next_offset: shard.ephemeral_next.load(Ordering::Acquire),
                        hot_first_offset: 0,
                        hot_bytes: 0,
                        cold_bytes: 0,
                        uploaded_end: 0,
                        upload_backlog_segments: 0,
                        upload_backlog_bytes: 0,
                    },
                })
            })
            .collect();
        let stats = self.shards.cold_cache.stats();
        StreamInfo {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            version,
            config: settings_to_config(settings),
            shards,
            cache_hits: stats.hits.load(Ordering::Relaxed),
            cache_misses: stats.misses.load(Ordering::Relaxed),
        }
    }

    /// A stream's segments and objects, per shard, oldest first.
    pub async fn list_segments(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<SegmentInfo>, ErrorBody> {
        self.shards.open_stream(tenant, namespace, name)?;
        let (_, settings) = self.node.stream_settings(tenant, namespace, name)?;
        let mut out = Vec::new();
        for k in 0..settings.shards {
            let key = shard_key(tenant, namespace, name, k);
            if !self.node.holds_replica(&key) {
                continue;
            }
            let (shard, _) = self.shards.open(&key)?;
            if let Some(tier) = &shard.tier {
                out.extend(segment_infos(k, tier));
            }
        }
        Ok(out)
    }

    pub async fn describe_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<StreamInfo, ErrorBody> {
        self.shards.open_stream(tenant, namespace, name)?;
        let (version, settings) = self.node.stream_settings(tenant, namespace, name)?;
        Ok(self.info(tenant, namespace, name, version, &settings))
    }

    pub async fn list_streams(
        &self,
        tenant: &str,
        namespace: &str,
    ) -> Result<Vec<StreamInfo>, ErrorBody> {
        let streams: Vec<_> = {
            let reg = self.node.registry.borrow();
            require_namespace(&reg, tenant, namespace)?;
            reg.streams
                .values()
                // A cache's stream is listed as a cache (`cache list`), not as a stream.
                .filter(|s| s.tenant == tenant && s.namespace == namespace)
                .filter(|s| !crate::cache::names::is_cache_stream(&s.name))
                .map(|s| (s.name.clone(), s.version, s.settings.clone()))
                .collect()
        };
        Ok(streams
            .iter()
            .map(|(name, v, s)| self.info(tenant, namespace, name, *v, s))
            .collect())
    }

    pub async fn delete_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), ErrorBody> {
        // The objects the manifest names, to drop from the cache once the stream is gone.
        let objects: Vec<ObjectRef> = self.node.meta.local(|s| {
            s.manifests
                .iter()
                .filter(|(k, _)| k.tenant == tenant && k.namespace == namespace && k.stream == name)
                .flat_map(|(_, m)| m.values().filter_map(ObjectRef::of))
                .collect()
        });
        self.node
            .propose(Command::DeleteStream {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
            .await?;
        self.shards.retire_stream(tenant, namespace, name);
        // The objects themselves are removed by the Raft leader's broker, which frees the
        // name once they are gone (object_deletes.rs); this broker drops what it cached.
        for object in &objects {
            self.shards.cold_cache.forget(object);
        }
        let dir = self.shards.stream_dir(tenant, namespace, name);
        if dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            warn!(dir = %dir.display(), error = %e, "could not remove a deleted stream's data");
        }
        Ok(())
    }

    /// A stream's name, shard count and durability, from the local registry (no shard is
    /// opened).
    pub fn stream_shape(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<StreamShape, ErrorBody> {
        let (version, settings) = self.node.stream_settings(tenant, namespace, name)?;
        Ok(StreamShape {
            name: name.to_owned(),
            shards: settings.shards,
            durable: settings.durability == Durability::Durable,
            version,
        })
    }

    /// Every stream of a namespace, as [`Broker::stream_shape`] describes them, by name.
    pub fn stream_shapes(
        &self,
        tenant: &str,
        namespace: &str,
    ) -> Result<Vec<StreamShape>, ErrorBody> {
        let reg = self.node.registry.borrow();
        require_namespace(&reg, tenant, namespace)?;
        let mut out: Vec<StreamShape> = reg
            .streams
            .values()
            .filter(|s| s.tenant == tenant && s.namespace == namespace)
            // Caches' streams are not topics a Kafka client lists.
            .filter(|s| !crate::cache::names::is_cache_stream(&s.name))
            .map(|s| StreamShape {
                name: s.name.clone(),
                shards: s.settings.shards,
                durable: s.settings.durability == Durability::Durable,
                version: s.version,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// A durable shard's offsets and tier sizes.
fn shard_info(k: u32, tier: &TieredShard) -> ShardInfo {
    let m = tier.manifest.snapshot();
    let uploaded_end = m.uploaded_end();
    let (backlog_n, backlog_bytes) = upload_backlog(&tier.log, uploaded_end);
    ShardInfo {
        shard: k,
        first_offset: tier.earliest_offset(),
        next_offset: tier.log.committed_offset(),
        hot_first_offset: tier.log.first_offset(),
        hot_bytes: tier.log.size_bytes(),
        cold_bytes: m.cold_bytes(),
        uploaded_end,
        upload_backlog_segments: backlog_n,
        upload_backlog_bytes: backlog_bytes,
    }
}

/// A durable shard's objects, then its local segments not covered by them.
fn segment_infos(k: u32, tier: &TieredShard) -> Vec<SegmentInfo> {
    let m = tier.manifest.snapshot();
    let hot_first = tier.log.first_offset();
    let uploaded_end = m.uploaded_end();
    let mut out: Vec<SegmentInfo> = m
        .objects
        .values()
        .map(|e| SegmentInfo {
            shard: k,
            base_offset: e.base_offset,
            last_offset: e.last_offset,
            min_timestamp: e.min_timestamp,
            max_timestamp: e.max_timestamp,
            size_bytes: e.size_bytes,
            tier: "cold".into(),
            object_key: e.object_key.clone(),
            local: e.last_offset >= hot_first,
        })
        .collect();
    let sealed = tier.log.sealed_segments();
    let mut first_pending = true;
    for s in &sealed {
        if s.last_offset < uploaded_end {
            continue;
        }
        out.push(SegmentInfo {
            shard: k,
            base_offset: s.base_offset.max(uploaded_end),
            last_offset: s.last_offset,
            min_timestamp: s.min_timestamp,
            max_timestamp: s.max_timestamp,
            size_bytes: s.size_bytes,
            tier: if first_pending { "uploading" } else { "hot" }.into(),
            object_key: None,
            local: true,
        });
        first_pending = false;
    }
    let offsets = tier.log.offsets();
    let active_base = out
        .last()
        .map_or(hot_first.max(uploaded_end), |s| s.last_offset + 1);
    if offsets.committed > active_base {
        // The active segment's record times, as its help and `felixctl segments` promise
        // (-1 only if the records seen are in a segment sealed meanwhile).
        let active = tier.log.active_segment();
        out.push(SegmentInfo {
            shard: k,
            base_offset: active_base,
            last_offset: offsets.committed - 1,
            min_timestamp: active.as_ref().map_or(-1, |a| a.min_timestamp),
            max_timestamp: active.as_ref().map_or(-1, |a| a.max_timestamp),
            size_bytes: tier
                .log
                .size_bytes()
                .saturating_sub(sealed.iter().map(|s| s.size_bytes).sum()),
            tier: "hot".into(),
            object_key: None,
            local: true,
        });
    }
    out
}
