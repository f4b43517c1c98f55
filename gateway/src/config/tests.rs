use std::collections::HashMap;
use std::time::Duration;

use clap::Parser;
use felix_hot::FsyncPolicy;

use super::*;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn flags(list: &[&str]) -> Args {
    let argv = std::iter::once("felix").chain(list.iter().copied());
    Cli::try_parse_from(argv).expect("valid flags").args
}

fn env(vars: &[(&str, &str)]) -> HashMap<String, String> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load(args: &Args, vars: &HashMap<String, String>) -> Result<BrokerConfig, ConfigError> {
    BrokerConfig::from_sources(args, &|k| vars.get(k).cloned())
}

fn load_ok(args: &Args, vars: &HashMap<String, String>) -> BrokerConfig {
    load(args, vars).unwrap_or_else(|e| panic!("config refused: {e}"))
}

/// A cluster secret of the shortest length accepted.
const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn refused(args: &Args, vars: &HashMap<String, String>) -> String {
    match load(args, vars) {
        Ok(c) => panic!("config accepted: {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn write_file(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let path = dir.path().join("felix.toml");
    std::fs::write(&path, text).expect("write the config file");
    path
}

fn with_file(path: &Path, more: &[&str]) -> Args {
    let mut list = vec!["--config", path.to_str().expect("utf-8 temp path")];
    list.extend_from_slice(more);
    flags(&list)
}

#[test]
fn no_sources_give_the_embedded_defaults() {
    let c = load_ok(&Args::default(), &HashMap::new());
    assert_eq!(c, BrokerConfig::default());
    assert_eq!(c.node_id, 1);
    assert!(c.cluster.is_empty());
    assert_eq!(c.data_dir, PathBuf::from("./felix-data"));
    assert_eq!(c.quic_addr.to_string(), "127.0.0.1:5000");
    assert_eq!(c.admin_addr.to_string(), "127.0.0.1:8080");
    assert_eq!(c.internal_addr.to_string(), "127.0.0.1:5100");
    assert!(c.object_store.starts_with("file:///"), "{}", c.object_store);
    assert!(
        c.object_store.ends_with("felix-data/objects"),
        "{}",
        c.object_store
    );
    assert_eq!(c.fsync_policy(), FsyncPolicy::default());
    assert!(c.ack_on_commit);
    assert_eq!(c.subscriber_queue_capacity, 512);
    assert_eq!(c.subscriber_queue_max_bytes, 128 << 20);
    assert_eq!(c.subscriber_egress_max_bytes, 256 << 20);
    assert_eq!(c.pub_queue_depth, 512);
    assert_eq!(c.publish_queue_wait_timeout_ms, 2000);
    assert_eq!(c.max_frame_bytes, 16 << 20);
    assert_eq!(c.max_batch_bytes, 8 << 20);
    assert_eq!(c.quic_idle_timeout_ms, 6000);
    assert_eq!(c.meta_snapshot_logs, 5000);
    assert_eq!(c.segment_bytes, 256 << 20);
    assert_eq!(c.segment_ms, 3_600_000);
}

#[test]
fn file_beats_defaults_env_beats_file_and_flags_beat_env() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write_file(
        &dir,
        r#"
        pub_queue_depth = 10
        subscriber_queue_capacity = 20
        max_batch_bytes = 1000
        quic_addr = "127.0.0.1:6000"
        "#,
    );
    let vars = env(&[
        ("FELIX_SUBSCRIBER_QUEUE_CAPACITY", "30"),
        ("FELIX_MAX_BATCH_BYTES", "2000"),
    ]);
    let c = load_ok(&with_file(&path, &["--max-batch-bytes", "3000"]), &vars);
    assert_eq!(c.pub_queue_depth, 10, "file over default");
    assert_eq!(c.subscriber_queue_capacity, 30, "env over file");
    assert_eq!(c.max_batch_bytes, 3000, "flag over env");
    assert_eq!(c.quic_addr.to_string(), "127.0.0.1:6000");
    assert_eq!(
        c.segment_ms, 3_600_000,
        "untouched setting keeps its default"
    );
}

#[test]
fn config_file_can_be_named_by_felix_config() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write_file(&dir, "node_id = 7\n");
    let vars = env(&[(CONFIG_ENV, path.to_str().expect("utf-8"))]);
    assert_eq!(load_ok(&Args::default(), &vars).node_id, 7);
}

