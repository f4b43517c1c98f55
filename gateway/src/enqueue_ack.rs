//! What an acknowledgement sent before the write promises on a broker that leads under a
//! lease (`ack_on_commit: false` in a cluster).
//!
//! Such an ack goes out when the publish is queued. The write happens later, on the log's
//! writer thread, and by then the lease may have lapsed (a pause, a slow disk) and another
//! broker may lead the shard. Two rules keep that from forking the shard:
//!
//! * The write itself is refused once the lease has lapsed: every leader append passes the
//!   log's write gate ([`write_gate`]) just before it is written. A record acknowledged and
//!   then refused is lost, and counted in `felix_broker_acked_publishes_dropped_total`.
//! * Near the end of the lease (less than half of it left, i.e. two renewals missed) the
//!   broker does not answer on enqueue: it waits for the write ([`settle`]), so a lapse
//!   comes back to the publisher as `shard_unavailable` rather than as an ack it cannot keep.

use std::sync::Arc;
use std::time::Duration;

use felix_hot::{Appended, WriteGate};
use felix_wire::protocol::ErrorBody;

use crate::errors::log_error;
use crate::metrics::Metrics;
use crate::replication::lease::Lease;

/// The gate a cluster broker puts on each log it may lead: a leader write goes ahead only
/// while the broker's lease holds. (It also waits out the write-stall fault, so a test can
/// hold a write past the lease.)
pub(crate) fn write_gate(lease: Arc<Lease>) -> WriteGate {
    Arc::new(move || {
        felix_meta::faults::wait_while_writes_stalled();
        lease.holds()
    })
}

/// Settles an enqueue acknowledgement for appends already accepted: while at least `margin`
/// of the lease is left it returns at once and only counts, later, an acknowledged write
/// that failed; nearer the end it waits for the writes and fails with their error.
/// `acked` says whether the publisher is told anything (fire-and-forget is not counted).
pub(crate) async fn settle(
    tickets: Vec<Appended>,
    lease: Option<&Lease>,
    margin: Duration,
    acked: bool,
    metrics: &Arc<Metrics>,
) -> Result<(), ErrorBody> {
    if lease.is_some_and(|l| l.remaining() < margin) {
        for t in tickets {
            t.committed().await.map_err(|e| log_error(&e))?;
        }
        return Ok(());
    }
    let metrics = metrics.clone();
    tokio::spawn(async move {
        for t in tickets {
            if t.committed().await.is_err() && acked {
                metrics.acked_publishes_dropped.inc();
            }
        }
    });
    Ok(())
}
