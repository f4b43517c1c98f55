//! The cluster secret as a setting: a value that is read like any other but never shown.
//!
//! Decides how the secret given by `FELIX_CLUSTER_SECRET` (or the TOML key) appears
//! wherever the configuration is shown. The invariant: no rendering of a [`BrokerConfig`]
//! (`Debug`, `--check-config`'s TOML, an error about a setting) contains it — its `Debug`
//! is redacted, the field is never serialized, and its parser never fails (a parse error
//! would echo the value), so its length is checked in `validate.rs` instead.
//!
//! [`BrokerConfig`]: super::BrokerConfig

/// A secret setting's value.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct ClusterSecret(String);

impl ClusterSecret {
    /// The secret's bytes, surrounding whitespace removed.
    pub fn expose(&self) -> &[u8] {
        self.0.trim().as_bytes()
    }
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

/// The flag's and variable's parser: accepts any text (see the module docs).
pub(super) fn parse_secret(s: &str) -> Result<ClusterSecret, std::convert::Infallible> {
    Ok(ClusterSecret(s.to_owned()))
}