#[test]
fn every_documented_env_var_is_read() {
    let vars = env(&[
        ("FELIX_NODE_ID", "2"),
        ("FELIX_CLUSTER", "1=127.0.0.1:7101,2=127.0.0.1:7102"),
        ("FELIX_DATA_DIR", "/tmp/felix-env"),
        ("FELIX_QUIC_ADDR", "0.0.0.0:5001"),
        ("FELIX_ADMIN_ADDR", "0.0.0.0:8081"),
        ("FELIX_OBJECT_STORE", "s3://bucket/prefix"),
        ("FELIX_TLS_CERT", "/etc/felix/cert.pem"),
        ("FELIX_TLS_KEY", "/etc/felix/key.pem"),
        ("FELIX_DURABLE_FSYNC_MODE", "on_commit"),
        ("FELIX_ACK_ON_COMMIT", "0"),
        ("FELIX_SUBSCRIBER_QUEUE_CAPACITY", "11"),
        ("FELIX_SUBSCRIBER_QUEUE_MAX_BYTES", "12"),
        ("FELIX_SUBSCRIBER_EGRESS_MAX_BYTES", "13"),
        ("FELIX_PUB_QUEUE_DEPTH", "14"),
        ("FELIX_PUBLISH_QUEUE_WAIT_TIMEOUT_MS", "15"),
        ("FELIX_MAX_FRAME_BYTES", "1600"),
        ("FELIX_MAX_BATCH_BYTES", "17"),
        ("FELIX_QUIC_IDLE_TIMEOUT_MS", "18"),
        ("FELIX_META_SNAPSHOT_LOGS", "19"),
        ("FELIX_SEGMENT_BYTES", "20"),
        ("FELIX_SEGMENT_MS", "21"),
        ("FELIX_CLUSTER_SECRET_FILE", "/etc/felix/cluster.secret"),
        (
            "FELIX_CLUSTER_SECRET_PREVIOUS_FILE",
            "/etc/felix/cluster.secret.old",
        ),
    ]);
    let c = load_ok(&Args::default(), &vars);
    assert_eq!(
        c.cluster_secret_file,
        Some(PathBuf::from("/etc/felix/cluster.secret"))
    );
    assert_eq!(
        c.cluster_secret_previous_file,
        Some(PathBuf::from("/etc/felix/cluster.secret.old"))
    );
    assert_eq!(c.node_id, 2);
    assert_eq!(c.cluster.len(), 2);
    assert_eq!(c.internal_addr.to_string(), "127.0.0.1:7102");
    assert_eq!(c.data_dir, PathBuf::from("/tmp/felix-env"));
    assert_eq!(c.quic_addr.to_string(), "0.0.0.0:5001");
    assert_eq!(c.admin_addr.to_string(), "0.0.0.0:8081");
    assert_eq!(c.object_store, "s3://bucket/prefix");
    assert_eq!(c.tls_cert, Some(PathBuf::from("/etc/felix/cert.pem")));
    assert_eq!(c.tls_key, Some(PathBuf::from("/etc/felix/key.pem")));
    assert_eq!(c.fsync_policy(), FsyncPolicy::OnCommit);
    assert!(!c.ack_on_commit);
    let numbers = [
        c.subscriber_queue_capacity as u64,
        c.subscriber_queue_max_bytes as u64,
        c.subscriber_egress_max_bytes as u64,
        c.pub_queue_depth as u64,
        c.publish_queue_wait_timeout_ms,
        c.max_frame_bytes as u64,
        c.max_batch_bytes as u64,
        c.quic_idle_timeout_ms,
        c.meta_snapshot_logs,
        c.segment_bytes,
        c.segment_ms,
    ];
    assert_eq!(numbers, [11, 12, 13, 14, 15, 1600, 17, 18, 19, 20, 21]);
    let internal = env(&[("FELIX_INTERNAL_ADDR", "0.0.0.0:5200")]);
    assert_eq!(
        load_ok(&Args::default(), &internal)
            .internal_addr
            .to_string(),
        "0.0.0.0:5200"
    );
}

