//! felix-cold: the object-store tier of a shard.
//!
//! Not built yet. This crate will hold the Parquet segment codec, the uploader that moves
//! sealed segments from `felix-hot` to S3-compatible storage, the tiered reader that serves
//! replay across both tiers through a foyer cache, and total retention. See
//! `docs/architecture.md` for the plan and the issue that builds it.
