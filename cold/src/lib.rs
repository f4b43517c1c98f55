//! felix-cold: the object-store tier of a shard.
//!
//! * [`store`] — the object store a broker tiers to (`file://`, `memory://`, `s3://`), with
//!   timeouts, retries and a concurrency limit on every call.
//! * [`segment`] — the Parquet object format: record batches in, Parquet out, and back.
//! * [`cache`] — footers and row groups of objects in a foyer memory + disk cache, with
//!   coalesced fetches and read-ahead; [`decode_pool`] the low-priority threads that decode
//!   what it fetches; [`read_ahead`] how far ahead it fetches and the memory that may take;
//!   `head` an object's first bytes fetched beside its footer; `ranged` parallel ranged GETs;
//!   [`malloc`] the allocator settings that keep decode buffers from going back to the
//!   kernel after every decode.
//! * [`uploader`] — moves a shard's committed history into objects recorded in the manifest.
//! * [`manifest`] — a shard's manifest: this broker's copy. What the tier asks of the
//!   control plane that keeps it is felix-model's [`ManifestKeeper`]; the keepers (the
//!   control plane's handle in a broker, `felix_meta::MemoryControlPlane` in tests) are
//!   felix-meta's, so this crate does not depend on the control plane.
//! * [`tiered`] — one read path over both tiers.
//!
//! The test doubles (a fault-injecting store, a SeaweedFS launcher) live in felix-testkit,
//! outside the broker binary.

pub mod cache;
pub mod decode_pool;
pub mod error;
mod head;
mod lru;
pub mod malloc;
pub mod manifest;
mod ranged;
pub mod read_ahead;
pub mod repair;
pub mod retention;
pub mod segment;
pub mod store;
pub mod tiered;
pub mod uploader;

pub use error::ColdError;
pub use felix_model::{ManifestKeeper, ManifestState, Recorded, SegmentEntry, ShardKey};
