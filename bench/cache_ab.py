#!/usr/bin/env python3
"""Alternating A/B runs of `felix-bench cache --durable` against one broker, with the CPU
each side spends per operation (local runs only; CI never runs it).

    bench/cache_ab.py PAIRS OPS FELIX_A BENCH_A FELIX_B BENCH_B >> out.jsonl

Each run starts a fresh broker (FELIX, a data dir of its own, loopback ports) and runs its
BENCH's `cache` scenario (10,000 keys, 16 clients, 1 KiB values: bench/cache.sh's load)
against it, sampling utime+stime of the broker and of the load generator every 10 ms; the
phases' spans come from the seconds the bench reports. One JSON line per run: ops/s and
p50 of each phase, broker and bench CPU µs per operation, cores used, and the 1-minute
load average."""
import json, os, shutil, socket, subprocess, sys, tempfile, threading, time

TCK = os.sysconf("SC_CLK_TCK")


def port():
    while True:
        t = socket.socket(); t.bind(("127.0.0.1", 0)); p = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind(("127.0.0.1", p)); return p
        except OSError:
            pass
        finally:
            u.close(); t.close()


def cpu(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TCK
    except (OSError, IndexError, ValueError):
        return None


def run(felix, bench, ops, side):
    tmp = tempfile.mkdtemp(prefix="cache-ab-")
    q = port()
    env = dict(os.environ, FELIX_OBJECT_STORE=f"file://{tmp}/objects")
    log = open(f"{tmp}/felix.log", "w")
    b = subprocess.Popen([felix, "--data-dir", f"{tmp}/data", "--quic-addr", f"127.0.0.1:{q}",
                          "--internal-addr", f"127.0.0.1:{port()}", "--admin-addr", f"127.0.0.1:{port()}",
                          "--kafka-addr", f"127.0.0.1:{port()}"], stdout=log, stderr=subprocess.STDOUT,
                         env=env, start_new_session=True)
    try:
        for _ in range(240):
            if "ready" in open(f"{tmp}/felix.log").read():
                break
            time.sleep(0.25)
        c = subprocess.Popen([bench, "cache", "--broker", f"127.0.0.1:{q}", "--keys", "10000",
                              "--clients", "16", "--ops", str(ops), "--durable"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        samples = []

        def sample():
            while c.poll() is None:
                samples.append((time.monotonic(), cpu(b.pid), cpu(c.pid)))
                time.sleep(0.01)
        th = threading.Thread(target=sample); th.start()
        out = c.communicate()[0].decode()
        end = time.monotonic()
        th.join()
    finally:
        b.terminate(); b.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    d = json.loads(out.strip().splitlines()[-1])
    samples = [s for s in samples if s[1] is not None and s[2] is not None]
    at = lambda t: min(samples, key=lambda s: abs(s[0] - t))
    g_end = end - 0.005
    g_start = g_end - d["get"]["seconds"]
    p_start = g_start - d["put"]["seconds"]

    def phase(t0, t1):
        a, z = at(t0), at(t1)
        return {"broker_us": round((z[1] - a[1]) / ops * 1e6, 1),
                "bench_us": round((z[2] - a[2]) / ops * 1e6, 1),
                "cores": round(((z[1] - a[1]) + (z[2] - a[2])) / max(z[0] - a[0], 1e-9), 2)}
    return {"side": side, "felix": felix, "put": round(d["put"]["ops_per_sec"]),
            "put_p50": d["put"]["latency_us"][0], "get": round(d["get"]["ops_per_sec"]),
            "get_p50": d["get"]["latency_us"][0], "put_cpu": phase(p_start, g_start),
            "get_cpu": phase(g_start, g_end), "load": open("/proc/loadavg").read().split()[0]}


if __name__ == "__main__":
    pairs, ops, fa, ba, fb, bb = sys.argv[1:7]
    for _ in range(int(pairs)):
        for side, f, b in (("a", fa, ba), ("b", fb, bb)):
            print(json.dumps(run(f, b, int(ops), side)), flush=True)
