//! Fault injection for tests of the cluster: cutting one node off the internal network, and
//! holding its log writes.
//!
//! A real network partition between processes on one loopback interface cannot be made
//! without privileges (network namespaces, packet filters), so a node started with
//! `FELIX_FAULT_INJECTION=1` can be isolated on request: while isolated, every internal
//! request it sends fails as unreachable and every internal request it receives is refused
//! with 503, in both directions at once — what a cut cable looks like to Raft, leases and
//! replication. Clients (QUIC, admin HTTP, Kafka) are not affected, so a test can still
//! see what the cut-off node answers.
//!
//! Stalled writes hold every leader write of the node's shard logs just before it is written
//! (after it was accepted), as a slow or hung disk would: what a write that outlasts the
//! lease looks like. Held answers wait after a leader's write and before its answer is
//! settled: what a pause between the two looks like. Held hand-overs wait with their fence
//! up: what a slow control plane looks like to a shard move. Held promotions keep a joining
//! broker a learner: what a restart in the middle of a join finds. Held cache compactions
//! wait between their floor record and their snapshot: what a long compaction looks like to
//! the puts and gets that go on meanwhile.

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

/// Read first, so a write that is not stalled takes no lock.
static STALLING: AtomicBool = AtomicBool::new(false);
static WRITES_STALLED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
static WRITES_RESUMED: std::sync::Condvar = std::sync::Condvar::new();

/// Holds this node's leader log writes (`true`) or lets them go on (`false`).
pub fn set_writes_stalled(stalled: bool) {
    *WRITES_STALLED.lock().unwrap_or_else(|e| e.into_inner()) = stalled;
    STALLING.store(stalled, Ordering::Release);
    WRITES_RESUMED.notify_all();
    tracing::warn!(stalled, "fault injection: log write stall changed");
}

/// Blocks the calling (log writer) thread while writes are stalled.
pub fn wait_while_writes_stalled() {
    if !STALLING.load(Ordering::Acquire) {
        return;
    }
    let stalled = WRITES_STALLED.lock().unwrap_or_else(|e| e.into_inner());
    let _held = WRITES_RESUMED
        .wait_while(stalled, |s| *s)
        .unwrap_or_else(|e| e.into_inner());
}

/// A switch async callers wait on while it is on. Read first, so a caller that is not
/// held takes no lock.
struct Hold {
    on: AtomicBool,
    changes: std::sync::OnceLock<tokio::sync::watch::Sender<bool>>,
}

impl Hold {
    const fn new() -> Hold {
        Hold {
            on: AtomicBool::new(false),
            changes: std::sync::OnceLock::new(),
        }
    }

    fn changes(&self) -> &tokio::sync::watch::Sender<bool> {
        self.changes
            .get_or_init(|| tokio::sync::watch::channel(false).0)
    }

    fn set(&self, on: bool) {
        self.changes().send_replace(on);
        self.on.store(on, Ordering::Release);
    }

    async fn wait(&self) {
        if !self.on.load(Ordering::Acquire) {
            return;
        }
        let mut on = self.changes().subscribe();
        let _ = on.wait_for(|h| !*h).await;
    }
}

static ANSWERS: Hold = Hold::new();
static PROMOTIONS_HELD: AtomicBool = AtomicBool::new(false);

/// Refuses (`true`) the requests this node receives to promote a joining learner to a voter
/// (`join.rs`), as unavailable, so the joiner keeps asking; or lets them through (`false`):
/// holds a new broker between its `joining` marker and its vote, for a test to restart it
/// there.
pub fn set_promotions_held(held: bool) {
    PROMOTIONS_HELD.store(held, Ordering::Release);
    tracing::warn!(held, "fault injection: promotions to voter held changed");
}

/// Whether promotions are refused here (see [`set_promotions_held`]).
pub fn promotions_held() -> bool {
    PROMOTIONS_HELD.load(Ordering::Acquire)
}
static HANDOVERS: Hold = Hold::new();
static COMPACTIONS: Hold = Hold::new();

/// Holds this node's answers to publishes it wrote as leader (`true`), after the write and
/// before the answer is settled, or lets them go on (`false`): what a pause between a write
/// and its answer looks like (a test lets the lease lapse meanwhile).
pub fn set_answers_held(held: bool) {
    ANSWERS.set(held);
    tracing::warn!(held, "fault injection: publish answers held changed");
}

/// Waits while answers are held (see [`set_answers_held`]).
pub async fn wait_while_answers_held() {
    ANSWERS.wait().await
}

/// Holds this node's shard hand-overs after their fence went up and before they are
/// proposed (`true`), or lets them go on (`false`): what a control plane too slow for the
/// hold looks like.
pub fn set_handovers_held(held: bool) {
    HANDOVERS.set(held);
    tracing::warn!(held, "fault injection: shard hand-overs held changed");
}

/// Waits while hand-overs are held (see [`set_handovers_held`]).
pub async fn wait_while_handovers_held() {
    HANDOVERS.wait().await
}

/// Holds this node's cache compactions after their floor record is written and before
/// their snapshot is (`true`), or lets them go on (`false`).
pub fn set_compactions_held(held: bool) {
    COMPACTIONS.set(held);
    tracing::warn!(held, "fault injection: cache compactions held changed");
}

/// Whether cache compactions are held (see [`set_compactions_held`]).
pub fn compactions_held() -> bool {
    COMPACTIONS.on.load(Ordering::Acquire)
}

/// Waits while cache compactions are held (see [`set_compactions_held`]).
pub async fn wait_while_compactions_held() {
    COMPACTIONS.wait().await
}
