//! felix-gateway: the broker node.
//!
//! * [`config`] — every setting, from flags, `FELIX_*` variables and a TOML file.
//! * [`cluster_secret`] — the secret that authenticates the internal network, or none.
//! * [`tls`] — the QUIC listener's certificate: generated for the embedded default, or loaded.
//! * [`broker`] — the face the protocol listeners call, over the rooms below.
//! * [`node`] — this broker in its cluster: registry, control plane, lease, peers.
//! * [`shards`] / [`shard`] — the open shards, each with its log, fanout and read bound.
//! * [`routing`] — which broker serves a shard; `not_leader`; routing tables.
//! * [`admission`] — tenants' publish slots, when a publish is acknowledged, `overloaded`.
//! * [`publish`] — the publish pipeline on the shard's leader.
//! * [`fencing`] — `publish_if`: a publish written only at the expected offset.
//! * [`forward`] — a publish sent on to the shard's leader.
//! * [`groups`] — consumer groups: claims, acknowledgements, redelivery, dead letters.
//! * [`cache`] — the cache: keys routed to one owner, TTL, counters, watches, compaction.
//! * [`fanout`] — live delivery, per-subscriber queues, drops and `subscription_lagged`.
//! * [`subscription`] — catch-up from history, then live.
//! * [`pull`] — pull reads of a durable shard (the Kafka fetch path).
//! * [`streams`] — creating, altering, describing and deleting streams.
//! * [`retention`] — when a shard's retention runs and how far it may cut.
//! * [`replication`] — leaders, followers, the quorum mark, the lease, broker-to-broker calls.
//! * [`internal`] — the routes other brokers call on the internal address.
//! * [`journal_replay`] — reading back a log the broker keeps for itself (group journals).
//! * [`errors`] — how failures inside the broker become protocol errors.
//! * [`server`] — the QUIC client protocol: connections, requests, subscription streams.
//! * [`admin`] — admin HTTP: `/metrics`, `/healthz`, `/v1/...`.
//! * [`metrics`] — the `felix_*` Prometheus metrics.
//! * [`stream_files`] — which files on disk belong to which stream (incarnations).
//! * [`store_probe`] — whether the object store is up (`felix_tier_store_up`), seen within seconds.
//! * [`disk`] — the data volume's free space and the reserve publishes leave for the control plane.
//! * [`corruption`] — stored data that fails its checks: the error, the counter, the log.
//! * [`ephemeral`] — ephemeral shards: publishing at most once, one leader per shard.
//! * [`object_deletes`] — removing a deleted stream's objects, by the Raft leader's broker.
//! * [`inert_settings`] — the spec's example settings this design ignores, accepted and noted.
//! * [`publish_gate`] — per-connection limit on publish answers owed.
//! * [`lag_log`] — one log line per episode of a subscriber falling behind.
//! * [`producers`] — idempotent producers' sequences per shard.
//! * [`enqueue_ack`] — what an ack sent before the write promises under a lease.
//! * [`auth`] — authorization at every door: tokens checked per request, refusals, token and
//!   role management, the bootstrap admin token (the rules: `felix_meta::auth`).
//! * [`kafka`] — the Kafka protocol listener: topics are streams, partitions are shards.

// Results carry the wire's `ErrorBody` inline (~150 bytes since it can name a shard's
// leader). Errors are the rare path; boxing would change the type every caller matches on.
#![allow(clippy::result_large_err)]

pub mod admin;
pub mod admission;
pub mod auth;
pub mod broker;
pub mod cache;
pub mod cluster_secret;
pub mod config;
pub mod corruption;
pub mod delete_records;
pub mod disk;
pub mod enqueue_ack;
pub mod ephemeral;
pub mod errors;
pub mod fanout;
pub mod fencing;
pub mod forward;
pub mod groups;
pub mod inert_settings;
pub mod internal;
pub mod journal_replay;
pub mod kafka;
pub mod lag_log;
pub mod metrics;
pub mod moves;
pub mod node;
pub mod object_deletes;
pub mod producers;
pub mod publish;
pub mod publish_gate;
pub mod pull;
pub mod quota;
pub mod replication;
pub(crate) mod request_frames;
pub mod retention;
pub mod routing;
pub mod segment_repair;
pub mod server;
pub mod shard;
pub mod shards;
pub mod store_probe;
pub mod stream_files;
pub mod streams;
pub mod subscription;
pub mod tls;
