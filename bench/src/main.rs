//! felix-bench: Felix's load generator. Each scenario prints one JSON line of figures.
//!
//! Scenarios:
//! * `log` — the shard log alone (felix-hot): durable append throughput and latency under an
//!   fsync policy with K concurrent writers, then a sequential read of everything back from
//!   the disk (page cache dropped for the log's files first).
//! * `meta` — the control plane (felix-meta): committed commands per second and latency on
//!   a 1- or 3-node Raft group on loopback.
//! * `pubsub` — a running broker end to end: publishers and fan-out subscribers of one
//!   durable shard, throughput plus publish-ack and delivery latency; with `--cluster`, the
//!   same through `ClusterClient`s against a cluster, on a replicated Quorum or Leader stream.
//! * `failover` — a running cluster: steady idempotent publishes to a Quorum shard, SIGKILL
//!   of its leader's process, time to the first acknowledgement after it (for
//!   `bench/cluster.sh`).
//! * `catchup` — a running broker with tiered storage: replay speed from offset 0 with the
//!   stream hot, cold behind an empty cache and cold behind a warm cache; publish latency
//!   beside a cold reader; upload lag (one phase per run, for `bench/catchup.sh`).
//! * `auth-checks` — the authorization steps alone (felix-meta, no network): verifying a
//!   token, expanding its roles, the per-request check (for `bench/auth.sh`'s results).
//! * `groups` — a running broker: consume-and-acknowledge through a consumer group with 1,
//!   4 and 16 consumers against a plain subscription of the same 4-shard stream, and with
//!   every tenth record nacked to a dead-letter stream (for `bench/groups.sh`).
//! * `cache` — a running broker or cluster: put then get ops/s and latency of a cache's
//!   keys by concurrent clients (for `bench/cache.sh`).
//! * `nats-pubsub` (feature `nats`) — the same load against NATS JetStream, for
//!   `bench/pubsub-vs-nats.sh`.
//! * `nats-groups` (feature `nats`) — the `groups` load against NATS JetStream work-queue
//!   pull consumers with explicit acks, for `bench/groups.sh`.
//! * `nats-kv` (feature `nats`) — the `cache` load against a NATS JetStream key-value bucket,
//!   for `bench/cache.sh`.

// Results carry the wire's `ErrorBody` inline (~150 bytes since it can name a shard's
// leader). Errors are the rare path; boxing would change the type every caller matches on.
#![allow(clippy::result_large_err)]

mod auth_scenario;
mod broker_metrics;
mod cache_scenario;
mod catchup_scenario;
mod cluster;
mod common;
mod drain_scenario;
mod failover_scenario;
mod groups_half_load;
mod groups_scenario;
mod load;
mod log_scenario;
mod meta_scenario;
mod move_scenario;
#[cfg(feature = "nats")]
mod nats_groups_scenario;
#[cfg(feature = "nats")]
mod nats_kv_scenario;
#[cfg(feature = "nats")]
mod nats_scenario;
mod pubsub_scenario;
mod replay;
mod steady;
mod upload_watch;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "felix-bench",
    version,
    about = "Felix benchmarks: each scenario prints one JSON line of figures"
)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Append to and read back one shard's log on local disk (no network).
    Log(log_scenario::LogArgs),
    /// Commit control-plane commands on a 1- or 3-node Raft group on loopback.
    Meta(meta_scenario::MetaArgs),
    /// Publish to and subscribe from a running broker (or, with --cluster, a cluster through
    /// ClusterClient): one durable shard, P publishers, F subscribers from `latest`.
    Pubsub(pubsub_scenario::PubsubArgs),
    /// Replay a tiered stream from offset 0 (hot, cold with an empty cache, cold with a warm
    /// cache), publish beside a cold reader, measure upload lag: one phase per run.
    Catchup(catchup_scenario::CatchupArgs),
    /// SIGKILL a Quorum shard's leader in a running cluster while publishing steadily: time
    /// from the kill to the first acknowledgement after it.
    Failover(failover_scenario::FailoverArgs),
    /// Move a Quorum shard's leadership to another broker of a running cluster (4 brokers or
    /// more) while publishing steadily: the move's duration and the publish latency before,
    /// during and after.
    Move(move_scenario::MoveArgs),
    /// Drain the broker holding most of a many-shard Quorum stream's replicas while every
    /// shard is published to steadily: the drain's duration and the worst publish hold.
    Drain(drain_scenario::DrainArgs),
    /// What each authorization step costs on one core (no network): verifying a token,
    /// expanding its roles, and the per-request check.
    AuthChecks(auth_scenario::AuthArgs),
    /// Consume and acknowledge through a consumer group with 1, 4 and 16 consumers, against
    /// a plain subscription of the same stream; and with every tenth record dead-lettered.
    Groups(groups_scenario::GroupsArgs),
    /// Puts then gets of `--value-bytes` values on `--keys` keys by `--clients` concurrent
    /// clients, against a cache of a running broker or cluster.
    Cache(cache_scenario::CacheArgs),
    /// The `pubsub` load against NATS JetStream (file storage, ordered push consumers).
    #[cfg(feature = "nats")]
    NatsPubsub(nats_scenario::NatsArgs),
    /// The `groups` load against NATS JetStream work-queue pull consumers (explicit acks).
    #[cfg(feature = "nats")]
    NatsGroups(nats_groups_scenario::NatsGroupsArgs),
    /// The `cache` load against a NATS JetStream key-value bucket (file storage).
    #[cfg(feature = "nats")]
    NatsKv(nats_kv_scenario::NatsKvArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.scenario {
        Scenario::Log(args) => log_scenario::run(args),
        Scenario::Meta(args) => meta_scenario::run(args),
        Scenario::Pubsub(args) => pubsub_scenario::run(args),
        Scenario::Catchup(args) => catchup_scenario::run(args),
        Scenario::Failover(args) => failover_scenario::run(args),
        Scenario::Move(args) => move_scenario::run(args),
        Scenario::Drain(args) => drain_scenario::run(args),
        Scenario::AuthChecks(args) => auth_scenario::run(args),
        Scenario::Groups(args) => groups_scenario::run(args),
        Scenario::Cache(args) => cache_scenario::run(args),
        #[cfg(feature = "nats")]
        Scenario::NatsPubsub(args) => nats_scenario::run(args),
        #[cfg(feature = "nats")]
        Scenario::NatsGroups(args) => nats_groups_scenario::run(args),
        #[cfg(feature = "nats")]
        Scenario::NatsKv(args) => nats_kv_scenario::run(args),
    }
}