#[test]
fn every_flag_is_kebab_case_of_its_key() {
    let c = load_ok(
        &flags(&[
            "--node-id=3",
            "--cluster=1=10.0.0.1:7101,3=127.0.0.1:7103",
            "--data-dir=/tmp/felix-flags",
            "--quic-addr=127.0.0.1:1",
            "--admin-addr=127.0.0.1:2",
            "--internal-addr=127.0.0.1:3",
            "--object-store=file:///tmp/objects",
            "--tls-cert=c.pem",
            "--tls-key=k.pem",
            "--fsync=periodic:100",
            "--ack-on-commit=false",
            "--subscriber-queue-capacity=1",
            "--subscriber-queue-max-bytes=2",
            "--subscriber-egress-max-bytes=3",
            "--pub-queue-depth=4",
            "--publish-queue-wait-timeout-ms=0",
            "--max-frame-bytes=6",
            "--max-batch-bytes=6",
            "--quic-idle-timeout-ms=7",
            "--meta-snapshot-logs=8",
            "--segment-bytes=9",
            "--segment-ms=10",
        ]),
        &HashMap::new(),
    );
    assert_eq!(c.node_id, 3);
    assert_eq!(c.internal_addr.to_string(), "127.0.0.1:3");
    assert_eq!(
        c.fsync_policy(),
        FsyncPolicy::Periodic {
            interval: Duration::from_millis(100)
        }
    );
    assert!(!c.ack_on_commit);
    assert_eq!(c.publish_queue_wait_timeout_ms, 0);
    assert_eq!(c.segment_ms, 10);
}

#[test]
fn ack_on_commit_accepts_0_1_true_false() {
    for (value, expected) in [("0", false), ("1", true), ("false", false), ("TRUE", true)] {
        let c = load_ok(&Args::default(), &env(&[("FELIX_ACK_ON_COMMIT", value)]));
        assert_eq!(c.ack_on_commit, expected, "FELIX_ACK_ON_COMMIT={value}");
    }
    let bare = flags(&["--ack-on-commit"]);
    let vars = env(&[("FELIX_ACK_ON_COMMIT", "0")]);
    assert!(
        load_ok(&bare, &vars).ack_on_commit,
        "a bare flag means true"
    );
    let msg = refused(&Args::default(), &env(&[("FELIX_ACK_ON_COMMIT", "maybe")]));
    assert!(msg.contains("FELIX_ACK_ON_COMMIT"), "{msg}");
}

#[test]
fn an_empty_env_var_counts_as_unset() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write_file(&dir, "pub_queue_depth = 9\n");
    let vars = env(&[("FELIX_PUB_QUEUE_DEPTH", ""), ("FELIX_CLUSTER", " ")]);
    assert_eq!(load_ok(&with_file(&path, &[]), &vars).pub_queue_depth, 9);
}

#[test]
fn cluster_is_a_table_or_a_string_in_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let table = write_file(
        &dir,
        "node_id = 2\n[cluster]\n1 = \"127.0.0.1:7101\"\n2 = \"127.0.0.1:7102\"\n",
    );
    let a = load_ok(&with_file(&table, &[]), &HashMap::new());
    let string = write_file(
        &dir,
        "node_id = 2\ncluster = \"1=127.0.0.1:7101, 2=127.0.0.1:7102\"\n",
    );
    let b = load_ok(&with_file(&string, &[]), &HashMap::new());
    assert_eq!(a, b);
    assert_eq!(
        a.cluster.get(&1).map(String::as_str),
        Some("127.0.0.1:7101")
    );
    assert_eq!(a.internal_addr.to_string(), "127.0.0.1:7102");
}

#[test]
fn internal_addr_follows_this_nodes_cluster_entry_unless_set() {
    let cluster = "--cluster=1=127.0.0.1:7101,2=127.0.0.1:7102";
    let c = load_ok(&flags(&["--node-id=1", cluster]), &HashMap::new());
    assert_eq!(c.internal_addr.to_string(), "127.0.0.1:7101");
    // Off loopback, auth is on, and a cluster that authenticates needs a secret.
    let secret = env(&[("FELIX_CLUSTER_SECRET", SECRET)]);
    let c = load_ok(
        &flags(&["--node-id=1", cluster, "--internal-addr=0.0.0.0:7101"]),
        &secret,
    );
    assert_eq!(c.internal_addr.to_string(), "0.0.0.0:7101");
    assert_eq!(
        c.cluster.get(&1).map(String::as_str),
        Some("127.0.0.1:7101")
    );
    let hostname = flags(&["--cluster=1=meta-1.internal:7101"]);
    let msg = refused(&hostname, &HashMap::new());
    assert!(msg.contains("internal_addr"), "{msg}");
    let mut with_listen = hostname.clone();
    with_listen.internal_addr = Some("0.0.0.0:7101".parse().expect("addr"));
    load_ok(&with_listen, &HashMap::new());
}

