//! felix-testkit: what Felix's tests use to put the broker in situations production cannot
//! be made to produce on demand. A dev-dependency only: nothing here is compiled into the
//! broker binary.
//!
//! * [`faults`] — [`faults::FaultyStore`], an object store that fails, hangs, slows down or
//!   loses answers when told to, and counts the calls that reach it.
//! * [`s3server`] — [`s3server::S3Server`], a real S3-compatible server (SeaweedFS's
//!   `weed mini`) started once per test process.

pub mod faults;
pub mod s3server;
