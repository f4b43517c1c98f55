//! DescribeTopicPartitions (KIP-966, v0): the topic half of Metadata, paged by partition.
//!
//! Decides which topics an answer holds and where it stops: the named topics (or, when none
//! is named, every topic the caller may see) in name order, from the request's cursor on, at
//! most `response_partition_limit` partitions in all; `next_cursor` names the first
//! partition left out. What each topic says is Metadata's own answer (`topics::metadata`,
//! with its permission checks and without creating topics), so the two never disagree.
//! Eligible leader replicas (KIP-966's ELR) do not exist in Felix: they are null.

use std::net::SocketAddr;

use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, MetadataRequest, TopicName,
};

use super::Kafka;
use super::scope::Scope;
use super::topics;

/// Kafka's default for `response_partition_limit`, used when a request asks for none.
const DEFAULT_PARTITION_LIMIT: usize = 2000;
/// The Metadata version whose answer is reshaped (the newest served: topic ids included).
const METADATA_VERSION: i16 = 12;

/// Serves a DescribeTopicPartitions request.
pub async fn describe_topic_partitions(
    kafka: &Kafka,
    scope: &Scope,
    request: DescribeTopicPartitionsRequest,
    advertised: SocketAddr,
) -> DescribeTopicPartitionsResponse {
    let named = (!request.topics.is_empty()).then(|| {
        request
            .topics
            .iter()
            .map(|t| MetadataRequestTopic::default().with_name(Some(t.name.clone())))
            .collect()
    });
    let metadata = MetadataRequest::default()
        .with_topics(named)
        .with_allow_auto_topic_creation(false);
    let answer = topics::metadata(kafka, scope, metadata, METADATA_VERSION, advertised).await;
    let limit = usize::try_from(request.response_partition_limit)
        .ok()
        .filter(|l| *l > 0)
        .unwrap_or(DEFAULT_PARTITION_LIMIT);
    let cursor = request
        .cursor
        .map(|c| (c.topic_name, c.partition_index.max(0)));
    let (topics, next_cursor) = page(answer.topics, cursor, limit);
    DescribeTopicPartitionsResponse::default()
        .with_topics(topics)
        .with_next_cursor(next_cursor)
}

/// One page of `topics`: from `cursor` on, in name order, at most `limit` partitions.
fn page(
    mut topics: Vec<MetadataResponseTopic>,
    cursor: Option<(TopicName, i32)>,
    limit: usize,
) -> (Vec<DescribeTopicPartitionsResponseTopic>, Option<Cursor>) {
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    let mut left = limit;
    let mut out = Vec::with_capacity(topics.len());
    for topic in topics {
        let name = topic.name.clone().unwrap_or_default();
        let first = match &cursor {
            Some((at, _)) if name < *at => continue,
            Some((at, partition)) if name == *at => *partition,
            _ => 0,
        };
        let mut partitions: Vec<_> = topic
            .partitions
            .iter()
            .filter(|p| p.partition_index >= first)
            .map(|p| {
                DescribeTopicPartitionsResponsePartition::default()
                    .with_error_code(p.error_code)
                    .with_partition_index(p.partition_index)
                    .with_leader_id(p.leader_id)
                    .with_leader_epoch(p.leader_epoch)
                    .with_replica_nodes(p.replica_nodes.clone())
                    .with_isr_nodes(p.isr_nodes.clone())
                    .with_offline_replicas(p.offline_replicas.clone())
            })
            .collect();
        partitions.sort_by_key(|p| p.partition_index);
        if left == 0 && !partitions.is_empty() {
            let at = partitions[0].partition_index;
            return (out, Some(cursor_at(name, at)));
        }
        let cut = (partitions.len() > left).then(|| partitions[left].partition_index);
        partitions.truncate(left);
        left -= partitions.len();
        out.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_error_code(topic.error_code)
                .with_name(topic.name)
                .with_topic_id(topic.topic_id)
                .with_is_internal(topic.is_internal)
                .with_partitions(partitions)
                .with_topic_authorized_operations(topic.topic_authorized_operations),
        );
        if let Some(at) = cut {
            return (out, Some(cursor_at(name, at)));
        }
    }
    (out, None)
}

fn cursor_at(topic_name: TopicName, partition_index: i32) -> Cursor {
    Cursor::default()
        .with_topic_name(topic_name)
        .with_partition_index(partition_index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::metadata_response::MetadataResponsePartition;
    use kafka_protocol::protocol::StrBytes;

    fn name(s: &'static str) -> TopicName {
        TopicName(StrBytes::from_static_str(s))
    }

    fn topic(s: &'static str, partitions: i32) -> MetadataResponseTopic {
        MetadataResponseTopic::default()
            .with_name(Some(name(s)))
            .with_partitions(
                (0..partitions)
                    .map(|p| MetadataResponsePartition::default().with_partition_index(p))
                    .collect(),
            )
    }

    fn shape(page: &[DescribeTopicPartitionsResponseTopic]) -> Vec<(String, Vec<i32>)> {
        page.iter()
            .map(|t| {
                let n = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
                (n, t.partitions.iter().map(|p| p.partition_index).collect())
            })
            .collect()
    }

    #[test]
    fn pages_follow_the_cursor_in_name_order_until_every_partition_was_seen() {
        let all = || vec![topic("b", 3), topic("a", 2)];
        let (first, next) = page(all(), None, 3);
        assert_eq!(
            shape(&first),
            vec![("a".into(), vec![0, 1]), ("b".into(), vec![0])]
        );
        let next = next.expect("more to come");
        assert_eq!((next.topic_name.0.as_str(), next.partition_index), ("b", 1));
        let (second, last) = page(all(), Some((next.topic_name, 1)), 3);
        assert_eq!(shape(&second), vec![("b".into(), vec![1, 2])]);
        assert!(last.is_none());
        // A limit that ends exactly at a topic's end points the cursor at the next topic.
        let (first, next) = page(all(), None, 2);
        assert_eq!(shape(&first), vec![("a".into(), vec![0, 1])]);
        assert_eq!(next.map(|c| c.partition_index), Some(0));
    }
}