#[test]
fn object_store_defaults_under_the_effective_data_dir() {
    let c = load_ok(&flags(&["--data-dir=/srv/felix"]), &HashMap::new());
    assert_eq!(c.object_store, "file:///srv/felix/objects");
    let c = load_ok(
        &flags(&["--data-dir=/srv/felix", "--object-store=s3://bucket/p"]),
        &HashMap::new(),
    );
    assert_eq!(c.object_store, "s3://bucket/p");
}

#[test]
fn an_unknown_file_key_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write_file(&dir, "pub_queue_depht = 10\n");
    let msg = refused(&with_file(&path, &[]), &HashMap::new());
    assert!(msg.contains("pub_queue_depht"), "{msg}");
    assert!(msg.contains("felix.toml"), "{msg}");
    let path = write_file(&dir, "config = \"other.toml\"\n");
    refused(&with_file(&path, &[]), &HashMap::new());
}

#[test]
fn a_missing_config_file_is_refused() {
    let msg = refused(
        &flags(&["--config=/nonexistent/felix.toml"]),
        &HashMap::new(),
    );
    assert!(msg.contains("/nonexistent/felix.toml"), "{msg}");
}

#[test]
fn a_bad_address_is_refused_from_every_source() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write_file(&dir, "admin_addr = \"localhost\"\n");
    let msg = refused(&with_file(&path, &[]), &HashMap::new());
    assert!(msg.contains("admin_addr"), "{msg}");
    let msg = refused(&Args::default(), &env(&[("FELIX_QUIC_ADDR", "nowhere:x")]));
    assert!(msg.contains("FELIX_QUIC_ADDR"), "{msg}");
    assert!(Cli::try_parse_from(["felix", "--quic-addr", "5000"]).is_err());
    assert!(Cli::try_parse_from(["felix", "--cluster=1=127.0.0.1"]).is_err());
    let msg = refused(&Args::default(), &env(&[("FELIX_CLUSTER", "1=127.0.0.1")]));
    assert!(
        msg.contains("FELIX_CLUSTER") && msg.contains("HOST:PORT"),
        "{msg}"
    );
    let msg = refused(&flags(&["--admin-addr=127.0.0.1:5100"]), &HashMap::new());
    assert!(msg.contains("internal_addr"), "{msg}");
}

#[test]
fn a_bad_fsync_mode_is_refused() {
    for mode in ["always", "periodic:0", "periodic:x"] {
        let msg = refused(&flags(&["--fsync", mode]), &HashMap::new());
        assert!(msg.contains("fsync"), "{msg}");
    }
    let msg = refused(
        &Args::default(),
        &env(&[("FELIX_DURABLE_FSYNC_MODE", "never")]),
    );
    assert!(msg.contains("FELIX_DURABLE_FSYNC_MODE"), "{msg}");
}

#[test]
fn a_bad_publish_quota_is_refused_naming_its_variable() {
    for (var, value) in [
        ("FELIX_TENANT_PUBLISH_BYTES_PER_SEC", "fast"),
        ("FELIX_TENANT_PUBLISH_MSGS_PER_SEC", "0"),
        ("FELIX_TENANT_PUBLISH_QUOTAS", "acme=100"),
    ] {
        let msg = refused(&Args::default(), &env(&[(var, value)]));
        assert!(msg.contains(var), "{msg}");
    }
    let ok = load_ok(
        &Args::default(),
        &env(&[
            ("FELIX_TENANT_PUBLISH_BYTES_PER_SEC", "1MiB/s"),
            ("FELIX_TENANT_PUBLISH_QUOTAS", "acme=5000msg/s"),
        ]),
    );
    let limits = ok.quota_limits().expect("parsed");
    assert_eq!(limits.of("acme").bytes, Some(1 << 20));
    assert_eq!(limits.of("acme").records, Some(5000));
}

