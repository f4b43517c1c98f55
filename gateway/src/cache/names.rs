//! How a cache is named in the control plane: the stream that holds cache `name` is
//! `__cache.<name>`, a name no user stream may take.
//!
//! The invariant: a stream name is a cache's exactly when it starts with
//! [`CACHE_STREAM_PREFIX`], so listings, Kafka metadata and permission checks can tell the
//! two apart from the name alone.

/// The prefix of the stream that holds a cache: a user cannot create a stream so named.
pub const CACHE_STREAM_PREFIX: &str = "__cache.";

/// The stream that holds cache `name`.
pub fn backing_stream(name: &str) -> String {
    format!("{CACHE_STREAM_PREFIX}{name}")
}

/// Whether a stream name is a cache's.
pub fn is_cache_stream(name: &str) -> bool {
    name.starts_with(CACHE_STREAM_PREFIX)
}

/// The cache a stream holds, if it is a cache's.
pub fn cache_of_stream(name: &str) -> Option<&str> {
    name.strip_prefix(CACHE_STREAM_PREFIX)
}
