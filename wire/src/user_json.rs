//! Stream settings as a person (or a script) reads and writes them in JSON.
//!
//! The protocol carries "no hot-retention limit" as `u64::MAX` (see
//! [`crate::protocol::StreamConfig`]). Printed as 18446744073709551615 that number is rounded
//! by JavaScript and jq (doubles hold 53 bits), so a script reading it back sees a limit
//! that was never set. Every user-facing JSON (felixctl's stream output, the admin HTTP
//! API) goes through this mapping instead: `null` means "no limit" there, both ways. The
//! wire format between brokers and clients is untouched.

use serde_json::Value;

/// The wire's "no limit" for the `hot_retention_*` settings.
pub const NO_LIMIT: u64 = u64::MAX;

/// The settings whose "no limit" is [`NO_LIMIT`] on the wire and `null` for a user.
pub const UNLIMITED_AS_NULL: [&str; 2] = ["hot_retention_ms", "hot_retention_bytes"];

/// A stream settings object (a `StreamConfig` as JSON), "no limit" shown as `null`.
pub fn config_for_user(config: &mut Value) {
    let Some(obj) = config.as_object_mut() else {
        return;
    };
    for key in UNLIMITED_AS_NULL {
        if let Some(v) = obj.get_mut(key)
            && v.as_u64() == Some(NO_LIMIT)
        {
            *v = Value::Null;
        }
    }
}

/// A stream description (a `StreamInfo` as JSON, or an array of them), its settings
/// mapped by [`config_for_user`].
pub fn stream_for_user(info: &mut Value) {
    match info {
        Value::Array(items) => items.iter_mut().for_each(stream_for_user),
        Value::Object(obj) => {
            if let Some(config) = obj.get_mut("config") {
                config_for_user(config);
            }
        }
        _ => {}
    }
}

/// A settings object a user wrote, made wire-ready: an explicit `null` for a
/// `hot_retention_*` setting asks for no limit. An absent key stays absent (unchanged on
/// alter, the broker's default on create), so only a written `null` becomes [`NO_LIMIT`].
pub fn config_from_user(config: &mut Value) {
    let Some(obj) = config.as_object_mut() else {
        return;
    };
    for key in UNLIMITED_AS_NULL {
        if let Some(v) = obj.get_mut(key)
            && v.is_null()
        {
            *v = Value::from(NO_LIMIT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::StreamConfig;

    #[test]
    fn no_limit_round_trips_through_null() {
        let wire = StreamConfig {
            hot_retention_ms: Some(NO_LIMIT),
            hot_retention_bytes: Some(1024),
            ..Default::default()
        };
        let mut json = serde_json::to_value(&wire).unwrap();
        config_for_user(&mut json);
        assert_eq!(json["hot_retention_ms"], Value::Null);
        assert_eq!(json["hot_retention_bytes"], 1024);
        config_from_user(&mut json);
        let back: StreamConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, wire);
    }

    #[test]
    fn an_absent_setting_stays_absent() {
        let mut json = serde_json::json!({"shards": 2});
        config_from_user(&mut json);
        let config: StreamConfig = serde_json::from_value(json).unwrap();
        assert_eq!(config.hot_retention_ms, None);
        assert_eq!(config.shards, Some(2));
    }
}
