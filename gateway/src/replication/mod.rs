//! Cluster mode: who leads each shard, log shipping from leaders to followers, the quorum
//! mark and the broker's lease.
//!
//! * [`role`] — the role this broker has for a shard and the state leading carries.
//! * [`quorum`] — the quorum mark: the one home of the read bound, how it moves, who waits.
//! * [`lease`] — the shard-leader lease and its renewal.
//! * [`driver`] — takes the role each placement gives and runs the leader's or follower's loop.
//! * [`leader`] — leadership at a generation, the mark, fencing, serving followers' fetches.
//! * [`follower`] — cutting a diverged log, then fetching and appending the leader's batches.
//! * [`transport`] — the fetch request, its refusals and the pooled client to other brokers.
//! * [`segment_copy`] — a range of records copied from another replica to rewrite a damaged segment.

pub mod driver;
pub mod follower;
pub mod leader;
pub mod lease;
pub mod quorum;
pub mod role;
pub mod segment_copy;
pub mod transport;
