//! felix-wire: the formats every part of Felix shares. No I/O happens here.
//!
//! Records travel and rest as Kafka RecordBatch v2 (magic 2), byte for byte: the batch a
//! producer sends is what the log stores and what a subscriber or a Kafka fetch receives.
//! The broker only stamps the base offset and the generation (Kafka's partition leader
//! epoch), neither of which is covered by the batch CRC, so stamping never re-encodes.
//!
//! * [`batch`] — the fixed 61-byte batch header: parsing, validation, CRC32C, stamping,
//!   writing a header ([`batch::seal_batch`]) and walking headers ([`HeaderIter`]).
//! * [`checked`] — [`CheckedBatch`], a batch whose CRC and structure were checked once.
//! * [`codec`] — the compression codecs of a batch's records ([`Compression`]).
//! * [`protocol`] — the QUIC client protocol: requests, responses, events, error codes and
//!   feature bits (documented in docs/protocol.md).
//! * [`frame`] — the protocol's frames: length, kind, header and body.
//! * [`binary`] — the compact binary headers of the cache's key operations.
//! * [`binary_groups`] — the compact binary headers of the groups' polls and answers.
//! * [`groups`] — the consumer-group requests and answers inside the protocol.
//! * [`moves`] — the cluster operations (brokers, drains, shard moves) inside the protocol.
//! * [`cache`] — the cache requests, answers and watch changes inside the protocol.
//! * [`murmur2`] — the key → shard hash (Kafka's default partitioner).
//! * [`record`] — the records inside a batch: encoding a batch from records
//!   ([`BatchBuilder`], [`RecordFields`] for one record) and decoding one back.
//! * [`transport`] — the QUIC transport bounds broker and client share (`MAX_UDP_PAYLOAD`).
//!
//! Every decoder returns a typed [`WireError`] for any input and never panics.

pub mod batch;
pub mod binary;
mod binary_codec;
pub mod binary_groups;
pub mod cache;
pub mod checked;
pub mod codec;
pub mod error;
pub mod frame;
pub mod groups;
pub mod moves;
pub mod murmur2;
pub mod oidc;
pub mod protocol;
pub mod record;
pub mod transport;
pub mod user_json;

pub use batch::{BATCH_HEADER_LEN, BatchHeader, BatchIter, HeaderIter};
pub use checked::CheckedBatch;
pub use codec::Compression;
pub use error::WireError;
pub use record::{BatchBuilder, DecodedBatch, Header, Record, RecordFields};
