//! ListGroups and DescribeGroups: how the groups look to admin tools.
//!
//! Decides what a group is reported as. The invariant: a group known only by its committed
//! offsets (no member since the broker started) is listed and described as `Empty`, never
//! lost, and a group unknown both ways is `Dead`, as Kafka reports it. Only the caller's own
//! scope's groups are seen: a listing shows those it may see, and describing one needs any
//! grant on it.

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    DescribeGroupsRequest, DescribeGroupsResponse, GroupId, ListGroupsRequest, ListGroupsResponse,
};

use kafka_protocol::error::ResponseError;

use super::coordinator::{GroupState, sb};
use super::find::coordinates;
use crate::kafka::Kafka;
use crate::kafka::scope::{On, Scope};

/// ListGroups: groups with members, and groups known only by their committed offsets.
pub async fn list_groups(
    kafka: &Kafka,
    scope: &Scope,
    request: ListGroupsRequest,
) -> ListGroupsResponse {
    let mut listed: BTreeMap<String, (String, &'static str)> = BTreeMap::new();
    for group in super::offset_home::known_groups(kafka, scope).await {
        listed.insert(group, ("consumer".to_owned(), GroupState::Empty.name()));
    }
    {
        let groups = kafka.groups.groups.lock();
        for (key, g) in groups.iter() {
            let Some(id) = scope.group_of(key) else {
                continue;
            };
            let protocol_type = g
                .protocol_type
                .clone()
                .unwrap_or_else(|| "consumer".to_owned());
            listed.insert(id.to_owned(), (protocol_type, g.state.name()));
        }
    }
    listed.retain(|id, _| scope.can_view(kafka, id));
    let filter: Vec<String> = request
        .states_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let groups = listed
        .into_iter()
        .filter(|(_, (_, state))| filter.is_empty() || filter.contains(&state.to_ascii_lowercase()))
        .map(|(id, (protocol_type, state))| {
            ListedGroup::default()
                .with_group_id(GroupId(sb(&id)))
                .with_protocol_type(sb(&protocol_type))
                .with_group_state(sb(state))
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

/// DescribeGroups: state, protocol and members of each group (`Dead` if unknown).
pub async fn describe_groups(
    kafka: &Kafka,
    scope: &Scope,
    request: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let with_offsets = super::offset_home::known_groups(kafka, scope).await;
    let groups = kafka.groups.groups.lock();
    let described = request
        .groups
        .iter()
        .map(|id| {
            let base = DescribedGroup::default().with_group_id(id.clone());
            if let Err(error) = scope.allow_view(kafka, id, On::Group) {
                return base.with_error_code(error.code());
            }
            if !coordinates(kafka, id) {
                return base.with_error_code(ResponseError::NotCoordinator.code());
            }
            match groups.get(&scope.group_key(id)) {
                Some(g) => {
                    let protocol = g.protocol.clone().unwrap_or_default();
                    let members = g
                        .members
                        .iter()
                        .map(|m| {
                            DescribedGroupMember::default()
                                .with_member_id(sb(&m.id))
                                .with_group_instance_id(m.instance_id.as_deref().map(sb))
                                .with_client_id(sb(&m.client_id))
                                .with_client_host(sb(&m.client_host))
                                .with_member_metadata(m.metadata_for(&protocol))
                                .with_member_assignment(m.assignment.clone())
                        })
                        .collect();
                    base.with_group_state(sb(g.state.name()))
                        .with_protocol_type(sb(g.protocol_type.as_deref().unwrap_or("")))
                        .with_protocol_data(sb(&protocol))
                        .with_members(members)
                }
                None if with_offsets.contains(&id.to_string()) => base
                    .with_group_state(sb(GroupState::Empty.name()))
                    .with_protocol_type(sb("consumer")),
                None => base.with_group_state(sb("Dead")),
            }
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(described)
}
