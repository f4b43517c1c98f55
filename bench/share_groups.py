"""One run of bench/share-groups.sh: consume+accept records/s of a Kafka share group (1 or N
ShareConsumers) or of a classic consumer group (one Consumer, offsets auto-committed), on a
fresh topic holding RECORDS records. Prints one JSON line.

A share group's records are accepted in one of the two ways a ShareConsumer offers:
`share` acknowledges each record with an explicit ACCEPT call (one call into the client per
record), `implicit` (`share.acknowledgement.mode=implicit`, Kafka's default) accepts every
record a poll returned when the next poll is made. Both send their acceptances piggy-backed
on the next ShareFetch; only the client's work per record differs.

    python3 bench/share_groups.py share|implicit BOOTSTRAP TOPIC RECORDS CONSUMERS
    python3 bench/share_groups.py classic BOOTSTRAP TOPIC RECORDS 1
    python3 bench/share_groups.py produce BOOTSTRAP TOPIC RECORDS SIZE
    python3 bench/share_groups.py join BOOTSTRAP TOPIC GROUP

`join` makes the share group exist on the topic before records are sent (a share group
starts at `latest`, as in Kafka); the timed part of a share run starts at subscribe(), as
the classic one's does. Two rates: over subscribe() to the last record (which for the
classic group includes its join and the broker's 3 s initial rebalance delay), and over the
first record received to the last (steady state, the figure compared).
"""

import json
import multiprocessing as mp
import sys
import time

from confluent_kafka import AcknowledgeType, Consumer, Producer, ShareConsumer


def produce(bootstrap, topic, n, size):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    payload = b"x" * size
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=payload, key=str(i))
                break
            except BufferError:
                p.poll(0.05)
    p.flush(60)


def join(bootstrap, topic, group):
    # The topic first: a share group is created on the topics that exist when its members
    # subscribe, and starts there at `latest`.
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=-1)])[topic].result(timeout=30)
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    c.subscribe([topic])
    until = time.monotonic() + 3
    while time.monotonic() < until:
        c.poll(0.5)
    c.close()


def share_worker(bootstrap, topic, group, mode, total, done, start, out):
    explicit = mode == "share"
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "share.acknowledgement.mode": "explicit" if explicit else "implicit"})
    start.wait()
    c.subscribe([topic])
    mine, first, last = 0, None, 0.0
    while done.value < total:
        got = c.poll(0.2)
        k = 0
        for m in got:
            if m.error():
                continue
            if explicit:
                c.acknowledge(m, AcknowledgeType.ACCEPT)
            k += 1
        if k:
            mine += k
            with done.get_lock():
                done.value += k
            last = time.time()
            first = first or last
    c.close()
    out.put((mine, first or last, last))


def share(bootstrap, topic, n, consumers, mode):
    group = f"{topic}-share"
    done = mp.Value("q", 0)
    start = mp.Event()
    out = mp.Queue()
    procs = [mp.Process(target=share_worker,
                        args=(bootstrap, topic, group, mode, n, done, start, out))
             for _ in range(consumers)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # processes up and imported
    t0 = time.time()
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    first = min(r[1] for r in results if r[0])
    last = max(r[2] for r in results)
    got = sum(r[0] for r in results)
    return {"records": got, "seconds": round(last - t0, 3),
            "steady_seconds": round(last - first, 3),
            "per_consumer": [r[0] for r in results]}


def classic(bootstrap, topic, n):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-classic",
                  "auto.offset.reset": "earliest", "enable.auto.commit": True})
    t0 = time.time()
    c.subscribe([topic])
    got, first = 0, None
    while got < n:
        for m in c.consume(1000, 0.5):
            if not m.error():
                got += 1
                first = first or time.time()
    last = time.time()
    c.close()
    return {"records": got, "seconds": round(last - t0, 3),
            "steady_seconds": round(last - first, 3), "per_consumer": [got]}


def main():
    kind, bootstrap, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "produce":
        produce(bootstrap, topic, int(sys.argv[4]), int(sys.argv[5]))
        return
    if kind == "join":
        join(bootstrap, topic, sys.argv[4])
        return
    n, consumers = int(sys.argv[4]), int(sys.argv[5])
    if kind == "classic":
        r = classic(bootstrap, topic, n)
    else:
        r = share(bootstrap, topic, n, consumers, kind)
    r.update({"kind": kind, "consumers": consumers,
              "records_per_s": round(r["records"] / r["seconds"], 1),
              "steady_records_per_s": round(r["records"] / max(r["steady_seconds"], 1e-3), 1)})
    print(json.dumps(r))


if __name__ == "__main__":
    main()
