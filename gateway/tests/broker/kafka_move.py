"""A confluent-kafka producer and consumer running side by side for a while, as
gateway/tests/broker/moves.rs drives them through a shard move. JSON on stdout:

    python3 kafka_move.py 127.0.0.1:9092 topic SECONDS

The producer (idempotent, acks=all) sends "m-i" to partition 0 at a steady pace for SECONDS;
the consumer (no group: partition 0 assigned from the beginning) reads until it has seen
every delivered message or 60 s more passed. Reports what was delivered, failed, read,
read twice and never read.
"""

import json
import sys
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def main():
    bootstrap, topic, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    delivered, failed = set(), []

    def on_delivery(err, msg):
        if err is not None:
            failed.append(str(err))
        else:
            delivered.add(msg.value().decode())

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "message.timeout.ms": 60000,
        "linger.ms": 5,
    })
    seen, twice = set(), 0
    stop = threading.Event()

    def consume():
        nonlocal twice
        consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
        })
        consumer.assign([TopicPartition(topic, 0, 0)])
        while not stop.is_set():
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            value = msg.value().decode()
            if value in seen:
                twice += 1
            seen.add(value)
        consumer.close()

    reader = threading.Thread(target=consume)
    reader.start()
    i, end = 0, time.time() + seconds
    while time.time() < end:
        producer.produce(topic, value=f"m-{i}".encode(), partition=0, on_delivery=on_delivery)
        producer.poll(0)
        i += 1
        time.sleep(0.002)
    producer.flush(60)
    deadline = time.time() + 60
    while not delivered <= seen and time.time() < deadline:
        time.sleep(0.2)
    stop.set()
    reader.join()
    print(json.dumps({
        "sent": i,
        "delivered": len(delivered),
        "failed": failed[:10],
        "read": len(seen),
        "read_twice": twice,
        "never_read": sorted(delivered - seen)[:10],
    }))


if __name__ == "__main__":
    main()
