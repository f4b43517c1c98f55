//! Consumer groups in the control plane: which groups exist and their settings.
//!
//! Decides what a valid group is: a group belongs to one durable stream, its name is a valid
//! name, its dead-letter stream (if any) exists and is another stream, and its settings are
//! in range. A group's progress (claims, acknowledgements, attempts) is not here: it lives
//! beside each shard's log on the broker that leads the shard (gateway/src/groups), so an
//! acknowledgement never costs a Raft commit. The invariant: each created group gets an id
//! never given before, so a group deleted and created again under the same name never
//! inherits the progress its predecessor left on a broker's disk.

use serde::{Deserialize, Serialize};

use super::command::Applied;
use super::errors::{CommandError, exists, missing};
use super::names::{check_name, stream_key};
use super::settings::Durability;
use super::state::MetaState;

/// Where a new group starts on each shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupStart {
    Earliest,
    /// Records stamped at or after the group's creation.
    Latest,
    Offset(u64),
    Timestamp(i64),
}

/// A group's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSettings {
    pub visibility_timeout_ms: u64,
    pub max_attempts: u32,
    /// `tenant/namespace/stream`.
    pub dead_letter: Option<String>,
    pub start: GroupStart,
}

/// Longest visibility timeout: 12 hours (SQS's ceiling).
pub const MAX_VISIBILITY_TIMEOUT_MS: u64 = 12 * 3600 * 1000;
/// Most deliveries of one record.
pub const MAX_ATTEMPTS: u32 = 1000;

impl GroupSettings {
    fn validate(&self) -> Result<(), CommandError> {
        if self.visibility_timeout_ms == 0 || self.visibility_timeout_ms > MAX_VISIBILITY_TIMEOUT_MS
        {
            return Err(CommandError::Invalid(format!(
                "visibility_timeout_ms must be 1..={MAX_VISIBILITY_TIMEOUT_MS}"
            )));
        }
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS {
            return Err(CommandError::Invalid(format!(
                "max_attempts must be 1..={MAX_ATTEMPTS}"
            )));
        }
        Ok(())
    }
}

/// A consumer group of a stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub name: String,
    /// Unique across every group ever created.
    pub id: u64,
    pub settings: GroupSettings,
    /// When it was created (the proposer's clock): where `Latest` starts.
    pub created_ms: i64,
}

/// The key of a group in [`MetaState::groups`]: `tenant/namespace/stream/group`.
pub fn group_key(tenant: &str, namespace: &str, stream: &str, group: &str) -> String {
    format!("{tenant}/{namespace}/{stream}/{group}")
}

impl MetaState {
    pub(super) fn create_group(
        &mut self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        name: &str,
        settings: &GroupSettings,
        created_ms: i64,
    ) -> Result<Applied, CommandError> {
        check_name("group", name)?;
        settings.validate()?;
        let skey = stream_key(tenant, namespace, stream);
        let s = self
            .streams
            .get(&skey)
            .ok_or_else(|| missing("stream", &skey))?;
        if s.settings.durability != Durability::Durable {
            return Err(CommandError::Invalid(format!(
                "stream {skey} is ephemeral: a consumer group needs a durable stream"
            )));
        }
        if let Some(dlq) = &settings.dead_letter {
            if *dlq == skey {
                return Err(CommandError::Invalid(
                    "a group cannot dead-letter to the stream it consumes".into(),
                ));
            }
            if !self.streams.contains_key(dlq) {
                return Err(missing("stream", dlq));
            }
        }
        let key = group_key(tenant, namespace, stream, name);
        if self.groups.contains_key(&key) {
            return Err(exists("group", key));
        }
        self.group_ids += 1;
        self.groups.insert(
            key,
            Group {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                stream: stream.to_owned(),
                name: name.to_owned(),
                id: self.group_ids,
                settings: settings.clone(),
                created_ms,
            },
        );
        Ok(Applied::Done)
    }

