"""confluent-kafka's ShareConsumer (librdkafka's KIP-932 share consumer) as the share-group
tests drive it: one subcommand per role, JSON on stdout. Used by
gateway/tests/broker/kafka_share.rs; runnable by hand as well:

    python3 kafka_share.py split 127.0.0.1:9092 orders billing 1000 orders-dlq
    python3 kafka_share.py hold 127.0.0.1:9092 orders billing
    python3 kafka_share.py drain 127.0.0.1:9092 orders billing 20 --timeout 30
    python3 kafka_share.py group-configs 127.0.0.1:9092 billing share.auto.offset.reset=earliest

Record i of `split` has key "k-i" and value "v-i". Its consumers, in explicit
acknowledgement mode, answer record i with REJECT when i % 100 == 13, with RELEASE on its
first delivery when i % 100 == 7 (ACCEPT on the next), with RELEASE every time for the last
record (a poison record: released past the delivery limit), and with ACCEPT otherwise.
Acknowledgements ride on the next poll's ShareFetch; close() sends what is left.
"""

import argparse
import json
import sys
import threading
import time

from confluent_kafka import AcknowledgeType, Consumer, Producer, ShareConsumer, TopicPartition


def share_consumer(args, name, errors=None):
    config = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "client.id": name,
        "share.acknowledgement.mode": "explicit",
    }
    if getattr(args, "token", None):
        # A Felix token as the SASL PLAIN password (the username is ignored).
        config.update({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                       "sasl.username": "ignored", "sasl.password": args.token})
    if errors is not None:
        config["error_cb"] = lambda e: errors.append(e.name())
    return ShareConsumer(config)


def split(args):
    poison = args.count - 1
    accepted = {0: [], 1: []}
    released, rejected, poisoned, errors = [], [], [], []
    lock = threading.Lock()
    stop = threading.Event()

    def on_commit(offsets, exception):
        # The broker's answer to acknowledgements, piggy-backed or not.
        if exception is not None:
            with lock:
                errors.append(f"{exception}: {offsets}")

    def run(idx):
        c = share_consumer(args, f"share-{idx}")
        c.set_acknowledgement_commit_callback(on_commit)
        c.subscribe([args.topic])
        while not stop.is_set():
            for m in c.poll(0.5):
                if m.error():
                    with lock:
                        errors.append(str(m.error()))
                    continue
                i = int(m.value().decode().split("-")[1])
                dc = m.delivery_count()
                entry = [m.partition(), m.offset(), i, dc]
                with lock:
                    if i == poison:
                        kind = AcknowledgeType.RELEASE
                        poisoned.append(dc)
                    elif i % 100 == 13:
                        kind = AcknowledgeType.REJECT
                        rejected.append(entry)
                    elif i % 100 == 7 and dc == 1:
                        kind = AcknowledgeType.RELEASE
                        released.append(entry)
                    else:
                        kind = AcknowledgeType.ACCEPT
                        accepted[idx].append(entry)
                c.acknowledge(m, kind)
        c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    # Both consumers are in the group before the first record is sent.
    time.sleep(args.join_secs)
    # Idempotent, so a produce request retried on a slow machine cannot store a record
    # twice: what this checks is the share group's delivery, not the producer's.
    # Sent in small batches over about half a second, as records arrive from live producers:
    # a share fetch takes whole stored batches from every partition at once, so 1,000 records
    # sent in one burst (one stored batch per partition) could all go to whichever consumer
    # fetched first, and "split" would test the timing of the first fetch, not the sharing.
    p = Producer({
        "bootstrap.servers": args.bootstrap,
        "linger.ms": 5,
        "batch.num.messages": 10,
        "enable.idempotence": True,
    })
    for i in range(args.count):
        p.produce(args.topic, key=f"k-{i}", value=f"v-{i}")
        if i % 10 == 9:
            p.poll(0)
            time.sleep(0.005)
    p.flush(30)
    want = args.count - args.count // 100 - 1
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        with lock:
            done = len(accepted[0]) + len(accepted[1]) >= want and len(poisoned) >= args.limit
        if done:
            break
        time.sleep(0.2)
    # A little longer: anything delivered twice would show now.
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps({
        "accepted": [accepted[0], accepted[1]],
        "released": released,
        "rejected": rejected,
        "poisoned": poisoned,
        "errors": errors,
        "dead_letters": read_all(args.bootstrap, args.dlq, args.count // 100 + 1),
    }))


