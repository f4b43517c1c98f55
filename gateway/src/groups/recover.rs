//! Taking a shard's group journal over as its new leader.
//!
//! Decides which history of the journal a new leader continues. On a Quorum stream of
//! several replicas, a change was answered only once a majority of the replicas held it, so
//! any majority has at least one replica holding every answered change. The new leader asks
//! the other replicas for the state of their copies until it has heard from a majority
//! (itself included), takes the best copy among them (the newest last generation, then the
//! longest: it holds everything the others hold that was answered), copies what it lacks
//! from it, then writes a barrier at its own generation and waits until a majority holds it.
//! From then on its copy is the journal's history: replicas that held anything else cut it
//! ([`super::copy`]). On a Leader stream the new leader continues its own copy, as its log.
//!
//! Invariant: no group change is answered on a shard before its leader's barrier is held by
//! a majority, so every answered change is in every later leader's history.

use std::time::Duration;

use felix_meta::model::Placement;
use felix_wire::protocol::{ErrorBody, codes};
use tracing::{info, warn};

use super::GroupShard;
use super::copy::{self, CopyAnswer, CopyError};
use super::cursor::{Cursor, Event};
use super::journal;
use super::replica::{JournalLog, Replication};
use crate::broker::Broker;
use crate::errors::{err, log_error};

/// How long a new leader waits for other replicas while taking a journal over.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(5);

fn recovering(why: String) -> ErrorBody {
    err(codes::SHARD_UNAVAILABLE, "group_journal_recovering", why).retry_after(500)
}

impl Broker {
    /// Takes the journal `j` over at `generation` of placement `p`; returns what its
    /// changes wait for from now on.
    pub(crate) async fn take_journal_over(
        &self,
        j: &mut JournalLog,
        p: &Placement,
        generation: u64,
    ) -> Result<Replication, ErrorBody> {
        let me = self.broker_id();
        let quorum = self.node.is_quorum(&j.shard.key) && p.replicas.len() > 1;
        let replication = Replication {
            generation: Some(generation),
            replicas: p.replicas.clone(),
            quorum,
        };
        self.stop_following_journal(&j.shard.key).await;
        if quorum {
            self.adopt_best_copy(j, &p.replicas).await?;
        }
        // Generations only grow in a log: a copy stamped by a later leader that lost its
        // role before anyone held its barrier keeps that generation, and this one is later.
        if j.log.generation() < generation as i32 {
            j.log
                .set_generation(generation as i32)
                .map_err(|e| log_error(&e))?;
        }
        j.mark.serve_at(generation);
        if quorum {
            let t = journal::append_barrier(&j.log)
                .await
                .map_err(|e| log_error(&e))?;
            let (_, last) = t.committed().await.map_err(|e| log_error(&e))?;
            let held = j
                .mark
                .wait_majority(
                    generation,
                    &p.replicas,
                    me,
                    &j.log,
                    last + 1,
                    RECOVERY_TIMEOUT,
                )
                .await;
            if !held {
                return Err(recovering(format!(
                    "shard {}: no majority of replicas holds the group journal yet",
                    j.shard.key
                )));
            }
            info!(shard = %j.shard.key, generation, end = last + 1, "took the group journal over");
        }
        Ok(replication)
    }

    /// Brings every group's read position on `gs` back to the shard's log end where it is
    /// past it: after a Leader stream's failover the new leader's log may end before records
    /// the old leader handed out, and the offsets past its end will hold new records that no
    /// one has seen. A Quorum stream's positions never pass the committed mark, which every
    /// new leader's log holds: nothing changes there.
    pub(crate) async fn rewind_past_end(&self, gs: &GroupShard) -> Result<(), ErrorBody> {
        let Some(log) = gs.shard.log.as_ref() else {
            return Ok(());
        };
        let end = log.next_offset();
        let cursors: Vec<(String, std::sync::Arc<tokio::sync::Mutex<Cursor>>)> = gs
            .cursors
            .lock()
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect();
        for (name, c) in cursors {
            let mut c = c.lock().await;
            if c.progress.next.is_some_and(|n| n > end) {
                warn!(shard = %gs.key, group = name, to = end,
                    "group position past the new leader's log end: rewound");
                let t = gs
                    .record(&name, &mut c, vec![Event::Rewind { to: end }])
                    .await?;
                drop(c);
                gs.written(t).await?;
            }
        }
        Ok(())
    }

    /// Asks the other replicas for their copies until a majority answered, and brings this
    /// copy up to the best of them.
    async fn adopt_best_copy(&self, j: &mut JournalLog, replicas: &[u64]) -> Result<(), ErrorBody> {
        let me = self.broker_id();
        let need = replicas.len() / 2 + 1;
        let others: Vec<(u64, String)> = replicas
            .iter()
            .filter(|r| **r != me)
            .filter_map(|r| self.node.internal_addr_of(*r).map(|a| (*r, a)))
            .collect();
        let asks = others.iter().map(|(r, addr)| {
            let req = copy::request_from(j, None, me, 0, 0);
            let client = self.node.peers.clone();
            async move {
                let answer =
                    tokio::time::timeout(RECOVERY_TIMEOUT, copy::fetch(&client, addr, &req))
                        .await
                        .ok()
                        .and_then(Result::ok);
                answer.map(|a| (*r, addr.clone(), a))
            }
        });
        let answers: Vec<(u64, String, CopyAnswer)> = futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect();
        if answers.len() + 1 < need {
            return Err(recovering(format!(
                "shard {}: {} of {} replicas answered about the group journal; a majority is needed",
                j.shard.key,
                answers.len() + 1,
                replicas.len()
            )));
        }
        let mine = (journal::last_generation(&j.log), j.log.committed_offset());
        let Some((_, addr, best)) = answers
            .into_iter()
            .filter(|(_, _, a)| (a.last_generation, a.end) > mine)
            .max_by_key(|(_, _, a)| (a.last_generation, a.end))
        else {
            return Ok(());
        };
        let target = (best.last_generation, best.end);
        let deadline = tokio::time::Instant::now() + RECOVERY_TIMEOUT * 2;
        while (journal::last_generation(&j.log), j.log.committed_offset()) < target {
            if tokio::time::Instant::now() > deadline {
                return Err(recovering(format!(
                    "shard {}: copying the group journal from {addr} takes too long",
                    j.shard.key
                )));
            }
            let req = copy::request_from(j, None, me, 4 << 20, 0);
            let answer = match copy::fetch(&self.node.peers, &addr, &req).await {
                Ok(a) => a,
                Err(CopyError::Behind { first }) => {
                    // The best copy was compacted past this one's end: start from its first.
                    *j = self.reseed_journal(&j.shard, first).await?;
                    continue;
                }
                Err(e) => {
                    return Err(recovering(format!(
                        "copying the group journal from {addr}: {e}"
                    )));
                }
            };
            let before = j.log.committed_offset();
            copy::apply(self, j, &answer)
                .await
                .map_err(|e| recovering(format!("copying the group journal: {e}")))?;
            if answer.diverged_at.is_none()
                && answer.batches.is_empty()
                && j.log.committed_offset() == before
            {
                break;
            }
        }
        Ok(())
    }
}
