//! Creating, describing, listing and deleting groups: their existence and settings are the
//! control plane's (one Raft command each), their progress the shards' (described by the
//! broker that leads each shard).

use felix_meta::model::{Command, Group, GroupSettings, GroupStart};
use felix_wire::groups::{self as wg, GroupConfig, GroupInfo};
use felix_wire::protocol::ErrorBody;

use super::now_ms;
use crate::broker::Broker;

const DEFAULT_VISIBILITY_TIMEOUT_MS: u64 = 30_000;
const DEFAULT_MAX_ATTEMPTS: u32 = 5;

fn start_of(s: wg::GroupStart) -> GroupStart {
    match s {
        wg::GroupStart::Earliest => GroupStart::Earliest,
        wg::GroupStart::Latest => GroupStart::Latest,
        wg::GroupStart::Offset(o) => GroupStart::Offset(o),
        wg::GroupStart::Timestamp(t) => GroupStart::Timestamp(t),
    }
}

fn wire_start(s: GroupStart) -> wg::GroupStart {
    match s {
        GroupStart::Earliest => wg::GroupStart::Earliest,
        GroupStart::Latest => wg::GroupStart::Latest,
        GroupStart::Offset(o) => wg::GroupStart::Offset(o),
        GroupStart::Timestamp(t) => wg::GroupStart::Timestamp(t),
    }
}

fn info(g: &Group) -> GroupInfo {
    GroupInfo {
        tenant: g.tenant.clone(),
        namespace: g.namespace.clone(),
        stream: g.stream.clone(),
        name: g.name.clone(),
        visibility_timeout_ms: g.settings.visibility_timeout_ms,
        max_attempts: g.settings.max_attempts,
        dead_letter: g.settings.dead_letter.clone(),
        start: wire_start(g.settings.start),
        created_ms: g.created_ms,
        shards: Vec::new(),
    }
}

impl Broker {
    pub(crate) async fn create_group(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        name: &str,
        config: GroupConfig,
    ) -> Result<GroupInfo, ErrorBody> {
        self.node.stream_settings(tenant, namespace, stream)?;
        let settings = GroupSettings {
            visibility_timeout_ms: config
                .visibility_timeout_ms
                .unwrap_or(DEFAULT_VISIBILITY_TIMEOUT_MS),
            max_attempts: config.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
            dead_letter: config.dead_letter,
            start: start_of(config.start.unwrap_or_default()),
        };
        self.node
            .propose(Command::CreateGroup {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                stream: stream.to_owned(),
                name: name.to_owned(),
                settings,
                created_ms: now_ms(),
            })
            .await?;
        self.describe_group(tenant, namespace, stream, name).await
    }

    /// Changes the settings `config` sets; `dead_letter: ""` removes the dead-letter stream.
    pub(crate) async fn alter_group(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        name: &str,
        config: GroupConfig,
    ) -> Result<GroupInfo, ErrorBody> {
        let group = self
            .group_confirmed(tenant, namespace, stream, name)
            .await?;
        let mut settings = group.settings.clone();
        if let Some(v) = config.visibility_timeout_ms {
            settings.visibility_timeout_ms = v;
        }
        if let Some(m) = config.max_attempts {
            settings.max_attempts = m;
        }
        if let Some(d) = config.dead_letter {
            settings.dead_letter = (!d.is_empty()).then_some(d);
        }
        if let Some(start) = config.start {
            settings.start = start_of(start);
        }
        self.node
            .propose(Command::AlterGroup {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                stream: stream.to_owned(),
                name: name.to_owned(),
                settings,
            })
            .await?;
        self.describe_group(tenant, namespace, stream, name).await
    }

    pub(crate) async fn delete_group(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        name: &str,
    ) -> Result<(), ErrorBody> {
        self.node
            .propose(Command::DeleteGroup {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                stream: stream.to_owned(),
                name: name.to_owned(),
            })
            .await
            .map(|_| ())
    }

    /// The group's settings, and its progress on each shard this broker leads.
    pub(crate) async fn describe_group(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        name: &str,
    ) -> Result<GroupInfo, ErrorBody> {
        let group = self
            .group_confirmed(tenant, namespace, stream, name)
            .await?;
        let (_, settings) = self.node.stream_settings(tenant, namespace, stream)?;
        let mut out = info(&group);
        for shard in 0..settings.shards {
            // Shards led elsewhere are described by their leaders.
            let Ok(gs) = self.group_shard(tenant, namespace, stream, shard).await else {
                continue;
            };
            let end = gs.shard.visible_end();
            let c = gs.cursor(&group).await;
            out.shards.push(c.info(shard, end, now_ms()));
        }
        Ok(out)
    }

    pub(crate) fn list_groups(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
    ) -> Result<Vec<GroupInfo>, ErrorBody> {
        self.node.stream_settings(tenant, namespace, stream)?;
        Ok(self
            .node
            .meta
            .local(|s| s.groups_of(tenant, namespace, stream))
            .iter()
            .map(info)
            .collect())
    }
}
