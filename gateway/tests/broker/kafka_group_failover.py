"""A Kafka classic consumer group across the loss of its coordinator's broker, as
gateway/tests/broker/kafka_group_failover.rs drives it with confluent-kafka. JSON on stdout.

    python3 kafka_group_failover.py first BOOTSTRAP TOPIC GROUP COUNT STOP_AT
        produces COUNT records round-robin over the topic's partitions, then two consumers
        of GROUP process STOP_AT records between them, each committed synchronously before
        it counts; prints the positions whose commits were acknowledged and the group's
        coordinator, then exits without closing the consumers (as a crash would).

    python3 kafka_group_failover.py offsets BOOTSTRAP TOPIC GROUP [P=OFFSET ...]
        reads GROUP's committed offsets of every partition (OffsetFetch), commits the given
        ones synchronously as a consumer without a group membership does, and reads them
        again.

    python3 kafka_group_failover.py resume BOOTSTRAP TOPIC GROUP COUNT
        two new consumers of GROUP read what the group has not processed, committing each
        record synchronously; prints the committed offsets they found, the records they
        processed and the group's coordinator now.
"""

import json
import os
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

TIMEOUT = 120


def consumer_config(bootstrap, group, n):
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": f"member-{n}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 1000,
    }


def coordinator(bootstrap, group):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.time() + 30
    while True:
        try:
            described = admin.describe_consumer_groups([group])[group].result(timeout=10)
            return described.coordinator.id
        except KafkaException:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def run_members(bootstrap, group, topic, keep_going, on_record):
    """Two consumers in threads; `on_record(n, consumer, msg)` under one lock; stops when
    `keep_going()` turns false or at the timeout. Returns the failures the clients saw."""
    lock = threading.Lock()
    failures = []
    consumers = [Consumer(consumer_config(bootstrap, group, n)) for n in range(2)]

    def member(n):
        consumer = consumers[n]
        consumer.subscribe([topic])
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            with lock:
                if not keep_going():
                    return
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                failures.append(str(msg.error()))
                continue
            with lock:
                if not keep_going():
                    return
                on_record(n, consumer, msg)

    threads = [threading.Thread(target=member, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return consumers, failures


def commit(consumer, msg, failures):
    """Commits the record's position synchronously: whether it was acknowledged."""
    try:
        consumer.commit(message=msg, asynchronous=False)
        return True
    except KafkaException as e:
        failures.append(f"commit: {e}")
        return False


def first(bootstrap, topic, group, count, stop_at):
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    partitions = len(producer.list_topics(topic, timeout=30).topics[topic].partitions)
    for i in range(count):
        producer.produce(topic, key=f"k-{i}".encode(), value=f"v-{i}".encode(),
                         partition=i % partitions)
    assert producer.flush(60) == 0, "records left unsent"

    processed = []
    positions = {}
    failures = []

    def on_record(n, consumer, msg):
        if commit(consumer, msg, failures):
            processed.append([n, msg.partition(), msg.offset()])
            p = msg.partition()
            positions[p] = max(positions.get(p, 0), msg.offset() + 1)

    consumers, seen = run_members(bootstrap, group, topic,
                                  lambda: len(processed) < stop_at, on_record)
    print(json.dumps({
        "processed": processed,
        "positions": {str(p): o for p, o in positions.items()},
        "per_member": [sum(1 for r in processed if r[0] == n) for n in range(2)],
        "coordinator": coordinator(bootstrap, group),
        "failures": (failures + seen)[:20],
    }), flush=True)
    # Gone without close(): no LeaveGroup, no last commit, as a crashed consumer.
    os._exit(0)


def resume(bootstrap, topic, group, count):
    probe = Consumer(consumer_config(bootstrap, group, "probe"))
    partitions = sorted(probe.list_topics(topic, timeout=30).topics[topic].partitions)
    # `first` produced round-robin: partition p holds the records i with i % n == p.
    ends = {p: len(range(p, count, len(partitions))) for p in partitions}
    # The committed offsets as the group's new coordinator answers them (OffsetFetch).
    deadline = time.time() + 60
    while True:
        try:
            committed = probe.committed([TopicPartition(topic, p) for p in partitions],
                                        timeout=10)
            break
        except KafkaException:
            if time.time() > deadline:
                raise
            time.sleep(0.5)
    probe.close()
    committed = {tp.partition: tp.offset for tp in committed}
    start = {p: max(committed[p], 0) for p in partitions}
    wanted = {(p, o) for p in partitions for o in range(start[p], ends[p])}

    processed = []
    failures = []

    def on_record(n, consumer, msg):
        if commit(consumer, msg, failures):
            processed.append([n, msg.partition(), msg.offset()])
            wanted.discard((msg.partition(), msg.offset()))

    consumers, seen = run_members(bootstrap, group, topic, lambda: bool(wanted), on_record)
    now = coordinator(bootstrap, group)
    for c in consumers:
        c.close()
    print(json.dumps({
        "committed": {str(p): o for p, o in committed.items()},
        "ends": {str(p): o for p, o in ends.items()},
        "processed": processed,
        "per_member": [sum(1 for r in processed if r[0] == n) for n in range(2)],
        "coordinator": now,
        "failures": (failures + seen)[:20],
    }))


def offsets(bootstrap, topic, group, commits):
    consumer = Consumer(consumer_config(bootstrap, group, "offsets"))
    partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)

    def read():
        got = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
        return {str(tp.partition): tp.offset for tp in got}

    before = read()
    if commits:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in commits],
                        asynchronous=False)
    after = read()
    consumer.close()
    print(json.dumps({"before": before, "after": after}))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "first":
        first(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    elif mode == "offsets":
        pairs = [a.split("=") for a in sys.argv[5:]]
        offsets(sys.argv[2], sys.argv[3], sys.argv[4], [(int(p), int(o)) for p, o in pairs])
    elif mode == "resume":
        resume(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        sys.exit(f"unknown mode {mode}")
