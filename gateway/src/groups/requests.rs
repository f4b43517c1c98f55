//! The group requests of the QUIC protocol, answered: a `Request::Group` in, a
//! `Response::Group` (with a record batch body for a poll) or an error out. Permissions were
//! checked before this is reached (auth/requests.rs).

use bytes::Bytes;
use felix_wire::groups::{GroupRequest, GroupResponse};
use felix_wire::protocol::{ErrorBody, Response};

use super::answers::{Answer, Answering};
use super::poll::Poll;
use crate::broker::Broker;

/// Answers one group request: the response header and its body.
pub async fn serve(broker: &Broker, request: GroupRequest) -> (Response, Bytes) {
    match answer(broker, request).await {
        Ok((r, body)) => (Response::Group(r), body),
        Err(e) => (Response::Error(e), Bytes::new()),
    }
}

async fn answer(
    broker: &Broker,
    request: GroupRequest,
) -> Result<(GroupResponse, Bytes), ErrorBody> {
    use GroupRequest as G;
    let none = |r| Ok((r, Bytes::new()));
    match request {
        G::Create {
            tenant,
            namespace,
            stream,
            group,
            config,
        } => none(GroupResponse::Group {
            group: broker
                .create_group(&tenant, &namespace, &stream, &group, config)
                .await?,
        }),
        G::Alter {
            tenant,
            namespace,
            stream,
            group,
            config,
        } => none(GroupResponse::Group {
            group: broker
                .alter_group(&tenant, &namespace, &stream, &group, config)
                .await?,
        }),
        G::Describe {
            tenant,
            namespace,
            stream,
            group,
        } => none(GroupResponse::Group {
            group: broker
                .describe_group(&tenant, &namespace, &stream, &group)
                .await?,
        }),
        G::List {
            tenant,
            namespace,
            stream,
        } => none(GroupResponse::Groups {
            groups: broker.list_groups(&tenant, &namespace, &stream)?,
        }),
        G::Delete {
            tenant,
            namespace,
            stream,
            group,
        } => {
            broker
                .delete_group(&tenant, &namespace, &stream, &group)
                .await?;
            none(GroupResponse::Answered {
                shard: 0,
                deadlines_ms: Vec::new(),
            })
        }
        G::Poll {
            tenant,
            namespace,
            stream,
            group,
            shard,
            consumer,
            max_records,
            max_bytes,
            wait_ms,
        } => {
            let claimed = broker
                .group_poll(&Poll {
                    tenant: &tenant,
                    namespace: &namespace,
                    stream: &stream,
                    group: &group,
                    shard,
                    consumer: &consumer,
                    max_records,
                    max_bytes,
                    wait_ms,
                    whole_batches: None,
                    shared: None,
                })
                .await?;
            let (records, body) = (claimed.records, claimed.body);
            Ok((GroupResponse::Claimed { shard, records }, body))
        }
        G::Ack {
            tenant,
            namespace,
            stream,
            group,
            shard,
            consumer,
            records,
        } => {
            let a = Answering {
                tenant: &tenant,
                namespace: &namespace,
                stream: &stream,
                group: &group,
                shard,
                consumer: &consumer,
                records: &records,
            };
            broker.group_answer(&a, Answer::Ack).await?;
            none(GroupResponse::Answered {
                shard,
                deadlines_ms: Vec::new(),
            })
        }
        G::Nack {
            tenant,
            namespace,
            stream,
            group,
            shard,
            consumer,
            records,
            delay_ms,
            reason,
        } => {
            let a = Answering {
                tenant: &tenant,
                namespace: &namespace,
                stream: &stream,
                group: &group,
                shard,
                consumer: &consumer,
                records: &records,
            };
            broker
                .group_answer(&a, Answer::Nack { delay_ms, reason })
                .await?;
            none(GroupResponse::Answered {
                shard,
                deadlines_ms: Vec::new(),
            })
        }
        G::Commit {
            tenant,
            namespace,
            stream,
            group,
            shard,
            consumer,
            expected_offset,
            offset,
        } => {
            let offset = broker
                .group_commit(&super::commit::Commit {
                    tenant: &tenant,
                    namespace: &namespace,
                    stream: &stream,
                    group: &group,
                    shard,
                    consumer: &consumer,
                    expected_offset,
                    offset,
                })
                .await?;
            none(GroupResponse::Committed { shard, offset })
        }
        G::Extend {
            tenant,
            namespace,
            stream,
            group,
            shard,
            consumer,
            records,
            visibility_ms,
        } => {
            let a = Answering {
                tenant: &tenant,
                namespace: &namespace,
                stream: &stream,
                group: &group,
                shard,
                consumer: &consumer,
                records: &records,
            };
            let deadlines_ms = broker
                .group_answer(&a, Answer::Extend { visibility_ms })
                .await?;
            none(GroupResponse::Answered {
                shard,
                deadlines_ms,
            })
        }
    }
}
