//! The once-a-second pass over the groups of the shards this broker leads: dead-letters
//! records whose last claim lapsed with no one polling, compacts grown journals, and sets
//! the per-group gauges (in flight, backlog).
//!
//! Why a pass and not only polls: a poison record that crashed its last consumer must still
//! reach the dead-letter stream when nobody polls again, and the gauges must move while a
//! group is idle.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::metrics::GroupLabel;
use super::{GroupShard, now_ms};
use crate::broker::Broker;

const EVERY: Duration = Duration::from_secs(1);

/// Runs the pass every second until the broker is gone.
pub(crate) async fn run(broker: Weak<Broker>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(b) = broker.upgrade() else { return };
        b.sweep_groups().await;
    }
}

impl Broker {
    async fn sweep_groups(&self) {
        let open: Vec<Arc<GroupShard>> = self.groups.open.lock().await.values().cloned().collect();
        let mut in_flight: HashMap<GroupLabel, i64> = HashMap::new();
        let mut backlog: HashMap<GroupLabel, i64> = HashMap::new();
        for gs in open {
            let k = &gs.key;
            if gs.shard.is_closed() || self.shard(k).is_err() {
                continue; // led elsewhere now: its leader reports it
            }
            let groups = self
                .node
                .meta
                .local(|s| s.groups_of(&k.tenant, &k.namespace, &k.stream));
            let end = gs.shard.visible_end();
            for g in &groups {
                if !gs.cursors.lock().contains_key(&g.name) {
                    continue;
                }
                let mut c = gs.cursor(g).await;
                let now = now_ms();
                let ticket = super::dead_letter::settle(self, &gs, g, &mut c, now).await;
                let info = c.info(k.shard, end, now);
                drop(c);
                if let Some(t) = ticket {
                    let _ = GroupShard::written(t).await;
                }
                let l = GroupLabel::of(k, &g.name);
                *in_flight.entry(l.clone()).or_default() += info.in_flight as i64;
                *backlog.entry(l).or_default() += info.backlog as i64;
            }
            let live = groups.iter().map(|g| (g.name.clone(), g.id)).collect();
            gs.compact_if_grown(&live).await;
        }
        let m = &self.node.metrics.groups;
        for (l, v) in in_flight {
            m.in_flight.get_or_create(&l).set(v);
        }
        for (l, v) in backlog {
            m.backlog.get_or_create(&l).set(v);
        }
    }
}
