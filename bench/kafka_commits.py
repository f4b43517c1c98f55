"""Synchronous offset commits per second through a Kafka classic group, as
bench/kafka-commits.sh drives it: produces RECORDS records to a one-partition topic, then one
confluent-kafka Consumer of group GROUP (partition 0 assigned, as a manual-assignment
consumer commits) reads them and commits each one synchronously before the next. Prints one
JSON line.

    python3 kafka_commits.py BOOTSTRAP TOPIC GROUP RECORDS
"""

import json
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def main(bootstrap, topic, group, records):
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(records):
        producer.produce(topic, value=f"v-{i}".encode(), partition=0)
    assert producer.flush(60) == 0, "records left unsent"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    committed = 0
    started = None
    deadline = time.time() + 600
    while committed < records and time.time() < deadline:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        if started is None:
            started = time.monotonic()
        consumer.commit(message=msg, asynchronous=False)
        committed += 1
    elapsed = time.monotonic() - started
    last = consumer.committed([TopicPartition(topic, 0)], timeout=30)[0].offset
    consumer.close()
    print(json.dumps({"commits": committed, "seconds": round(elapsed, 3),
                      "commits_per_s": round(committed / elapsed, 1), "last_committed": last}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
