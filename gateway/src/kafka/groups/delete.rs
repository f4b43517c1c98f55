//! DeleteGroups: a classic group and its committed offsets go, once it has no members.
//!
//! Decides what may be deleted: a group with members is refused with `NON_EMPTY_GROUP`
//! (its consumers would commit again at once), a group known neither by members nor by
//! offsets is `GROUP_ID_NOT_FOUND`. Deleting is `group.consume` on the group (the one group
//! grant Felix has), checked before anything else. The offsets' tombstones are written
//! durably before the answer (in each partition's group journal, and in the local log of
//! offsets committed before the journals), so a deleted group stays deleted across a
//! restart or a failover.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse};

use super::find::coordinates;
use crate::kafka::Kafka;
use crate::kafka::scope::{On, Scope};
use felix_meta::auth::Action;

/// Serves a DeleteGroups request, group by group.
pub async fn delete_groups(
    kafka: &Kafka,
    scope: &Scope,
    request: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(request.groups_names.len());
    for id in request.groups_names {
        let outcome = delete_group(kafka, scope, id.as_str()).await;
        let result = DeletableGroupResult::default().with_group_id(id);
        results.push(match outcome {
            Ok(()) => result,
            Err(e) => result.with_error_code(e.code()),
        });
    }
    DeleteGroupsResponse::default().with_results(results)
}

async fn delete_group(kafka: &Kafka, scope: &Scope, id: &str) -> Result<(), ResponseError> {
    if id.is_empty() {
        return Err(ResponseError::InvalidGroupId);
    }
    scope.allow(kafka, Action::GroupConsume, id, On::Group)?;
    if !coordinates(kafka, id) {
        return Err(ResponseError::NotCoordinator);
    }
    let key = scope.group_key(id);
    let had_state = {
        let mut groups = kafka.groups.groups.lock();
        match groups.get(&key) {
            Some(g) if !g.members.is_empty() => return Err(ResponseError::NonEmptyGroup),
            Some(_) => groups.remove(&key).is_some(),
            None => false,
        }
    };
    let deleted = super::offset_home::delete(kafka, scope, id).await?;
    if !had_state && deleted == 0 {
        return Err(ResponseError::GroupIdNotFound);
    }
    Ok(())
}
