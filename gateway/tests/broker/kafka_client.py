"""confluent-kafka (librdkafka inside) as the Kafka tests drive it: one subcommand per role,
JSON on stdout. Used by gateway/tests/broker/kafka.rs; runnable by hand as well:

    python3 kafka_client.py produce 127.0.0.1:9092 orders 1000 --partitions 4
    python3 kafka_client.py consume 127.0.0.1:9092 orders 1000
    python3 kafka_client.py group 127.0.0.1:9092 orders g1 500

Record i of a produce has key "key-i", value "value-i" (padded with "." to --value-bytes),
header n=i and timestamp 1700000000000 + i. A produce reports the throttles the broker asked
for (throttle_time_ms, as librdkafka's throttle callback hands them on).
"""

import argparse
import json
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BASE_TS = 1_700_000_000_000


def create(args):
    try:
        print(json.dumps(create_topic(args)))
    except KafkaException as e:
        if not args.allow_error:
            raise
        err = e.args[0]
        print(json.dumps({"error": err.name(), "message": err.str()}))


def configs(args):
    """Sets topic configs with IncrementalAlterConfigs (SET), then describes them."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    if args.set:
        entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                   for k, v in (kv.split("=", 1) for kv in args.set)]
        resource = ConfigResource(ResourceType.TOPIC, args.topic, incremental_configs=entries)
        admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    resource = ConfigResource(ResourceType.TOPIC, args.topic)
    described = admin.describe_configs([resource])[resource].result(timeout=30)
    print(json.dumps({k: v.value for k, v in described.items()}))


def create_topic(args):
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    configs = dict(kv.split("=", 1) for kv in args.config)
    topic = NewTopic(args.topic, num_partitions=args.partitions, replication_factor=1, config=configs)
    futures = admin.create_topics([topic], operation_timeout=30)
    futures[args.topic].result(timeout=60)
    md = admin.list_topics(args.topic, timeout=30)
    return {"partitions": len(md.topics[args.topic].partitions)}


def produce(args):
    throttles = []
    if args.partitions > 0:
        create_topic(argparse.Namespace(bootstrap=args.bootstrap, topic=args.topic,
                                        partitions=args.partitions, config=[]))
    producer = Producer({
        "bootstrap.servers": args.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        # Many batches, so idempotent sequences cross batch boundaries (and, with small
        # segments, many segments).
        "batch.num.messages": args.batch,
        "throttle_cb": lambda event: throttles.append(int(event.throttle_time * 1000)),
    })
    delivered = []
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            i = int(msg.key().decode().split("-", 1)[1])
            delivered.append([msg.partition(), msg.offset(), i])

    for i in range(args.first, args.first + args.count):
        while True:
            try:
                producer.produce(args.topic, key=f"key-{i}",
                                 value=f"value-{i}".ljust(args.value_bytes, "."),
                                 headers=[("n", str(i).encode())], timestamp=BASE_TS + i,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(60)
    print(json.dumps({"delivered": delivered, "errors": errors, "unflushed": left,
                      "throttles_ms": throttles}))


def record(msg):
    headers = [[k, v.decode()] for k, v in (msg.headers() or [])]
    return {
        "p": msg.partition(), "o": msg.offset(),
        "k": msg.key().decode() if msg.key() is not None else None,
        "v": msg.value().decode() if msg.value() is not None else None,
        "ts": msg.timestamp()[1], "h": headers,
    }


def consume(args):
    """Reads `count` records from offset 0 of every partition, without a group."""
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": "unused-assign-only",
        "enable.auto.commit": False,
        # Small fetches: many round trips, across tiers.
        "message.max.bytes": 16384,
        "fetch.max.bytes": 65536,
        "max.partition.fetch.bytes": 16384,
    })
    md = consumer.list_topics(args.topic, timeout=30)
    partitions = sorted(md.topics[args.topic].partitions)
    consumer.assign([TopicPartition(args.topic, p, 0) for p in partitions])
    out = []
    deadline = time.time() + args.timeout
    while len(out) < args.count and time.time() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            print(json.dumps({"error": str(msg.error())}), file=sys.stderr)
            continue
        out.append(record(msg))
    consumer.close()
    print(json.dumps(out))


def consume_errors(args):
    """Reads partition 0 from offset 0 until the first error the client reports to the
    application (or the timeout): the records before it and the errors."""
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap,
        "group.id": "unused-assign-only",
        "enable.auto.commit": False,
        "max.partition.fetch.bytes": 16384,
    })
    consumer.assign([TopicPartition(args.topic, 0, 0)])
    out, errors = [], []
    deadline = time.time() + args.timeout
    while not errors and time.time() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            errors.append(f"{msg.error().name()}: {msg.error().str()}")
            continue
        out.append(record(msg))
    consumer.close()
    print(json.dumps({"records": out, "errors": errors}))


def group(args):
    """Two consumers of one group process `stop_at` records between them, committing each
    one synchronously before counting it; records seen after that are left uncommitted."""
    lock = threading.Lock()
    processed = []
    counts = [0, 0]
    failures = []
    done = threading.Event()

    def member(n):
        consumer = Consumer({
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "client.id": f"member-{n}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000,
        })
        consumer.subscribe([args.topic])
        deadline = time.time() + args.timeout
        try:
            while not done.is_set() and time.time() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    failures.append(str(msg.error()))
                    continue
                with lock:
                    if len(processed) >= args.stop_at:
                        done.set()
                        break
                    try:
                        consumer.commit(message=msg, asynchronous=False)
                    except KafkaException as e:
                        # Not committed: not processed; the group delivers it again.
                        failures.append(f"commit: {e}")
                        continue
                    processed.append([n, msg.partition(), msg.offset(),
                                      msg.key().decode(), msg.value().decode()])
                    counts[n] += 1
                    if len(processed) >= args.stop_at:
                        done.set()
        finally:
            consumer.close()

    threads = [threading.Thread(target=member, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"records": processed, "per_member": counts, "failures": failures[:20]}))


def transactions(args):
    """Asks for transactions (init_transactions): Felix has none and must say so at once,
    with an error the client does not retry."""
    producer = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": "felix-tx"})
    started = time.monotonic()
    try:
        producer.init_transactions(args.timeout)
        print(json.dumps({"error": None}))
    except KafkaException as e:
        err = e.args[0]
        print(json.dumps({"error": err.name(), "fatal": err.fatal(), "retriable": err.retriable(),
                          "message": err.str(), "seconds": time.monotonic() - started}))


def unsupported_group(args):
    """A KIP-848 consumer (group.protocol=consumer): polls until the first error reaches
    the application, or --timeout passes."""
    config = {"bootstrap.servers": args.bootstrap, "group.id": f"felix-{args.kind}",
              "group.protocol": "consumer"}
    consumer = Consumer(config)
    consumer.subscribe([args.topic])
    deadline = time.monotonic() + args.timeout
    result = {"error": None}
    while time.monotonic() < deadline and result["error"] is None:
        try:
            polled = consumer.poll(1.0)
        except KafkaException as e:
            err = e.args[0]
            result = {"error": err.name(), "message": err.str()}
            break
        for m in polled if isinstance(polled, list) else [polled]:
            if m is not None and m.error():
                result = {"error": m.error().name(), "message": m.error().str()}
                break
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("create")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("partitions", type=int)
    p.add_argument("config", nargs="*")
    p.add_argument("--allow-error", action="store_true")
    p.set_defaults(run=create)
    p = sub.add_parser("configs")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("set", nargs="*")
    p.set_defaults(run=configs)
    p = sub.add_parser("transactions")
    p.add_argument("bootstrap")
    p.add_argument("--timeout", type=float, default=30)
    p.set_defaults(run=transactions)
    p = sub.add_parser("unsupported-group")
    p.add_argument("kind", choices=["consumer-protocol"])
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("--timeout", type=float, default=30)
    p.set_defaults(run=unsupported_group)
    p = sub.add_parser("produce")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("count", type=int)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--partitions", type=int, default=0)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--value-bytes", type=int, default=0)
    p.set_defaults(run=produce)
    p = sub.add_parser("consume")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("count", type=int)
    p.add_argument("--timeout", type=float, default=60)
    p.set_defaults(run=consume)
    p = sub.add_parser("consume-errors")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("--timeout", type=float, default=60)
    p.set_defaults(run=consume_errors)
    p = sub.add_parser("group")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("stop_at", type=int)
    p.add_argument("--timeout", type=float, default=90)
    p.set_defaults(run=group)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
