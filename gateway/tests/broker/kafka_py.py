"""kafka-python as gateway/tests/broker/kafka_clients.rs drives it: one run creates a topic
with one partition, produces records with an idempotent producer, lists that producer with
DescribeProducers, consumes them through a consumer group (committing),
then grows the topic with CreatePartitions, reads the partition count back and pages through
its partitions with DescribeTopicPartitions. JSON on
stdout. By hand:

    python3 kafka_py.py 127.0.0.1:9092 py-topic 10
"""

import json
import sys
import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewPartitions, NewTopic


def main(bootstrap, topic, count):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    for i in range(count):
        producer.send(topic, key=f"key-{i}".encode(), value=f"value-{i}".encode())
    producer.flush(30)
    producer.close()

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"{topic}-group",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    records = []
    deadline = time.monotonic() + 30
    while len(records) < count and time.monotonic() < deadline:
        for msgs in consumer.poll(timeout_ms=500).values():
            for m in msgs:
                records.append([m.partition, m.offset, m.key.decode(), m.value.decode()])
        consumer.commit()
    committed = sum(consumer.committed(p) or 0 for p in consumer.assignment())
    consumer.close()

    # DescribeProducers: the idempotent producer above, with the last sequence it landed.
    states = admin.describe_producers([TopicPartition(topic, 0)])
    producers = [[p.producer_id, p.producer_epoch, p.last_sequence]
                 for state in states.values() for p in state.active_producers]

    admin.create_partitions({topic: NewPartitions(total_count=3)})
    partitions = len(admin.describe_topics([topic])[0]["partitions"])
    # DescribeTopicPartitions (KIP-966), two partitions a page, following the cursor.
    pages, cursor = [], None
    while len(pages) < 5:
        page = admin.describe_topic_partitions([topic], response_partition_limit=2, cursor=cursor)
        pages.append([[t["name"], t["error_code"], [p["partition_index"] for p in t["partitions"]]]
                      for t in page["topics"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    unknown = admin.describe_topic_partitions(["no-such-topic"])["topics"]
    admin.close()
    print(json.dumps({"records": records, "committed": committed, "partitions": partitions,
                      "producers": producers,
                      "pages": pages, "unknown": [[t["name"], t["error_code"]] for t in unknown]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
