//! The once-a-second pass over the groups of the shards this broker leads: dead-letters
//! records whose last claim lapsed with no one polling (after a restart too: the journals
//! of every stream with groups are opened), compacts grown journals, lets go of the
//! journals of closed shards, and sets the per-group gauges (in flight, backlog).
//!
//! Why a pass and not only polls: a poison record that crashed its last consumer must still
//! reach the dead-letter stream when nobody polls again, and the gauges must move while a
//! group is idle.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::metrics::GroupLabel;
use super::now_ms;
use crate::broker::Broker;

const EVERY: Duration = Duration::from_secs(1);

/// Runs the pass every second until the broker is gone.
pub async fn run(broker: Weak<Broker>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(b) = broker.upgrade() else { return };
        b.sweep_groups().await;
    }
}

impl Broker {
    async fn sweep_groups(self: &Arc<Self>) {
        // Journals of shards closed since (a deleted stream, a stopped shard) are let go, so
        // their files' space is freed.
        self.groups.open.lock().await.retain(|_, g| {
            !g.shard.is_closed()
                && g.shard.repl.as_ref().and_then(|r| r.leading()) == g.replication.generation
        });
        self.groups
            .logs
            .lock()
            .await
            .retain(|_, j| !j.shard.is_closed());
        // Every stream with groups, from the control plane: after a restart a journal is
        // opened here even if no consumer has come back, so a lapsed last attempt is still
        // dead-lettered and the gauges are right.
        let mut streams: Vec<(String, String, String)> = self.node.meta.local(|s| {
            s.groups
                .values()
                .map(|g| (g.tenant.clone(), g.namespace.clone(), g.stream.clone()))
                .collect()
        });
        streams.dedup();
        let mut in_flight: HashMap<GroupLabel, i64> = HashMap::new();
        let mut backlog: HashMap<GroupLabel, i64> = HashMap::new();
        for (t, n, s) in streams {
            let Ok((_, settings)) = self.node.stream_settings(&t, &n, &s) else {
                continue;
            };
            let groups = self.node.meta.local(|m| m.groups_of(&t, &n, &s));
            for shard in 0..settings.shards {
                let key = crate::shard::shard_key(&t, &n, &s, shard);
                if self.node.cluster
                    && settings.replicas > 1
                    && self.node.holds_replica(&key)
                    && let Ok(replica) = self.open_replica(&key)
                {
                    // Copy the journal while following the shard, stop when not.
                    self.follow_journal(&replica).await;
                }
                if self.shard(&key).is_err() {
                    continue; // led elsewhere: its leader reports it
                }
                let Ok(gs) = self.group_shard(&t, &n, &s, shard).await else {
                    continue;
                };
                let k = &gs.key;
                let end = gs.shard.visible_end();
                for g in &groups {
                    if !gs.cursors.lock().contains_key(&g.name) {
                        continue;
                    }
                    super::dead_letter::settle(self, &gs, g, false).await;
                    let c = gs.cursor(g).await;
                    let info = c.info(k.shard, end, now_ms());
                    drop(c);
                    let l = GroupLabel::of(k, &g.name);
                    *in_flight.entry(l.clone()).or_default() += info.in_flight as i64;
                    *backlog.entry(l).or_default() += info.backlog as i64;
                }
                let live = groups.iter().map(|g| (g.name.clone(), g.id)).collect();
                gs.compact_if_grown(&live).await;
            }
        }
        // Journals holding Kafka classic groups' offsets, on streams without Felix groups.
        self.sweep_kafka_journals().await;
        let m = &self.node.metrics.groups;
        for (l, v) in in_flight {
            // Seeded here too: a group with nothing delivered yet (or since a restart).
            m.seed(&l);
            m.in_flight.get_or_create(&l).set(v);
        }
        for (l, v) in backlog {
            m.backlog.get_or_create(&l).set(v);
        }
    }
}