#[test]
fn a_certificate_needs_its_key() {
    let msg = refused(&flags(&["--tls-cert=c.pem"]), &HashMap::new());
    assert!(msg.contains("tls_key"), "{msg}");
    let msg = refused(&flags(&["--tls-key=k.pem"]), &HashMap::new());
    assert!(msg.contains("tls_cert"), "{msg}");
}

#[test]
fn a_kafka_certificate_needs_its_key_and_both_come_from_the_environment() {
    let msg = refused(&flags(&["--kafka-tls-cert=c.pem"]), &HashMap::new());
    assert!(msg.contains("kafka_tls_key"), "{msg}");
    let msg = refused(&Args::default(), &env(&[("FELIX_KAFKA_TLS_KEY", "k.pem")]));
    assert!(msg.contains("kafka_tls_cert"), "{msg}");
    let c = load(
        &Args::default(),
        &env(&[
            ("FELIX_KAFKA_TLS_CERT", "/etc/felix/kafka.pem"),
            ("FELIX_KAFKA_TLS_KEY", "/etc/felix/kafka.key"),
        ]),
    )
    .expect("both given");
    assert_eq!(
        c.kafka_tls_cert,
        Some(PathBuf::from("/etc/felix/kafka.pem"))
    );
    assert_eq!(c.kafka_tls_key, Some(PathBuf::from("/etc/felix/kafka.key")));
    assert_eq!(
        c.tls_cert, None,
        "the QUIC certificate is a separate setting"
    );
}

#[test]
fn a_cluster_must_contain_this_node() {
    let msg = refused(
        &flags(&["--node-id=4", "--cluster=1=127.0.0.1:1,2=127.0.0.1:2"]),
        &HashMap::new(),
    );
    assert!(msg.contains("node's id 4"), "{msg}");
    assert!(Cli::try_parse_from(["felix", "--cluster=1=a:1,1=b:2"]).is_err());
}

#[test]
fn zero_capacities_are_refused() {
    for key in [
        "subscriber_queue_capacity",
        "subscriber_queue_max_bytes",
        "subscriber_egress_max_bytes",
        "pub_queue_depth",
        "max_frame_bytes",
        "max_batch_bytes",
        "quic_idle_timeout_ms",
        "meta_snapshot_logs",
        "segment_bytes",
        "segment_ms",
    ] {
        let flag = format!("--{}=0", key.replace('_', "-"));
        let msg = refused(&flags(&[&flag]), &HashMap::new());
        assert!(msg.starts_with(key), "{msg}");
        assert!(msg.contains("at least 1"), "{msg}");
    }
}

#[test]
fn a_batch_must_fit_in_a_frame() {
    let msg = refused(
        &flags(&["--max-frame-bytes=1000", "--max-batch-bytes=1001"]),
        &HashMap::new(),
    );
    assert!(msg.contains("max_batch_bytes"), "{msg}");
}

#[test]
fn the_printed_config_loads_back_unchanged() {
    let c = load_ok(
        &flags(&[
            "--node-id=2",
            "--cluster=1=127.0.0.1:7101,2=127.0.0.1:7102,10=127.0.0.1:7110",
            "--tls-cert=c.pem",
            "--tls-key=k.pem",
            "--fsync=on_commit",
        ]),
        &HashMap::new(),
    );
    let text = c.to_toml();
    assert!(text.contains("node_id = 2"), "{text}");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write_file(&dir, &text);
    assert_eq!(load_ok(&with_file(&path, &[]), &HashMap::new()), c);
    let back: BrokerConfig = toml::from_str(&text).expect("parses as a BrokerConfig");
    assert_eq!(back, c);
    let defaults = BrokerConfig::default().to_toml();
    assert!(!defaults.contains("tls_cert"), "{defaults}");
    let path = write_file(&dir, &defaults);
    assert_eq!(
        load_ok(&with_file(&path, &[]), &HashMap::new()),
        BrokerConfig::default()
    );
}

