//! felix-wire's behaviour, proven: one test binary, one module per concern.
//!
//! * `roundtrip` — every codec round-trips arbitrary records and header fields; stamping
//!   keeps the CRC valid.
//! * `robustness` — decoders return typed errors, never panic, on arbitrary and mutated
//!   bytes; CRC catches any flipped byte; decompression bombs stop at the limit; `BatchIter`
//!   over concatenated and torn buffers.
//! * `kafka_vectors` — golden batches written by kafka-python (tests/fixtures), and the
//!   batches Felix writes for kafka-python to read back.
//! * `writers` — the header and record writers, the header-only walk and the checked batch
//!   agree with the validating decoder.

#[path = "wire/common.rs"]
mod common;
#[path = "wire/kafka_vectors.rs"]
mod kafka_vectors;
#[path = "wire/robustness.rs"]
mod robustness;
#[path = "wire/roundtrip.rs"]
mod roundtrip;
#[path = "wire/writers.rs"]
mod writers;
