//! Settings the delivery-semantics spec shows in its examples that this design has no use
//! for. A broker started with them must still start, so they are accepted from the TOML
//! file and the environment, take no part in the configuration, and are named once in the
//! log at start (docs/configuration.md says why each has no effect).
//!
//! Invariant: nothing here changes how the broker runs; a key is either listed here or
//! validated by [`crate::config`], never both.

use std::path::Path;

/// Each accepted key, its environment variable, and why it has no effect.
const INERT: &[(&str, &str, &str)] = &[
    (
        "subscriber_writer_lanes",
        "FELIX_SUBSCRIBER_WRITER_LANES",
        "each subscription writes its own QUIC stream from its own task; there are no shared writer lanes",
    ),
    (
        "subscriber_lane_shard",
        "FELIX_SUBSCRIBER_LANE_SHARD",
        "there are no writer lanes to assign subscriptions to",
    ),
    (
        "pub_workers_per_conn",
        "FELIX_PUB_WORKERS_PER_CONN",
        "every request is its own QUIC stream and task, so a connection's publishes already run in parallel",
    ),
];

/// Removes the inert keys from a TOML file's table, returning the ones it held.
pub fn strip(table: &mut toml::Table) -> Vec<&'static str> {
    INERT
        .iter()
        .filter(|(key, _, _)| table.remove(*key).is_some())
        .map(|(key, _, _)| *key)
        .collect()
}

/// Logs one note for each inert setting given in the file at `config_file` (if any) or in
/// the environment (`env` looks a variable up).
pub fn log_notes(config_file: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) {
    let in_file: Vec<&str> = config_file
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| text.parse::<toml::Table>().ok())
        .map(|mut table| strip(&mut table))
        .unwrap_or_default();
    for (key, var, why) in INERT {
        let source = if env(var).is_some_and(|v| !v.is_empty()) {
            *var
        } else if in_file.contains(key) {
            "the config file"
        } else {
            continue;
        };
        tracing::info!(
            setting = key,
            source,
            "setting {key} has no effect in this design and is ignored: {why}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_example_keys_are_taken_out_of_a_file_and_others_stay() {
        let mut table: toml::Table =
            "subscriber_writer_lanes = 4\nsubscriber_lane_shard = \"auto\"\npub_queue_depth = 8\n"
                .parse()
                .unwrap();
        assert_eq!(
            strip(&mut table),
            vec!["subscriber_writer_lanes", "subscriber_lane_shard"]
        );
        assert_eq!(table.len(), 1);
        assert!(table.contains_key("pub_queue_depth"));
    }
}
