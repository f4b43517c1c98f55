"""aiokafka (asyncio, pure Python) as gateway/tests/broker/kafka_clients.rs drives it: one run
creates a topic, produces records, consumes them through a consumer group (committing), and
asks for transactions. JSON on stdout. By hand:

    python3 kafka_aio.py 127.0.0.1:9092 aio-topic 10
"""

import asyncio
import json
import sys
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition


async def main(bootstrap, topic, count):
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    for i in range(count):
        await producer.send_and_wait(topic, key=f"key-{i}".encode(), value=f"value-{i}".encode())
    await producer.stop()

    group = f"{topic}-group"
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    records = []
    deadline = time.monotonic() + 30
    try:
        while len(records) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for msgs in batches.values():
                for m in msgs:
                    records.append([m.partition, m.offset, m.key.decode(), m.value.decode()])
            if batches:
                await consumer.commit()
        committed = 0
        for p in consumer.assignment():
            committed += max(0, await consumer.committed(p) or 0)
    finally:
        await consumer.stop()

    # Transactions: Felix has none and must refuse at once, not retriably.
    started = time.monotonic()
    refusal = {"error": None}
    tx = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="felix-aio-tx",
                          request_timeout_ms=30000)
    try:
        await asyncio.wait_for(tx.start(), 60)
    except Exception as e:  # noqa: BLE001: whatever aiokafka raises is what we report
        refusal = {"error": type(e).__name__, "message": str(e),
                   "retriable": bool(getattr(e, "retriable", False)),
                   "seconds": time.monotonic() - started}
    finally:
        await tx.stop()
    print(json.dumps({"records": records, "committed": committed, "transactions": refusal}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
