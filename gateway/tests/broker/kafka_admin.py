"""confluent-kafka's AdminClient and a manual-assignment consumer, as the Kafka admin tests
(gateway/tests/broker/kafka_admin.rs) drive them: one subcommand per call, JSON on stdout.
Runnable by hand as well:

    python3 kafka_admin.py commit 127.0.0.1:9092 orders g1 0 40
    python3 kafka_admin.py create-partitions 127.0.0.1:9092 orders 4
    python3 kafka_admin.py delete-records 127.0.0.1:9092 orders 0 100
    python3 kafka_admin.py list-offsets 127.0.0.1:9092 orders 0 max
    python3 kafka_admin.py delete-groups 127.0.0.1:9092 g1 [--member orders]
    python3 kafka_admin.py reset-configs 127.0.0.1:9092 orders retention.ms
    python3 kafka_admin.py read-from 127.0.0.1:9092 orders 0 100

With --token (before the subcommand) every call authenticates with SASL/PLAIN and that
Felix token. A call Felix refuses prints {"error": <Kafka error name>, "message": ...} rather than failing.
"""

import argparse
import json
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient


def base(args):
    """The client settings: SASL/PLAIN with a Felix token when --token is given."""
    c = {"bootstrap.servers": args.bootstrap}
    if args.token:
        c.update({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                  "sasl.username": "ignored", "sasl.password": args.token})
    return c


def admin(args):
    return AdminClient(base(args))


def refused(e):
    err = e.args[0]
    return {"error": err.name(), "message": err.str()}


def commit(args):
    """Commits `offset` for `group` on one partition, as a consumer with a manual
    assignment does (no group membership)."""
    consumer = Consumer({**base(args), "group.id": args.group, "enable.auto.commit": False})
    try:
        done = consumer.commit(offsets=[TopicPartition(args.topic, args.partition, args.offset)],
                               asynchronous=False)
        print(json.dumps({"committed": [[tp.partition, tp.offset] for tp in done]}))
    except KafkaException as e:
        print(json.dumps(refused(e)))
    finally:
        consumer.close()


def create_partitions(args):
    from confluent_kafka.admin import NewPartitions
    client = admin(args)
    futures = client.create_partitions([NewPartitions(args.topic, args.count)],
                                            operation_timeout=30)
    try:
        futures[args.topic].result(timeout=60)
        md = client.list_topics(args.topic, timeout=30)
        print(json.dumps({"partitions": len(md.topics[args.topic].partitions)}))
    except KafkaException as e:
        print(json.dumps(refused(e)))


def delete_groups(args):
    """Deletes the groups; with --member TOPIC a consumer of the first group is subscribed
    (and assigned) while the deletion is asked, and closed after."""
    member = None
    if args.member:
        member = Consumer({**base(args), "group.id": args.groups[0],
                           "session.timeout.ms": 10000})
        member.subscribe([args.member])
        deadline = time.time() + 60
        while not member.assignment() and time.time() < deadline:
            member.poll(0.5)
    client = admin(args)
    futures = client.delete_consumer_groups(args.groups, request_timeout=30)
    out = {}
    for group, future in futures.items():
        try:
            future.result(timeout=30)
            out[group] = None
        except KafkaException as e:
            out[group] = refused(e)["error"]
    if member is not None:
        out["member_assigned"] = bool(member.assignment())
        member.close()
    print(json.dumps(out))


def delete_records(args):
    client = admin(args)
    futures = client.delete_records([TopicPartition(args.topic, args.partition, args.offset)],
                                         operation_timeout=30)
    try:
        (tp, future), = futures.items()
        deleted = future.result(timeout=30)
        print(json.dumps({"low_watermark": deleted.low_watermark}))
    except KafkaException as e:
        print(json.dumps(refused(e)))


def list_offsets(args):
    from confluent_kafka.admin import OffsetSpec
    spec = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(),
            "max": OffsetSpec.max_timestamp()}[args.spec]
    client = admin(args)
    futures = client.list_offsets({TopicPartition(args.topic, args.partition): spec},
                                       request_timeout=30)
    try:
        (tp, future), = futures.items()
        info = future.result(timeout=30)
        print(json.dumps({"offset": info.offset, "timestamp": info.timestamp}))
    except KafkaException as e:
        print(json.dumps(refused(e)))


def read_from(args):
    """Reads one partition from `offset` with a consumer that never resets its position:
    the first record's offset, or the first error the application sees."""
    consumer = Consumer({**base(args), "group.id": "read-from", "enable.auto.commit": False,
                         "auto.offset.reset": "error"})
    consumer.assign([TopicPartition(args.topic, args.partition, args.offset)])
    out = {"first": None, "error": None}
    deadline = time.time() + 30
    try:
        while time.time() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                out["error"] = msg.error().str()
            else:
                out["first"] = msg.offset()
            break
    finally:
        consumer.close()
    print(json.dumps(out))


def reset_configs(args):
    """Resets topic configs with IncrementalAlterConfigs DELETE, then describes them."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    client = admin(args)
    entries = [ConfigEntry(name, None, incremental_operation=AlterConfigOpType.DELETE)
               for name in args.names]
    resource = ConfigResource(ResourceType.TOPIC, args.topic, incremental_configs=entries)
    try:
        client.incremental_alter_configs([resource])[resource].result(timeout=30)
    except KafkaException as e:
        print(json.dumps(refused(e)))
        return
    resource = ConfigResource(ResourceType.TOPIC, args.topic)
    described = client.describe_configs([resource])[resource].result(timeout=30)
    print(json.dumps({k: v.value for k, v in described.items()}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--token", default="", help="authenticate with SASL/PLAIN and this token")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("commit")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("partition", type=int)
    p.add_argument("offset", type=int)
    p.set_defaults(run=commit)
    p = sub.add_parser("create-partitions")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("count", type=int)
    p.set_defaults(run=create_partitions)
    p = sub.add_parser("delete-groups")
    p.add_argument("bootstrap")
    p.add_argument("groups", nargs="+")
    p.add_argument("--member", help="a topic a member of the first group consumes meanwhile")
    p.set_defaults(run=delete_groups)
    p = sub.add_parser("delete-records")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("offset", type=int)
    p.set_defaults(run=delete_records)
    p = sub.add_parser("list-offsets")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("spec", choices=["earliest", "latest", "max"])
    p.set_defaults(run=list_offsets)
    p = sub.add_parser("read-from")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("offset", type=int)
    p.set_defaults(run=read_from)
    p = sub.add_parser("reset-configs")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("names", nargs="+")
    p.set_defaults(run=reset_configs)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
