//! How the control plane names things: tenants, namespaces, streams and their shards.
//!
//! Decides which names are valid and how a stream and a shard are keyed in the state. The
//! invariant: a name is 1 to [`MAX_NAME_LEN`] characters of `[A-Za-z0-9._-]` and never `.`
//! or `..`, so every name is safe as a path segment and an object key prefix, and the key of
//! a stream (`tenant/namespace/stream`) cannot be mistaken for another's.

use super::errors::CommandError;

/// Longest tenant, namespace or stream name.
pub const MAX_NAME_LEN: usize = 128;
pub(super) fn check_name(kind: &str, name: &str) -> Result<(), CommandError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(CommandError::Invalid(format!(
            "{kind} name {name:?} must be 1-{MAX_NAME_LEN} characters of [A-Za-z0-9._-]"
        )))
    }
}

/// The key of a stream in [`MetaState::streams`](super::MetaState::streams).
pub fn stream_key(tenant: &str, namespace: &str, name: &str) -> String {
    format!("{tenant}/{namespace}/{name}")
}
/// Identifies one shard of a stream (in felix-model, which the object tier shares).
pub use felix_model::ShardKey;
