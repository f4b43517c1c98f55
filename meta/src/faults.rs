//! Fault injection for tests of the cluster: cutting one node off the internal network.
//!
//! A real network partition between processes on one loopback interface cannot be made
//! without privileges (network namespaces, packet filters), so a node started with
//! `FELIX_FAULT_INJECTION=1` can be isolated on request: while isolated, every internal
//! request it sends fails as unreachable and every internal request it receives is refused
//! with 503, in both directions at once — what a cut cable looks like to Raft, leases and
//! replication. Clients (QUIC, admin HTTP, Kafka) are not affected, so a test can still
//! see what the cut-off node answers.

use std::sync::atomic::{AtomicBool, Ordering};

static ISOLATED: AtomicBool = AtomicBool::new(false);

/// Cuts this node off the internal network (`true`) or heals the cut (`false`).
pub fn set_isolated(isolated: bool) {
    ISOLATED.store(isolated, Ordering::Release);
    tracing::warn!(isolated, "fault injection: internal network cut changed");
}

/// Whether this node is cut off the internal network.
pub fn isolated() -> bool {
    ISOLATED.load(Ordering::Acquire)
}
