"""The analytics examples of docs/analytics.md, run against the objects a real broker wrote
(gateway/tests/broker/analytics.rs). Prints one JSON object: what DuckDB, pyarrow and polars
each computed from one stream's objects, read by its path with Hive partitioning.

    python3 analytics.py OBJECTS_ROOT TENANT NAMESPACE STREAM SINCE_MS
"""

import json
import sys

root, tenant, namespace, stream, since_ms = sys.argv[1:6]
since_ms = int(since_ms)
path = f"{root}/tenant={tenant}/namespace={namespace}/stream={stream}"
out = {}

# DuckDB: a JSON field of the payload, per user, leaving out control records.
import duckdb

rows = duckdb.sql(f"""
    SELECT decode(payload)::JSON->>'user' AS user,
           count(*) AS records,
           sum((decode(payload)::JSON->>'amount')::BIGINT) AS amount
    FROM read_parquet('{path}/*/*.parquet', hive_partitioning = true)
    WHERE batch_attributes & 32 = 0
    GROUP BY user ORDER BY user
""").fetchall()
recent = duckdb.sql(f"""
    SELECT count(*) FROM read_parquet('{path}/*/*.parquet', hive_partitioning = true)
    WHERE timestamp >= epoch_ms({since_ms})
""").fetchall()[0][0]
out["duckdb"] = {"per_user": {u: [n, a] for u, n, a in rows}, "recent": recent}

# pyarrow: the stream as a dataset, filtered by time, shard from the directory names.
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

dataset = ds.dataset(path, format="parquet", partitioning="hive")
table = dataset.to_table(
    columns=["shard", "offset", "payload"],
    filter=pc.field("timestamp") >= pa.scalar(since_ms, type=pa.timestamp("ms", tz="UTC")),
)
out["pyarrow"] = {
    "recent": table.num_rows,
    "shards": sorted(set(table.column("shard").to_pylist())),
}

# polars: a lazy scan, the JSON field pulled out of the payload bytes.
import polars as pl

per_user = (
    pl.scan_parquet(f"{path}/**/*.parquet", hive_partitioning=True)
    .filter(pl.col("batch_attributes") & 32 == 0)
    .with_columns(pl.col("payload").cast(pl.String).str.json_path_match("$.user").alias("user"))
    .group_by("user")
    .agg(pl.len().alias("records"))
    .sort("user")
    .collect()
)
out["polars"] = {"per_user": dict(per_user.rows())}

print(json.dumps(out))
