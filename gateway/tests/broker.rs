//! The broker's promises on a real `felix` process over real QUIC on loopback: durability
//! across SIGKILL, ordering through batching and fanout, lag isolation, catch-up, tenant
//! backpressure, ephemeral streams, bad input, the `felixctl` tool, and the Kafka listener with real Kafka
//! clients. One binary; each area is a module under `tests/broker/`, sharing the process
//! harness in `common`.

// Results carry the client's errors, which hold the wire's `ErrorBody` inline.
#![allow(clippy::result_large_err)]

mod broker {
    mod analytics;
    mod auth;
    mod backpressure;
    mod bad_input;
    mod broker_ops;
    mod cache;
    mod cache_binary;
    mod cache_compaction;
    mod cache_staged;
    mod cache_streams;
    mod cache_watch;
    mod cluster;
    mod cold_replay;
    mod common;
    mod corruption;
    mod deletes;
    mod disk;
    mod docs;
    mod durability;
    mod ephemeral;
    mod fanout;
    mod felixctl;
    mod felixctl_output;
    mod fencing;
    mod groups;
    mod groups_auth;
    mod groups_binary;
    mod groups_failover;
    mod idempotence;
    mod internal_auth;
    mod kafka;
    mod kafka_admin;
    mod kafka_advertised;
    mod kafka_auth;
    mod kafka_clients;
    mod kafka_group_failover;
    mod kafka_share;
    mod kafka_share_offsets;
    mod leases;
    mod limits;
    mod metrics_formats;
    mod move_holds;
    mod moves;
    mod oidc;
    mod ordering;
    mod quotas;
    mod repair;
    mod replica_sets;
    mod tiering;
}
