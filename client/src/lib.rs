//! felix-client: the Rust client and the `felixctl` command-line tool.
//!
//! Not built yet: it arrives with the broker node. See `docs/architecture.md`.
