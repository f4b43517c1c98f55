//! felix-cold: the object-store tier of a shard.
//!
//! * [`store`] — the object store a broker tiers to (`file://`, `memory://`, `s3://`), with
//!   timeouts, retries and a concurrency limit on every call; [`faults`] wraps a store to
//!   inject the failures a real server cannot be made to produce.
//! * [`segment`] — the Parquet object format: record batches in, Parquet out, and back.
