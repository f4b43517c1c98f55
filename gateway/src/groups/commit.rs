//! Single-writer fencing on the consuming side: a group's position on a shard committed
//! with `expected_offset` (docs/groups.md, "Single-writer projections").
//!
//! Decides when a commit is taken: only if the group's position on the shard (everything
//! below it retired) is still `expected_offset`, checked and moved under the group's lock,
//! so of two writers that both believe they own the shard exactly one advances it; the
//! other is refused with `expected_offset_mismatch` and the actual position. The move
//! retires every record below the new position (claimed ones too: the committer owns the
//! shard) in one journal record, the same `Skip` a Kafka classic group's offset commit will
//! be. No cross-shard atomicity: each shard's position is committed on its own.

use felix_wire::protocol::{ErrorBody, codes};

use super::cursor::Event;
use super::now_ms;
use crate::broker::Broker;
use crate::errors::err;

/// One commit's arguments.
pub(crate) struct Commit<'a> {
    pub tenant: &'a str,
    pub namespace: &'a str,
    pub stream: &'a str,
    pub group: &'a str,
    pub shard: u32,
    pub consumer: &'a str,
    pub expected_offset: u64,
    pub offset: u64,
}

impl Broker {
    /// Moves the group's position on the shard from `expected_offset` to `offset`; returns
    /// the new position.
    pub(crate) async fn group_commit(&self, c: &Commit<'_>) -> Result<u64, ErrorBody> {
        super::poll::check_consumer(c.consumer)?;
        if c.offset < c.expected_offset {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                format!(
                    "a commit moves forward: offset {} is below the expected {}",
                    c.offset, c.expected_offset
                ),
            ));
        }
        let group = self
            .group_confirmed(c.tenant, c.namespace, c.stream, c.group)
            .await?;
        let gs = self
            .group_shard(c.tenant, c.namespace, c.stream, c.shard)
            .await?;
        let end = gs.shard.visible_end();
        if c.offset > end {
            return Err(err(
                codes::OFFSET_OUT_OF_RANGE,
                "offset_out_of_range",
                format!("offset {} is past the shard's readable end {end}", c.offset),
            ));
        }
        let mut cursor = gs.cursor(&group).await;
        cursor.saw(c.consumer, now_ms());
        let mut events = Vec::new();
        if cursor.progress.next.is_none() {
            let to = self.group_start_offset(&group, c.shard).await?;
            events.push(Event::Skip { to });
        }
        let position = match &events[..] {
            [Event::Skip { to }] => *to,
            _ => cursor.position(),
        };
        if position != c.expected_offset {
            let mut e = err(
                codes::EXPECTED_OFFSET_MISMATCH,
                "expected_offset_mismatch",
                format!(
                    "group {} is at offset {position} on shard {}, not {}; nothing was \
                     committed",
                    c.group, c.shard, c.expected_offset
                ),
            );
            e.next_offset = Some(position);
            return Err(e);
        }
        events.push(Event::Skip { to: c.offset });
        let ticket = gs.record(&group.name, &mut cursor, events).await?;
        let now = cursor.position();
        drop(cursor);
        gs.written(ticket).await?;
        Ok(now)
    }
}