def read_all(bootstrap, topic, want, timeout=30):
    """Every record of every partition of `topic`, from the beginning, with its headers."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}",
                  "enable.auto.commit": False})
    md = c.list_topics(topic, timeout=10)
    c.assign([TopicPartition(topic, p, 0) for p in md.topics[topic].partitions])
    out = []
    deadline = time.monotonic() + timeout
    quiet_until = None
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            if len(out) >= want:
                quiet_until = quiet_until or time.monotonic() + 2
                if time.monotonic() > quiet_until:
                    break
            continue
        if m.error():
            continue
        headers = {k: v.decode() for k, v in (m.headers() or [])}
        out.append({"key": m.key().decode(), "headers": headers})
    c.close()
    return out


def hold(args):
    """Acquires records, prints them, then waits to be killed (never closes)."""
    c = share_consumer(args, "holder")
    c.subscribe([args.topic])
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        got = [m for m in c.poll(0.5) if not m.error()]
        if got:
            held = [[m.partition(), m.offset(), m.delivery_count()] for m in got]
            print(json.dumps({"held": held, "at": time.time()}), flush=True)
            break
    time.sleep(3600)


def drain(args):
    """Accepts records until `count` arrived or --timeout passed (or, with --stop-on-error,
    an error reached the application); notes when each came."""
    from confluent_kafka import KafkaException
    errors = []
    c = share_consumer(args, "drainer", errors)
    c.subscribe([args.topic])
    records = []
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and len(records) < args.count:
        if args.stop_on_error and errors:
            break
        try:
            polled = c.poll(0.2)
        except KafkaException as e:
            errors.append(e.args[0].name())
            continue
        for m in polled:
            if m.error():
                errors.append(m.error().name())
                continue
            records.append([m.partition(), m.offset(), m.delivery_count(), time.time()])
            c.acknowledge(m, AcknowledgeType.ACCEPT)
    try:
        c.close()
    except KafkaException as e:
        errors.append(e.args[0].name())
    print(json.dumps({"records": records, "errors": errors}))


def group_configs(args):
    """Sets a group's configs with IncrementalAlterConfigs (SET) on the GROUP resource."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, ResourceType)
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
               for k, v in (kv.split("=", 1) for kv in args.set)]
    resource = ConfigResource(ResourceType.GROUP, args.group, incremental_configs=entries)
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout=30)
        print(json.dumps({"error": None}))
    except KafkaException as e:
        err = e.args[0]
        print(json.dumps({"error": err.name(), "message": err.str()}))


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("split")
    for a in ("bootstrap", "topic", "group"):
        p.add_argument(a)
    p.add_argument("count", type=int)
    p.add_argument("dlq")
    p.add_argument("--limit", type=int, default=3, help="the group's delivery-count limit")
    p.add_argument("--join-secs", type=float, default=3.0)
    p.add_argument("--timeout", type=float, default=90)
    p.set_defaults(run=split)
    p = sub.add_parser("hold")
    for a in ("bootstrap", "topic", "group"):
        p.add_argument(a)
    p.add_argument("--timeout", type=float, default=30)
    p.set_defaults(run=hold)
    p = sub.add_parser("drain")
    for a in ("bootstrap", "topic", "group"):
        p.add_argument(a)
    p.add_argument("count", type=int)
    p.add_argument("--timeout", type=float, default=30)
    p.add_argument("--token", help="a Felix token, sent with SASL PLAIN")
    p.add_argument("--stop-on-error", action="store_true")
    p.set_defaults(run=drain)
    p = sub.add_parser("group-configs")
    p.add_argument("bootstrap")
    p.add_argument("group")
    p.add_argument("set", nargs="+")
    p.set_defaults(run=group_configs)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())
