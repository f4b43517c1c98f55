"""confluent-kafka's AdminClient and a manual-assignment consumer, as the Kafka admin tests
(gateway/tests/broker/kafka_admin.rs) drive them: one subcommand per call, JSON on stdout.
Runnable by hand as well:

    python3 kafka_admin.py commit 127.0.0.1:9092 orders g1 0 40
    python3 kafka_admin.py create-partitions 127.0.0.1:9092 orders 4

A call Felix refuses prints {"error": <Kafka error name>, "message": ...} rather than failing.
"""

import argparse
import json

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient


def admin(args):
    return AdminClient({"bootstrap.servers": args.bootstrap})


def refused(e):
    err = e.args[0]
    return {"error": err.name(), "message": err.str()}


def commit(args):
    """Commits `offset` for `group` on one partition, as a consumer with a manual
    assignment does (no group membership)."""
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group,
                         "enable.auto.commit": False})
    try:
        done = consumer.commit(offsets=[TopicPartition(args.topic, args.partition, args.offset)],
                               asynchronous=False)
        print(json.dumps({"committed": [[tp.partition, tp.offset] for tp in done]}))
    except KafkaException as e:
        print(json.dumps(refused(e)))
    finally:
        consumer.close()


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("commit")
    p.add_argument("bootstrap")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("partition", type=int)
    p.add_argument("offset", type=int)
    p.set_defaults(run=commit)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
