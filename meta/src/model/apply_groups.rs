//! Applying the consumer-group commands to the state (the groups themselves and their
//! settings are in `groups.rs`): create, alter, delete, and the groups a deleted stream
//! takes with it.

use super::command::Applied;
use super::errors::{CommandError, exists, missing};
use super::groups::{Group, GroupSettings, group_key};
use super::names::{check_name, stream_key};
use super::settings::Durability;
use super::state::MetaState;

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

    /// Replaces a group's settings. A new start position applies only on shards where the
    /// group has not started yet (a Kafka share group's `share.auto.offset.reset` behaves
    /// so): where it has, its progress is kept.
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
    use crate::model::{Command, GroupStart, StreamSettings};

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
