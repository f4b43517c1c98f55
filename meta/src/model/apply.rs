//! Applying a command to the state: the one place a change is validated.
//!
//! Decides what a valid change is. Every command is validated here, inside the state
//! machine, against the state it is applied to — so a stream in an unknown namespace, a
//! second creation of the same stream or an alter against a stale version is refused the
//! same way on every node, whatever API sent it. The invariant: a refused command still
//! occupies its log entry and changes nothing; its [`CommandError`] is the answer to the
//! proposer. Tenants, namespaces, streams, brokers, producer ids and features are applied
//! here; placement and replication reports in `epochs.rs`, the manifest in `manifest.rs`.

use std::collections::BTreeSet;

use super::command::{Applied, Command};
use super::errors::{CommandError, exists, missing};
use super::names::{ShardKey, check_name, stream_key};
use super::settings::{Durability, Validate};
use super::state::{MetaState, Stream};

impl MetaState {
    /// Applies one command: validates it against the current state and, if valid, changes
    /// the state. A refused command leaves the state exactly as it was.
    pub fn apply(&mut self, cmd: &Command) -> Result<Applied, CommandError> {
        match cmd {
            Command::CreateTenant { name } => {
                check_name("tenant", name)?;
                if self.tenants.contains_key(name) {
                    return Err(exists("tenant", name));
                }
                self.tenants.insert(name.clone(), BTreeSet::new());
                Ok(Applied::Done)
            }
            Command::DeleteTenant { name } => {
                let ns = self
                    .tenants
                    .get(name)
                    .ok_or_else(|| missing("tenant", name))?;
                if !ns.is_empty() {
                    return Err(CommandError::NotEmpty {
                        kind: "tenant".into(),
                        name: name.clone(),
                    });
                }
                self.tenants.remove(name);
                Ok(Applied::Done)
            }
            Command::CreateNamespace { tenant, name } => {
                check_name("namespace", name)?;
                let ns = self
                    .tenants
                    .get_mut(tenant)
                    .ok_or_else(|| missing("tenant", tenant))?;
                if !ns.insert(name.clone()) {
                    return Err(exists("namespace", format!("{tenant}/{name}")));
                }
                Ok(Applied::Done)
            }
            Command::DeleteNamespace { tenant, name } => {
                let ns = self
                    .tenants
                    .get(tenant)
                    .ok_or_else(|| missing("tenant", tenant))?;
                if !ns.contains(name) {
                    return Err(missing("namespace", format!("{tenant}/{name}")));
                }
                let prefix = format!("{tenant}/{name}/");
                if self.streams.keys().any(|k| k.starts_with(&prefix)) {
                    return Err(CommandError::NotEmpty {
                        kind: "namespace".into(),
                        name: format!("{tenant}/{name}"),
                    });
                }
                if let Some(ns) = self.tenants.get_mut(tenant) {
                    ns.remove(name);
                }
                Ok(Applied::Done)
            }
            Command::CreateStream {
                tenant,
                namespace,
                name,
                settings,
            } => {
                check_name("stream", name)?;
                self.require_namespace(tenant, namespace)?;
                settings.validate()?;
                let key = stream_key(tenant, namespace, name);
                if self.streams.contains_key(&key) {
                    return Err(exists("stream", key));
                }
                if self.deleting_objects.contains(&key) {
                    return Err(CommandError::BeingDeleted { name: key });
                }
                self.stream_incarnations += 1;
                self.streams.insert(
                    key,
                    Stream {
                        tenant: tenant.clone(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                        version: 1,
                        settings: settings.clone(),
                        history: Vec::new(),
                        incarnation: self.stream_incarnations,
                    },
                );
                self.place_new_shards(tenant, namespace, name, 0..settings.shards);
                Ok(Applied::StreamVersion { version: 1 })
            }
            Command::AlterStream {
                tenant,
                namespace,
                name,
                patch,
                expected_version,
            } => {
                let key = stream_key(tenant, namespace, name);
                let stream = self
                    .streams
                    .get_mut(&key)
                    .ok_or_else(|| missing("stream", &key))?;
                if let Some(expected) = expected_version
                    && *expected != stream.version
                {
                    return Err(CommandError::VersionConflict {
                        expected: *expected,
                        actual: stream.version,
                    });
                }
                let next = patch.apply_to(&stream.settings)?;
                let (old_shards, new_shards) = (stream.settings.shards, next.shards);
                let old = std::mem::replace(&mut stream.settings, next);
                stream.history.push(old);
                stream.version += 1;
                let version = stream.version;
                self.place_new_shards(tenant, namespace, name, old_shards..new_shards);
                Ok(Applied::StreamVersion { version })
            }
            Command::DeleteStream {
                tenant,
                namespace,
                name,
            } => {
                let key = stream_key(tenant, namespace, name);
                let Some(stream) = self.streams.remove(&key) else {
                    return Err(missing("stream", key));
                };
                // Only a durable stream can have written objects.
                if stream.settings.durability == Durability::Durable {
                    self.deleting_objects.insert(key);
                }
                let gone = |k: &ShardKey| {
                    k.tenant == *tenant && k.namespace == *namespace && k.stream == *name
                };
                self.placements.retain(|k, _| !gone(k));
                self.replication.retain(|k, _| !gone(k));
                self.manifests.retain(|k, _| !gone(k));
                self.manifest_floors.retain(|k, _| !gone(k));
                self.drop_groups_of(tenant, namespace, name);
                Ok(Applied::Done)
            }
            Command::ObjectsDeleted {
                tenant,
                namespace,
                name,
            } => {
                // Idempotent: a broker that finished after another did changes nothing.
                self.deleting_objects
                    .remove(&stream_key(tenant, namespace, name));
                Ok(Applied::Done)
            }
            Command::RegisterBroker { broker } => {
                if broker.internal_addr.is_empty() || broker.client_addr.is_empty() {
                    return Err(CommandError::Invalid(
                        "a broker needs client and internal addresses".into(),
                    ));
                }
                // Re-registration (a restart, an address change) replaces the entry; a drain
                // outlives the restart that maintenance usually is.
                let mut broker = broker.clone();
                broker.draining = self.brokers.get(&broker.id).is_some_and(|b| b.draining);
                self.brokers.insert(broker.id, broker);
                Ok(Applied::Done)
            }
            Command::SetBrokerAlive { id, alive } => {
                let b = self
                    .brokers
                    .get_mut(id)
                    .ok_or_else(|| missing("broker", id.to_string()))?;
                b.alive = *alive;
                Ok(Applied::Done)
            }
            Command::RemoveBroker { id } => self.remove_broker(*id),
            Command::ForceLeader {
                shard,
                generation,
                to,
                end,
            } => self.force_leader(shard, *generation, *to, *end),
            Command::SetPlacement {
                shard,
                replicas,
                leader,
            } => self.set_placement(shard, replicas, *leader),
            Command::ReportReplicas {
                shard,
                generation,
                committed,
                in_sync,
            } => self.report_replicas(shard, *generation, *committed, in_sync),
            Command::AddSegment { shard, segment } => self.add_segment(shard, segment),
            Command::SetSegmentTier {
                shard,
                base_offset,
                tier,
                object_key,
                checksum,
            } => self.set_segment_tier(shard, *base_offset, *tier, object_key, checksum),
            Command::SetSegmentCopies {
                shard,
                base_offset,
                brokers,
            } => self.set_segment_copies(shard, *base_offset, brokers),
            Command::RemoveSegment { shard, base_offset } => {
                self.remove_segment(shard, *base_offset)
            }
            Command::RecordObject { shard, segment } => self.record_object(shard, segment),
            Command::TrimManifest { shard, below } => self.trim_manifest(shard, *below),
            Command::AllocateProducerIds { count } => {
                if *count == 0 {
                    return Err(CommandError::Invalid(
                        "allocate at least one producer id".into(),
                    ));
                }
                let first = self.next_producer_id;
                self.next_producer_id = first
                    .checked_add(*count as i64)
                    .ok_or_else(|| CommandError::Invalid("producer ids exhausted".into()))?;
                Ok(Applied::ProducerIds {
                    first,
                    count: *count,
                })
            }
            Command::FinalizeFeature { name, level } => {
                check_name("feature", name)?;
                let current = self.features.get(name).copied().unwrap_or(0);
                if *level < current {
                    return Err(CommandError::Invalid(format!(
                        "feature {name} is finalized at level {current}; levels never go down"
                    )));
                }
                self.features.insert(name.clone(), *level);
                Ok(Applied::Done)
            }
            Command::AddSigningKey { .. }
            | Command::PutRole { .. }
            | Command::DeleteRole { .. }
            | Command::BindRole { .. }
            | Command::UnbindRole { .. }
            | Command::RevokeToken { .. }
            | Command::SetBootstrapToken { .. }
            | Command::PutOidcIssuer { .. }
            | Command::DeleteOidcIssuer { .. } => self.apply_auth(cmd),
            Command::CreateGroup {
                tenant,
                namespace,
                stream,
                name,
                settings,
                created_ms,
            } => self.create_group(tenant, namespace, stream, name, settings, *created_ms),
            Command::AlterGroup {
                tenant,
                namespace,
                stream,
                name,
                settings,
            } => self.alter_group(tenant, namespace, stream, name, settings),
            Command::DeleteGroup {
                tenant,
                namespace,
                stream,
                name,
            } => self.delete_group(tenant, namespace, stream, name),
            Command::StartMove { .. }
            | Command::AddReplica { .. }
            | Command::HandOver { .. }
            | Command::FinishMove { .. }
            | Command::CancelMove { .. }
            | Command::SetBrokerDraining { .. } => self.apply_move(cmd),
            Command::Batch { commands } => {
                let results = commands.iter().map(|c| self.apply(c)).collect();
                Ok(Applied::Batch { results })
            }
        }
    }

    fn require_namespace(&self, tenant: &str, namespace: &str) -> Result<(), CommandError> {
        let ns = self
            .tenants
            .get(tenant)
            .ok_or_else(|| missing("tenant", tenant))?;
        if !ns.contains(namespace) {
            return Err(missing("namespace", format!("{tenant}/{namespace}")));
        }
        Ok(())
    }

    /// The stream of `shard`, if it has such a shard.
    pub(super) fn require_shard(&self, shard: &ShardKey) -> Result<&Stream, CommandError> {
        let stream = self
            .streams
            .get(&stream_key(&shard.tenant, &shard.namespace, &shard.stream))
            .ok_or_else(|| missing("stream", shard.to_string()))?;
        if shard.shard >= stream.settings.shards {
            return Err(missing("shard", shard.to_string()));
        }
        Ok(stream)
    }

    /// Whether a command changes the registry brokers keep locally (tenants, namespaces,
    /// streams, brokers, placement) rather than only manifests, producer ids or features.
    pub fn touches_registry(cmd: &Command) -> bool {
        match cmd {
            Command::AddSegment { .. }
            | Command::SetSegmentTier { .. }
            | Command::SetSegmentCopies { .. }
            | Command::RemoveSegment { .. }
            | Command::RecordObject { .. }
            | Command::TrimManifest { .. }
            | Command::ReportReplicas { .. }
            | Command::AllocateProducerIds { .. }
            | Command::CreateGroup { .. }
            | Command::AlterGroup { .. }
            | Command::DeleteGroup { .. } => false,
            Command::AddSigningKey { .. }
            | Command::PutRole { .. }
            | Command::DeleteRole { .. }
            | Command::BindRole { .. }
            | Command::UnbindRole { .. }
            | Command::RevokeToken { .. }
            | Command::SetBootstrapToken { .. }
            | Command::PutOidcIssuer { .. }
            | Command::DeleteOidcIssuer { .. } => false,
            Command::Batch { commands } => commands.iter().any(Self::touches_registry),
            _ => true,
        }
    }
}
