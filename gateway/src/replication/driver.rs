//! A shard's driver in cluster mode: follows placement changes and takes the role they give
//! this broker, starting the leader's or the follower's loop.
//!
//! Invariant: one loop runs per shard at a time; when the role changes the old loop is
//! stopped and whatever this broker served under the old role ends.

use std::sync::{Arc, Weak};

use tracing::{info, warn};

use super::follower::follow;
use super::leader::{become_leader, hand_over, lead};
use super::role::Role;
use crate::node::Node;
use crate::shard::Shard;

/// Runs for one durable shard in cluster mode, until the shard closes: takes the role the
/// placement gives this broker, leads (mark, reports, lease) or follows (fetch loop).
pub async fn drive_shard(node: Weak<Node>, shard: Arc<Shard>) {
    let Some(repl) = shard.repl.clone() else {
        return;
    };
    let mut placements = repl.placement.subscribe();
    // The leader's or the follower's loop, whichever role this broker has.
    let mut task: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        if shard.is_closed() {
            break;
        }
        let Some(b) = node.upgrade() else { break };
        let me = b.broker_id();
        let placement = placements.borrow_and_update().clone();
        let current = repl.role.borrow().clone();
        let wanted = match &placement {
            None => Role::Unplaced,
            Some(p) if p.leader == Some(me) => Role::Leader {
                generation: p.generation,
            },
            Some(p) => match p.leader {
                Some(leader) if p.replicas.contains(&me) => Role::Follower {
                    leader,
                    generation: p.generation,
                },
                _ => Role::Unplaced,
            },
        };
        let same = match (&current, &wanted) {
            (
                Role::Leader { generation: a }
                | Role::Fenced { generation: a }
                | Role::Unavailable { generation: a, .. },
                Role::Leader { generation: b },
            ) => a == b,
            (a, b) => a == b,
        };
        if !same {
            if let Some(t) = task.take() {
                t.abort();
            }
            // Whatever this broker served under its old role ends here.
            shard.end_subscribers();
            match (&wanted, placement) {
                (Role::Leader { generation }, Some(p)) => {
                    match become_leader(&b, &shard, &repl, &p).await {
                        Ok(()) => {
                            info!(shard = %shard.key, generation, "leading");
                            task = Some(tokio::spawn(lead(
                                node.clone(),
                                shard.clone(),
                                *generation,
                                p.replicas.clone(),
                            )));
                        }
                        Err(why) => {
                            warn!(shard = %shard.key, generation, why, "cannot lead");
                            repl.role.send_replace(Role::Unavailable {
                                generation: *generation,
                                why,
                            });
                            hand_over(&b, &shard.key, &p).await;
                        }
                    }
                }
                (Role::Follower { leader, generation }, Some(p)) => {
                    info!(shard = %shard.key, leader, generation, "following");
                    repl.role.send_replace(wanted.clone());
                    task = Some(tokio::spawn(follow(
                        node.clone(),
                        shard.clone(),
                        *leader,
                        *generation,
                        p,
                    )));
                }
                _ => {
                    repl.role.send_replace(Role::Unplaced);
                }
            }
        }
        drop(b);
        if placements.changed().await.is_err() {
            break;
        }
    }
    if let Some(t) = task {
        t.abort();
    }
}