    /// Replaces a group's settings (its start position stays: it applied at creation).
    pub(super) fn alter_group(
        &mut self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        name: &str,
        settings: &GroupSettings,
    ) -> Result<Applied, CommandError> {
        settings.validate()?;
        let skey = stream_key(tenant, namespace, stream);
        if let Some(dlq) = &settings.dead_letter {
            if *dlq == skey {
                return Err(CommandError::Invalid(
                    "a group cannot dead-letter to the stream it consumes".into(),
                ));
            }
            if !self.streams.contains_key(dlq) {
                return Err(missing("stream", dlq));
            }
        }
        let key = group_key(tenant, namespace, stream, name);
        let group = self
            .groups
            .get_mut(&key)
            .ok_or_else(|| missing("group", &key))?;
        if settings.start != group.settings.start {
            return Err(CommandError::Invalid(
                "a group's start position applies at its creation and cannot be altered".into(),
            ));
        }
        group.settings = settings.clone();
        Ok(Applied::Done)
    }

    pub(super) fn delete_group(
        &mut self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        name: &str,
    ) -> Result<Applied, CommandError> {
        let key = group_key(tenant, namespace, stream, name);
        self.groups
            .remove(&key)
            .map(|_| Applied::Done)
            .ok_or_else(|| missing("group", key))
    }

    /// A deleted stream takes its groups with it.
    pub(super) fn drop_groups_of(&mut self, tenant: &str, namespace: &str, stream: &str) {
        let prefix = format!("{}/", stream_key(tenant, namespace, stream));
        self.groups.retain(|k, _| !k.starts_with(&prefix));
    }

    /// The groups of a stream, by name.
    pub fn groups_of(&self, tenant: &str, namespace: &str, stream: &str) -> Vec<Group> {
        let prefix = format!("{}/", stream_key(tenant, namespace, stream));
        self.groups
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(_, g)| g.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Command, StreamSettings};

    fn settings() -> GroupSettings {
        GroupSettings {
            visibility_timeout_ms: 30_000,
            max_attempts: 5,
            dead_letter: None,
            start: GroupStart::Earliest,
        }
    }

    fn state() -> MetaState {
        let mut s = MetaState::default();
        for cmd in [
            Command::CreateTenant { name: "t".into() },
            Command::CreateNamespace {
                tenant: "t".into(),
                name: "n".into(),
            },
            Command::CreateStream {
                tenant: "t".into(),
                namespace: "n".into(),
                name: "s".into(),
                settings: StreamSettings {
                    durability: Durability::Durable,
                    ..StreamSettings::default()
                },
            },
        ] {
            s.apply(&cmd).expect("setup");
        }
        s
    }

    #[test]
    fn a_group_is_created_once_with_a_fresh_id_and_goes_with_its_stream() {
        let mut s = state();
        let create = Command::CreateGroup {
            tenant: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            name: "g".into(),
            settings: settings(),
            created_ms: 1,
        };
        s.apply(&create).expect("created");
        assert!(matches!(
            s.apply(&create),
            Err(CommandError::AlreadyExists { .. })
        ));
        let first = s.groups_of("t", "n", "s")[0].id;
        s.apply(&Command::DeleteGroup {
            tenant: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            name: "g".into(),
        })
        .expect("deleted");
        s.apply(&create).expect("created again");
        assert_ne!(s.groups_of("t", "n", "s")[0].id, first);
        s.apply(&Command::DeleteStream {
            tenant: "t".into(),
            namespace: "n".into(),
            name: "s".into(),
        })
        .expect("stream deleted");
        assert!(s.groups.is_empty());
    }

    #[test]
    fn bad_settings_and_missing_dead_letter_streams_are_refused() {
        let mut s = state();
        let with = |settings: GroupSettings| Command::CreateGroup {
            tenant: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            name: "g".into(),
            settings,
            created_ms: 1,
        };
        for bad in [
            GroupSettings {
                max_attempts: 0,
                ..settings()
            },
            GroupSettings {
                visibility_timeout_ms: 0,
                ..settings()
            },
            GroupSettings {
                dead_letter: Some("t/n/nope".into()),
                ..settings()
            },
            GroupSettings {
                dead_letter: Some("t/n/s".into()),
                ..settings()
            },
        ] {
            assert!(s.apply(&with(bad)).is_err());
        }
        assert!(s.groups.is_empty());
    }
}
