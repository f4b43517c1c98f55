# Shared by the bench/*.sh scripts (sourced, never run): loopback ports, stopping what a
# script started when it exits, and the machine facts read around every run (CPU ticks of a
# process and of the whole machine, the load average). Defines functions and TCK only; it
# starts nothing and changes no setting of the script that sources it.
#
#   . bench/lib.sh        (from the repository root, where every script cds first)

# A loopback port free for both TCP and UDP (the broker's QUIC port is UDP). Other brokers
# may be running on this machine, so nothing uses fixed ports.
free_port() {
  python3 - <<'PY'
import socket
while True:
    t = socket.socket(); t.bind(("127.0.0.1", 0)); port = t.getsockname()[1]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        u.bind(("127.0.0.1", port)); print(port); break
    except OSError:
        pass
    finally:
        u.close(); t.close()
PY
}

# broker_ports: QUIC_PORT, ADMIN_PORT and INTERNAL_PORT for one broker, each a free port.
broker_ports() {
  QUIC_PORT=$(free_port)
  ADMIN_PORT=$(free_port)
  INTERNAL_PORT=$(free_port)
}

# on_exit FUNCTION: runs FUNCTION when the script exits, also on Ctrl-C or TERM (which
# would otherwise end bash without it, leaving servers running and temp dirs behind).
on_exit() {
  trap "$1" EXIT
  trap 'exit 130' INT TERM
}

# stop_pids PID...: SIGTERM to each process (empty arguments skipped), then waits for each
# of them that is a child of this shell.
stop_pids() {
  local pid
  for pid in "$@"; do
    [ -n "$pid" ] && { kill "$pid" 2>/dev/null || true; }
  done
  for pid in "$@"; do
    [ -n "$pid" ] && { wait "$pid" 2>/dev/null || true; }
  done
  return 0
}

# keep_partial_results: for a run that stops before it copied its lines ($OUT, collected in
# the temp dir) to $RESULTS.jsonl (COPIED=1), copies what it has so far there.
keep_partial_results() {
  if [ "${REPORT_ONLY:-0}" != 1 ] && [ "${COPIED:-0}" != 1 ] && [ -s "${OUT:-}" ]; then
    cp "$OUT" "$RESULTS.jsonl"
    echo "the run stopped early: its lines so far are in $RESULTS.jsonl" >&2
  fi
}

TCK=$(getconf CLK_TCK)
# user + system CPU ticks of a process (fields 14 and 15 of /proc/PID/stat); 0 if none.
cpu_ticks() { if [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ]; then sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; else echo 0; fi; }
# busy CPU ticks of the whole machine (all but idle and iowait), to see other work's share.
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
# secs AFTER BEFORE: the ticks between two readings, in seconds (two decimals).
secs() { awk -v a="$1" -v b="$2" -v t="$TCK" 'BEGIN { printf "%.2f", (a - b) / t }'; }
# The 1-, 5- and 15-minute load averages, comma-separated.
loadavg() { cut -d' ' -f1-3 /proc/loadavg | tr ' ' ,; }
# json JSON EXPR: a value of a JSON object, e.g. json "$LINE" '["records"]'.
json() { python3 -c "import json, sys; print(json.loads(sys.argv[1])$2)" "$1"; }
