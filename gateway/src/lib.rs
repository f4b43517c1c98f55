//! felix-gateway: the broker node.
//!
//! * [`config`] — every setting, from flags, `FELIX_*` variables and a TOML file.
//! * [`tls`] — the QUIC listener's certificate: generated for the embedded default, or loaded.
//! * [`broker`] — streams, shards, the publish path and subscriptions (the spec's promises).
//! * [`server`] — the QUIC client protocol: connections, requests, subscription streams.
//! * [`admin`] — admin HTTP: `/metrics`, `/healthz`, `/v1/...`.
//! * [`metrics`] — the `felix_*` Prometheus metrics.
//! * [`stream_files`] — which files on disk belong to which stream (incarnations).
//! * [`disk`] — the data volume's free space and the reserve publishes leave for the control plane.
//! * [`corruption`] — stored data that fails its checks: the error, the counter, the log.
//! * [`ephemeral`] — ephemeral shards: publishing at most once, one leader per shard.
//! * [`object_deletes`] — removing a deleted stream's objects, by the Raft leader's broker.
//! * [`inert_settings`] — the spec's example settings this design ignores, accepted and noted.
//! * [`publish_gate`] — per-connection limit on publish answers owed.
//! * [`lag_log`] — one log line per episode of a subscriber falling behind.
//! * [`producers`] — idempotent producers' sequences per shard.
//! * [`enqueue_ack`] — what an ack sent before the write promises under a lease.
//! * [`kafka`] — the Kafka protocol listener: topics are streams, partitions are shards.

// Results carry the wire's `ErrorBody` inline (~150 bytes since it can name a shard's
// leader). Errors are the rare path; boxing would change the type every caller matches on.
#![allow(clippy::result_large_err)]

pub mod admin;
pub mod broker;
pub mod config;
pub mod corruption;
pub mod disk;
pub mod enqueue_ack;
pub mod ephemeral;
pub mod inert_settings;
pub mod kafka;
pub mod lag_log;
pub mod metrics;
pub mod object_deletes;
pub mod producers;
pub mod publish_gate;
pub mod replication;
pub mod server;
pub mod stream_files;
pub mod tls;
