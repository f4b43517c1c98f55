"""Where the time of one consumer goes (bench/results/share-groups.md, "Where the time goes"):
one confluent-kafka consumer reads RECORDS records of TOPIC and prints its own CPU seconds
(user + system of the whole process, librdkafka's threads included) over the steady part
(first record to last), per 10k records, and for a ShareConsumer the seconds spent inside
poll() (waiting for the ShareFetch answer and building the messages) and the sizes of the
polls. Run it against a broker already up, on a topic whose share group was made to exist
before the records were sent (`python3 bench/share_groups.py join ...`, then `produce`).

    python3 bench/share_groups_probe.py share BOOTSTRAP TOPIC RECORDS ack|implicit ['{"max.poll.records": 5000}']
    python3 bench/share_groups_probe.py classic BOOTSTRAP TOPIC RECORDS

Pair it with the broker's CPU ticks (/proc/PID/stat) and `felix_kafka_requests_total` /
`felix_kafka_request_duration_seconds{api="ShareFetch"}` read before and after.
"""

import collections
import json
import resource
import sys
import time

from confluent_kafka import AcknowledgeType, Consumer, ShareConsumer


def cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def share(bootstrap, topic, n, mode, extra):
    conf = {"bootstrap.servers": bootstrap, "group.id": f"{topic}-share",
            "share.acknowledgement.mode": "implicit" if mode == "implicit" else "explicit"}
    conf.update(extra)
    c = ShareConsumer(conf)
    c.subscribe([topic])
    got, first, cpu_first, in_poll = 0, None, 0.0, 0.0
    sizes = collections.Counter()
    while got < n:
        t = time.time()
        msgs = c.poll(0.2)
        if first is not None:
            in_poll += time.time() - t
        k = 0
        for m in msgs:
            if m.error():
                continue
            if mode == "ack":
                c.acknowledge(m, AcknowledgeType.ACCEPT)
            k += 1
        if k:
            if first is None:
                first, cpu_first = time.time(), cpu()
            sizes[k] += 1
            got += k
    last, cpu_last = time.time(), cpu()
    c.close()
    return {"kind": "share", "mode": mode, "records": got, "steady_s": round(last - first, 3),
            "records_per_s": round(got / max(last - first, 1e-3)),
            "client_cpu_s": round(cpu_last - cpu_first, 3),
            "client_cpu_s_per_10k": round((cpu_last - cpu_first) / got * 10000, 4),
            "in_poll_s": round(in_poll, 3), "polls": sum(sizes.values()),
            "poll_sizes_top": sizes.most_common(5)}


def classic(bootstrap, topic, n):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-classic",
                  "auto.offset.reset": "earliest", "enable.auto.commit": True})
    c.subscribe([topic])
    got, first, cpu_first = 0, None, 0.0
    while got < n:
        for m in c.consume(1000, 0.5):
            if not m.error():
                got += 1
                if first is None:
                    first, cpu_first = time.time(), cpu()
    last, cpu_last = time.time(), cpu()
    c.close()
    return {"kind": "classic", "records": got, "steady_s": round(last - first, 3),
            "records_per_s": round(got / max(last - first, 1e-3)),
            "client_cpu_s": round(cpu_last - cpu_first, 3),
            "client_cpu_s_per_10k": round((cpu_last - cpu_first) / got * 10000, 4)}


if __name__ == "__main__":
    kind, bootstrap, topic, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if kind == "share":
        extra = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
        print(json.dumps(share(bootstrap, topic, n, sys.argv[5], extra)))
    else:
        print(json.dumps(classic(bootstrap, topic, n)))
