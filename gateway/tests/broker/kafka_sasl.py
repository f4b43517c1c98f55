"""confluent-kafka (librdkafka inside) against a Felix Kafka listener with SASL and TLS, as
gateway/tests/broker/kafka_auth.rs drives it: one subcommand per case, JSON on stdout.
Runnable by hand as well:

    python3 kafka_sasl.py roundtrip 127.0.0.1:9092 orders 100 --protocol SASL_PLAINTEXT \\
        --mechanism PLAIN --token "$(cat felix-data/admin.token)"
    python3 kafka_sasl.py probe 127.0.0.1:9092 --protocol SASL_SSL --ca cert.pem \\
        --mechanism OAUTHBEARER --token "$TOKEN"

PLAIN hands the token over as the password (the username is ignored); OAUTHBEARER hands it
over from oauth_cb, as an application fetching its token would. Errors the client reports to
the application (error_cb, delivery reports, consumer errors) are printed by their Kafka
error names, so the tests can tell an authentication failure from an authorization one.
"""

import argparse
import json
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def config(args, errors):
    c = {
        "bootstrap.servers": args.bootstrap,
        "security.protocol": args.protocol,
        "error_cb": lambda e: errors.append({"name": e.name(), "message": e.str()}),
        # A failed connection is not retried for long: the tests want the failure.
        "reconnect.backoff.ms": 200,
        "reconnect.backoff.max.ms": 1000,
    }
    if args.protocol in ("SSL", "SASL_SSL"):
        c["ssl.ca.location"] = args.ca
    if args.protocol.startswith("SASL"):
        c["sasl.mechanism"] = args.mechanism
        if args.mechanism == "PLAIN":
            c["sasl.username"] = "ignored"
            c["sasl.password"] = args.token
        else:
            token = args.token
            c["oauth_cb"] = lambda _config: (token, time.time() + 3600, "felix-client", {})
    return c


def roundtrip(args):
    """Produces `count` records (idempotent, acks=all) and reads them back from offset 0."""
    errors = []
    producer = Producer({**config(args, errors), "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5})
    delivered, failed = [], []

    def on_delivery(err, msg):
        if err is not None:
            failed.append(err.name())
        else:
            delivered.append(msg.offset())

    for i in range(args.count):
        producer.produce(args.topic, key=f"key-{i}", value=f"value-{i}".ljust(args.pad, "."),
                         on_delivery=on_delivery)
        producer.poll(0)
    unflushed = producer.flush(30)
    consumer = Consumer({**config(args, errors), "group.id": args.group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(args.topic, 0, 0)])
    read = []
    deadline = time.time() + 30
    while len(read) < args.count and time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            errors.append({"name": msg.error().name(), "message": msg.error().str()})
            break
        read.append(msg.value().decode().rstrip("."))
    # The group's offsets, committed through the coordinator (group.consume).
    committed = None
    if read:
        try:
            consumer.commit(offsets=[TopicPartition(args.topic, 0, len(read))], asynchronous=False)
            committed = consumer.committed([TopicPartition(args.topic, 0)], timeout=10)[0].offset
        except KafkaException as e:
            errors.append({"name": e.args[0].name(), "message": e.args[0].str()})
    consumer.close()
    print(json.dumps({"delivered": len(delivered), "failed": failed, "unflushed": unflushed,
                      "read": read, "committed": committed, "errors": errors}))


def probe(args):
    """Asks for metadata: the topics the principal sees, or the error."""
    errors = []
    consumer = Consumer({**config(args, errors), "group.id": "probe"})
    started = time.time()
    out = {}
    # Asked in short tries, so an authentication failure (reported through error_cb while
    # librdkafka keeps reconnecting) ends the probe as soon as the client knows of it.
    while time.time() < started + args.timeout:
        try:
            md = consumer.list_topics(timeout=1)
            out = {"topics": sorted(md.topics)}
            break
        except KafkaException as e:
            out = {"error": e.args[0].name(), "message": e.args[0].str()}
            consumer.poll(0.1)  # serves error_cb
            if any(err["name"] == "_AUTHENTICATION" for err in errors):
                break
    out["errors"] = errors[:5]
    out["seconds"] = round(time.time() - started, 3)
    consumer.close()
    print(json.dumps(out))


def produce_one(args):
    """Produces one record: the delivery report's error name, or null."""
    errors = []
    producer = Producer({**config(args, errors), "message.timeout.ms": 10000})
    result = []
    producer.produce(args.topic, value=b"x",
                     on_delivery=lambda err, _m: result.append(err.name() if err else None))
    producer.flush(15)
    print(json.dumps({"result": result[0] if result else "no delivery report",
                      "errors": errors}))


def consume_one(args):
    """Reads partition 0 from offset 0: the first record's value or the first error."""
    errors = []
    consumer = Consumer({**config(args, errors), "group.id": args.group,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(args.topic, 0, 0)])
    out = {"value": None, "error": None}
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            out["error"] = msg.error().name()
        else:
            out["value"] = msg.value().decode()
        break
    consumer.close()
    out["errors"] = errors
    print(json.dumps(out))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["roundtrip", "probe", "produce_one", "consume_one"])
    p.add_argument("bootstrap")
    p.add_argument("topic", nargs="?", default="")
    p.add_argument("count", nargs="?", type=int, default=0)
    p.add_argument("--protocol", default="SASL_PLAINTEXT")
    p.add_argument("--mechanism", default="PLAIN")
    p.add_argument("--token", default="")
    p.add_argument("--ca", default="")
    p.add_argument("--group", default="sasl-test")
    p.add_argument("--timeout", type=float, default=10)
    p.add_argument("--pad", type=int, default=0, help="pad each value with '.' to this size")
    args = p.parse_args()
    {"roundtrip": roundtrip, "probe": probe, "produce_one": produce_one,
     "consume_one": consume_one}[args.command](args)


if __name__ == "__main__":
    main()