#[test]
fn kafka_settings_default_and_come_from_every_source() {
    let c = load_ok(&Args::default(), &HashMap::new());
    assert_eq!(c.kafka_addr.to_string(), "127.0.0.1:9092");
    assert_eq!(c.kafka_default_partitions, 1);
    assert!(c.kafka_auto_create_topics);
    let vars = env(&[
        ("FELIX_KAFKA_ADDR", "127.0.0.1:19092"),
        ("FELIX_KAFKA_DEFAULT_PARTITIONS", "3"),
        ("FELIX_KAFKA_AUTO_CREATE_TOPICS", "0"),
    ]);
    let c = load_ok(&Args::default(), &vars);
    assert_eq!(c.kafka_addr.to_string(), "127.0.0.1:19092");
    assert_eq!(c.kafka_default_partitions, 3);
    assert!(!c.kafka_auto_create_topics);
    let c = load_ok(
        &flags(&[
            "--kafka-addr=127.0.0.1:29092",
            "--kafka-default-partitions=4",
            "--kafka-auto-create-topics",
        ]),
        &vars,
    );
    assert_eq!(c.kafka_addr.to_string(), "127.0.0.1:29092");
    assert_eq!(c.kafka_default_partitions, 4);
    assert!(c.kafka_auto_create_topics);
    let msg = refused(&flags(&["--kafka-default-partitions=0"]), &HashMap::new());
    assert!(msg.starts_with("kafka_default_partitions"), "{msg}");
    let msg = refused(&flags(&["--kafka-addr=127.0.0.1:8080"]), &HashMap::new());
    assert!(msg.contains("kafka_addr"), "{msg}");
}

/// The settings table of docs/configuration.md as the declarations give it: key, flag,
/// variable, then the description, whose last paragraph (`Default: …`) is the default.
fn declared_settings_table() -> Vec<String> {
    let command = <Args as clap::Args>::augment_args(clap::Command::new("felix"));
    let mut rows = vec![
        "| TOML key | flag | environment variable | default | meaning |".to_owned(),
        "|---|---|---|---|---|".to_owned(),
    ];
    for arg in command
        .get_arguments()
        .filter(|arg| arg.get_id() != "config")
    {
        let key = arg.get_id().as_str();
        let doc = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| h.to_string());
        let mut paragraphs: Vec<String> = doc
            .unwrap_or_default()
            .split("\n\n")
            .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        let default = paragraphs
            .pop()
            .and_then(|p| p.strip_prefix("Default: ").map(str::to_owned))
            .unwrap_or_else(|| panic!("{key}'s description does not end with `Default: …`"));
        let env = arg.get_env().expect("every setting has a variable");
        rows.push(format!(
            "| `{key}` | `--{}` | `{}` | {default} | {} |",
            arg.get_long().expect("every setting has a flag"),
            env.to_string_lossy(),
            paragraphs.join(" ")
        ));
    }
    rows
}

#[test]
fn the_docs_list_every_setting_as_declared_and_no_other() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let docs = std::fs::read_to_string(&path).expect("read docs/configuration.md");
    let expected = declared_settings_table();
    let documented: Vec<&str> = docs
        .lines()
        .skip_while(|line| *line != expected[0])
        .take_while(|line| line.starts_with('|'))
        .collect();
    let key = |row: &str| row.split('`').nth(1).map(str::to_owned);
    let declared_keys: Vec<_> = expected.iter().skip(2).filter_map(|r| key(r)).collect();
    let documented_keys: Vec<_> = documented.iter().skip(2).filter_map(|r| key(r)).collect();
    let missing: Vec<_> = declared_keys
        .iter()
        .filter(|k| !documented_keys.contains(k))
        .collect();
    let unknown: Vec<_> = documented_keys
        .iter()
        .filter(|k| !declared_keys.contains(k))
        .collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/configuration.md misses {missing:?} and lists unknown settings {unknown:?}"
    );
    assert!(
        documented == expected,
        "docs/configuration.md's settings table differs from gateway/src/config/settings.rs; \
         from the declarations it reads:\n\n{}\n",
        expected.join("\n")
    );
}

