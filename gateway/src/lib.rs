//! felix-gateway: the broker node.
//!
//! Not built yet. This crate will compose the hot log, the cold tier and the control plane
//! behind the QUIC client protocol, the Kafka listener and the admin HTTP API, and ship the
//! `felix` binary. See `docs/architecture.md`.
