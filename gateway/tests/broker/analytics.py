"""The analytics examples of docs/analytics.md, run as the page prints them against the
objects a real broker wrote (gateway/tests/broker/analytics.rs). The code blocks are read
from the page itself, so an example that stops working fails the test instead of rotting:
the ```sql blocks run in DuckDB with $ROOT set, the ```python blocks run with `root` set.
Prints one JSON object: what DuckDB, pyarrow and polars each computed.

    python3 analytics.py OBJECTS_ROOT TENANT NAMESPACE STREAM SINCE_MS
"""

import json
import pathlib
import re
import sys

root, tenant, namespace, stream, since_ms = sys.argv[1:6]
page = pathlib.Path(__file__).resolve().parents[3] / "docs" / "analytics.md"
text = page.read_text()
# The page's examples name this stream and this time; the test publishes to match.
for needed in (f"tenant={tenant}/namespace={namespace}/stream={stream}", since_ms):
    if needed not in text:
        sys.exit(f"docs/analytics.md no longer mentions {needed}: update analytics.rs with it")


def blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


sql = blocks("sql")
python = blocks("python")
if len(sql) != 2 or len(python) != 2:
    sys.exit(f"expected 2 sql and 2 python examples in docs/analytics.md, found {len(sql)} and {len(python)}")
out = {}

# DuckDB: a JSON field of the payload per user; records since a time.
import duckdb

per_user_sql, recent_sql = (q.replace("$ROOT", root) for q in sql)
rows = duckdb.sql(per_user_sql).fetchall()
recent = duckdb.sql(recent_sql).fetchall()[0][0]
out["duckdb"] = {"per_user": {u: [n, a] for u, n, a in rows}, "recent": recent}

# pyarrow: the stream as a dataset filtered by time (`recent`, a table).
scope = {"root": root}
exec(python[0], scope)
table = scope["recent"]
out["pyarrow"] = {
    "recent": table.num_rows,
    "shards": sorted(set(table.column("shard").to_pylist())),
}

# polars: the JSON field pulled out of the payload bytes (`per_user`, a data frame).
scope = {"root": root}
exec(python[1], scope)
out["polars"] = {"per_user": dict(scope["per_user"].rows())}

print(json.dumps(out))
