//! felix-meta: the control plane.
//!
//! Not built yet. This crate will hold the openraft state machine of tenants, namespaces,
//! streams, brokers, shard placement, generations, leases and the segment manifest. See
//! `docs/architecture.md`.