#[test]
fn each_documented_default_is_the_declared_one() {
    let defaults: toml::Table = toml::from_str(&BrokerConfig::default().to_toml()).expect("toml");
    let mut compared = 0;
    for row in declared_settings_table().iter().skip(2) {
        let cells: Vec<&str> = row.split(" | ").collect();
        let key = cells[0].trim_start_matches("| ").trim_matches('`');
        let Some(documented) = cells[3].strip_prefix('`').and_then(|d| d.split('`').next()) else {
            continue;
        };
        let Some(value) = defaults.get(key).filter(|_| !documented.contains('<')) else {
            continue;
        };
        let value = match value {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        assert_eq!(documented, value, "{key}'s documented default");
        compared += 1;
    }
    assert!(compared >= 35, "only {compared} defaults compared");
}

#[test]
fn the_command_line_leaves_the_environment_to_its_own_layer() {
    let command = without_env(<Args as clap::Args>::augment_args(clap::Command::new(
        "felix",
    )));
    assert!(command.get_arguments().all(|arg| arg.get_env().is_none()));
    let help = command.clone().render_long_help().to_string();
    assert!(help.contains("[env: FELIX_NODE_ID]"), "{help}");
    assert!(help.contains("[env: FELIX_DURABLE_FSYNC_MODE]"), "{help}");
    let short = command.clone().render_help().to_string();
    assert!(short.contains("[env: FELIX_CONFIG]"), "{short}");
}

#[test]
fn auth_is_off_on_loopback_on_elsewhere_and_never_silently_off_on_a_network() {
    let none = HashMap::new();
    assert!(!load_ok(&flags(&[]), &none).auth, "the embedded defaults");
    let open = load_ok(&flags(&["--quic-addr=0.0.0.0:5000"]), &none);
    assert!(open.auth, "a listener off loopback turns auth on");
    let msg = refused(&flags(&["--kafka-addr=0.0.0.0:9092", "--auth=off"]), &none);
    assert!(
        msg.starts_with("auth") && msg.contains("0.0.0.0:9092"),
        "{msg}"
    );
    let c = load_ok(
        &flags(&[
            "--admin-addr=0.0.0.0:8080",
            "--auth=off",
            "--insecure-no-auth",
        ]),
        &none,
    );
    assert!(!c.auth && c.insecure_no_auth);
    let c = load_ok(&flags(&[]), &env(&[("FELIX_AUTH", "on")]));
    assert!(c.auth, "auth on by request on loopback");
}

#[test]
fn a_cluster_that_authenticates_needs_one_secret_of_at_least_32_bytes() {
    let cluster = "--cluster=1=127.0.0.1:7101,2=127.0.0.1:7102";
    let none = HashMap::new();
    let msg = refused(&flags(&["--node-id=1", cluster, "--auth=on"]), &none);
    assert!(
        msg.starts_with("cluster_secret_file")
            && msg.contains("give every broker the same cluster secret"),
        "{msg}"
    );
    // A single node makes its own; without auth a cluster on loopback needs none.
    load_ok(&flags(&["--auth=on"]), &none);
    load_ok(&flags(&["--node-id=1", cluster]), &none);

    let c = load_ok(
        &flags(&["--node-id=1", cluster, "--auth=on"]),
        &env(&[("FELIX_CLUSTER_SECRET", SECRET)]),
    );
    assert_eq!(
        c.cluster_secret.as_ref().map(|s| s.expose()),
        Some(SECRET.as_bytes())
    );
    let c = load_ok(
        &flags(&["--node-id=1", cluster, "--cluster-secret-file=/etc/felix/s"]),
        &none,
    );
    assert_eq!(c.cluster_secret_file, Some(PathBuf::from("/etc/felix/s")));

    let short = &SECRET[1..];
    let msg = refused(&flags(&[]), &env(&[("FELIX_CLUSTER_SECRET", short)]));
    assert!(
        msg.starts_with("cluster_secret") && msg.contains("31 bytes"),
        "{msg}"
    );
    assert!(!msg.contains(short), "the refusal shows the secret: {msg}");
    let msg = refused(
        &flags(&["--cluster-secret-file=/etc/felix/s"]),
        &env(&[("FELIX_CLUSTER_SECRET", SECRET)]),
    );
    assert!(msg.contains("give one"), "{msg}");
    let msg = refused(&flags(&["--cluster-secret-previous-file=/old"]), &none);
    assert!(msg.starts_with("cluster_secret_previous_file"), "{msg}");
}

#[test]
fn the_cluster_secret_is_never_printed() {
    let c = load_ok(&flags(&[]), &env(&[("FELIX_CLUSTER_SECRET", SECRET)]));
    assert!(c.cluster_secret.is_some());
    let toml = c.to_toml();
    let debug = format!("{c:?}");
    for shown in [&toml, &debug] {
        assert!(!shown.contains(SECRET), "{shown}");
    }
    assert!(!toml.contains("cluster_secret"), "{toml}");
    assert!(debug.contains("<redacted>"), "{debug}");
}
