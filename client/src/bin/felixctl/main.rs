//! felixctl: tenants, namespaces and streams; publish from stdin; subscribe to stdout.
//!
//! Exit codes: 0 success, 1 a failure (broker error, lost connection, a record not
//! published), 2 a usage error.
//!
//! Modules: `args` the command line, `output` how results print, one module per command
//! family (`streams`, `publish`, `subscribe`, `groups`, `cache`, `auth`: tokens, roles, keys and
//! which token felixctl presents; `oidc`: trusted issuers and `login`). felixctl talks to the
//! broker named by
//! `--broker` through a pinned [`Connection`]: what it shows is what that broker answers.

mod args;
mod auth;
mod cache;
mod cluster;
mod groups;
mod oidc;
mod output;
mod publish;
mod streams;
mod subscribe;

use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use clap::Parser;
use felix_client::{ClientConfig, ClientError, Connection, codes};

use args::{Cli, Command, GlobalArgs, NamespaceCommand, TenantCommand};
use output::print_segments;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("felixctl: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("felixctl: {e:#}");
            1
        }
    };
    // Nothing left to wait for: a stdin reader may still be blocked, so do not let the
    // runtime's shutdown wait on anything.
    runtime.shutdown_background();
    ExitCode::from(code)
}

async fn run(mut cli: Cli) -> anyhow::Result<u8> {
    // `login` presents no Felix token: the one it would find may be the expired one it is
    // run to replace, and the broker refuses a hello with an expired token.
    if let Command::Login(args) = &cli.command {
        cli.global.token = None;
        cli.global.token_file = None;
        let client = connect(&cli.global).await?;
        return oidc::login(&client, args).await;
    }
    // Resolved once: every connection felixctl opens (subscribe reconnects) presents it.
    cli.global.token = auth::resolve_token(&cli.global)?;
    cli.global.token_file = None;
    let client = connect(&cli.global).await?;
    let code = match cli.command {
        Command::Tenant(TenantCommand::Create {
            name,
            if_not_exists,
        }) => {
            let r = client.create_tenant(&name).await;
            created(r, if_not_exists, &format!("tenant {name}"))?;
            0
        }
        Command::Namespace(NamespaceCommand::Create {
            path: (tenant, ns),
            if_not_exists,
        }) => {
            let r = client.create_namespace(&tenant, &ns).await;
            created(r, if_not_exists, &format!("namespace {tenant}/{ns}"))?;
            0
        }
        Command::Stream(cmd) => streams::stream_command(&client, cmd).await?,
        Command::Publish(args) => publish::publish(&client, args).await?,
        Command::Subscribe(args) => subscribe::subscribe(&client, &cli.global, args).await?,
        Command::Group(cmd) => {
            // A group's shards are served by their leaders: a cluster client follows them.
            let seeds: Vec<String> = cli
                .global
                .broker
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect();
            let cluster = felix_client::Client::connect(seeds, client_config(&cli.global))
                .await
                .context("connecting to the cluster")?;
            groups::group_command(&cluster, cmd).await?
        }
        Command::Cache(cmd) => {
            // A key's owner is found by the broker reached (it forwards); a watch follows it.
            let cluster = cluster_client(&cli.global).await?;
            cache::cache_command(&cluster, cmd).await?
        }
        Command::Token(cmd) => auth::token_command(&client, cmd).await?,
        Command::Role(cmd) => auth::role_command(&client, cmd).await?,
        Command::Key(cmd) => auth::key_command(&client, cmd).await?,
        Command::Oidc(cmd) => oidc::oidc_command(&client, cmd).await?,
        Command::Broker(cmd) => cluster::broker_command(&client, cmd).await?,
        Command::Shard(cmd) => cluster::shard_command(&client, cmd).await?,
        Command::Cluster(cmd) => cluster::cluster_command(&client, cmd).await?,
        Command::Login(_) => unreachable!("login is run before a token is resolved"),
        Command::Segments {
            path: (t, ns, s),
            output,
        } => {
            let segments = client
                .list_segments(&t, &ns, &s)
                .await
                .with_context(|| format!("listing segments of {t}/{ns}/{s}"))?;
            print_segments(&segments, output)?;
            0
        }
    };
    client.close().await;
    Ok(code)
}

pub(crate) fn client_config(g: &GlobalArgs) -> ClientConfig {
    ClientConfig {
        ca: g.ca.clone(),
        insecure: g.insecure,
        name: format!("felixctl/{}", env!("CARGO_PKG_VERSION")),
        request_timeout: g.timeout,
        token: g.token.clone(),
        ..Default::default()
    }
}

/// A cluster client seeded with every broker of `--broker`.
async fn cluster_client(g: &GlobalArgs) -> anyhow::Result<felix_client::Client> {
    let seeds: Vec<String> = g
        .broker
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect();
    felix_client::Client::connect(seeds, client_config(g))
        .await
        .context("connecting to the cluster")
}

/// Connects to the first broker of the list that answers.
async fn connect(g: &GlobalArgs) -> anyhow::Result<Connection> {
    let config = client_config(g);
    let mut errors = Vec::new();
    for addr in g.broker.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        match Connection::connect(addr, config.clone()).await {
            Ok(client) => return Ok(client),
            // A TLS setup problem (no CA for a remote broker, unreadable CA) is the same for
            // every broker: say it once.
            Err(e @ ClientError::Tls(_)) => return Err(anyhow!(e)),
            Err(e) => errors.push(format!("{addr}: {e}")),
        }
    }
    match errors.len() {
        0 => bail!("no broker address given (--broker HOST:PORT)"),
        1 => bail!("{}", errors[0]),
        _ => bail!("no broker answered: {}", errors.join("; ")),
    }
}

/// A create that may find the thing already there.
pub(crate) fn created(
    r: Result<(), ClientError>,
    if_not_exists: bool,
    what: &str,
) -> anyhow::Result<()> {
    match r {
        Ok(()) => println!("created {what}"),
        Err(e) if if_not_exists && e.code() == Some(codes::ALREADY_EXISTS) => {
            println!("{what} exists already")
        }
        Err(e) => return Err(anyhow!(e).context(format!("creating {what}"))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::*;
    use crate::output::*;
    use crate::publish::*;
    use bytes::Bytes;
    use felix_client::{Compression, Event, StartAt};
    use std::time::Duration;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("felixctl").chain(args.iter().copied()))
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn global_options_go_before_or_after_the_subcommand() {
        let a = parse(&["--broker", "h:1", "stream", "describe", "a/b/c"]).unwrap();
        let b = parse(&[
            "stream",
            "describe",
            "a/b/c",
            "--broker",
            "h:1",
            "--insecure",
        ])
        .unwrap();
        assert_eq!(a.global.broker, "h:1");
        assert_eq!(b.global.broker, "h:1");
        assert!(b.global.insecure);
        let c = parse(&["publish", "a/b/c", "--timeout", "500ms"]).unwrap();
        assert_eq!(c.global.timeout, Duration::from_millis(500));
    }

    #[test]
    fn usage_errors_exit_with_2() {
        for bad in [
            vec!["stream", "describe", "a/b"],
            vec!["namespace", "create", "a"],
            vec!["subscribe", "a/b/c", "--from", "yesterday"],
            vec!["publish", "a/b/c", "--acks", "all"],
            vec!["publish", "a/b/c", "--size", "10"],
            vec!["publish", "a/b/c", "--batch-size", "0"],
            vec!["publish", "a/b/c", "--compression", "brotli"],
            vec!["stream", "create", "a/b/c", "--consistency", "all"],
        ] {
            let err = parse(&bad).expect_err(&format!("{bad:?} accepted"));
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn stream_flags_map_to_config_fields() {
        let cli = parse(&[
            "stream",
            "create",
            "t/n/s",
            "--durable",
            "--shards",
            "4",
            "--replicas",
            "3",
            "--consistency",
            "quorum",
            "--segment-bytes",
            "64MiB",
            "--segment-ms",
            "10m",
            "--retention-ms",
            "604800000",
            "--retention-bytes",
            "0",
            "--hot-retention-ms",
            "1h",
            "--hot-retention-bytes",
            "1GB",
        ])
        .unwrap();
        let Command::Stream(StreamCommand::Create {
            path,
            durable,
            settings,
            ..
        }) = cli.command
        else {
            panic!("not stream create");
        };
        assert_eq!(path, ("t".into(), "n".into(), "s".into()));
        assert!(durable);
        let c = settings.config();
        assert_eq!(c.shards, Some(4));
        assert_eq!(c.replicas, Some(3));
        assert_eq!(c.consistency.as_deref(), Some("quorum"));
        assert_eq!(c.segment_bytes, Some(64 << 20));
        assert_eq!(c.segment_ms, Some(600_000));
        assert_eq!(c.retention_ms, Some(604_800_000));
        assert_eq!(c.retention_bytes, Some(0));
        assert_eq!(c.hot_retention_ms, Some(3_600_000));
        assert_eq!(c.hot_retention_bytes, Some(1_000_000_000));
        assert_eq!(c.tiered, None);
    }

    #[test]
    fn publish_defaults_are_batch_acks_of_500_uncompressed_text() {
        let cli = parse(&["publish", "t/n/s"]).unwrap();
        let Command::Publish(p) = cli.command else {
            panic!("not publish");
        };
        assert_eq!(p.acks, Acks::Batch);
        assert_eq!(p.batch_size, 500);
        assert_eq!(p.compression, Compression::None);
        assert_eq!(p.output, Output::Text);
        assert!(p.count.is_none() && p.key.is_none());
    }

    #[test]
    fn subscribe_parses_every_start_position() {
        let from = |f: &str| {
            let cli = parse(&["subscribe", "t/n/s", "--from", f]).unwrap();
            let Command::Subscribe(s) = cli.command else {
                panic!("not subscribe");
            };
            s.from
        };
        assert_eq!(from("earliest"), StartAt::Earliest);
        assert_eq!(from("latest"), StartAt::Latest);
        assert_eq!(from("17"), StartAt::Offset(17));
        assert_eq!(
            from("@2024-05-01T12:00:00Z"),
            StartAt::Timestamp(1_714_564_800_000)
        );
        let cli = parse(&["subscribe", "t/n/s"]).unwrap();
        let Command::Subscribe(s) = cli.command else {
            panic!("not subscribe");
        };
        assert_eq!(s.from, StartAt::Latest);
        assert_eq!(s.shard, None);
    }

    #[test]
    fn sizes_and_durations_parse_with_units() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("4KiB"), Ok(4096));
        assert_eq!(parse_bytes("2MB"), Ok(2_000_000));
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("99999999999TiB").is_err());
        assert_eq!(parse_ms("250"), Ok(250));
        assert_eq!(parse_ms("7d"), Ok(7 * 86_400_000));
        assert_eq!(parse_ms("1s 500ms"), Ok(1500));
        assert!(parse_ms("soon").is_err());
    }

    #[test]
    fn published_lines_are_shard_offset_then_line() {
        assert_eq!(
            published_json(3, 41, 7),
            r#"{"shard":3,"offset":41,"line":7}"#
        );
    }

    #[test]
    fn events_print_as_jsonl_in_utf8_or_base64() {
        let event = Event {
            offset: 9,
            timestamp: 1_700_000_000_000,
            key: Some(Bytes::from_static(b"k1")),
            payload: Bytes::from_static(b"caf\xc3\xa9 \xff"),
            headers: vec![
                ("trace".to_owned(), Bytes::from_static(b"t-1")),
                ("trace".to_owned(), Bytes::from_static(b"")),
            ],
        };
        assert_eq!(
            event_json(2, &event, PayloadEncoding::Utf8),
            "{\"shard\":2,\"offset\":9,\"timestamp\":1700000000000,\"key\":\"k1\",\"payload\":\"caf\u{e9} \u{fffd}\",\"headers\":[{\"key\":\"trace\",\"value\":\"t-1\"},{\"key\":\"trace\",\"value\":\"\"}]}"
        );
        assert_eq!(
            event_json(2, &event, PayloadEncoding::Base64),
            r#"{"shard":2,"offset":9,"timestamp":1700000000000,"key":"azE=","payload":"Y2Fmw6kg/w==","headers":[{"key":"trace","value":"dC0x"},{"key":"trace","value":""}]}"#
        );
        let keyless = Event { key: None, ..event };
        let v: serde_json::Value =
            serde_json::from_str(&event_json(0, &keyless, PayloadEncoding::Utf8)).unwrap();
        assert!(v["key"].is_null());
        assert_eq!(
            format_event(0, &keyless, Output::Text, PayloadEncoding::Utf8),
            b"caf\xc3\xa9 \xff\n"
        );
        assert_eq!(
            format_event(0, &keyless, Output::Text, PayloadEncoding::Base64),
            b"Y2Fmw6kg/w==\n"
        );
    }

    #[test]
    fn progress_shows_done_of_total_the_rate_and_the_time_left() {
        use crate::publish::progress_line;
        assert_eq!(
            progress_line(250, 50, Some(1000)),
            "felixctl: 250/1000 records published (25%), 50 records/s, ETA 15s"
        );
        assert_eq!(
            progress_line(10, 0, Some(1000)),
            "felixctl: 10/1000 records published (1%), 0 records/s, ETA unknown"
        );
        assert_eq!(
            progress_line(7, 7, None),
            "felixctl: 7 records published, 7 records/s"
        );
    }

    #[test]
    fn segment_times_print_as_utc_with_milliseconds() {
        assert_eq!(
            output::utc_millis(1_714_564_800_123),
            "2024-05-01T12:00:00.123Z"
        );
        assert_eq!(output::utc_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(output::utc_millis(-1), "-1");
    }

    #[test]
    fn input_lines_lose_their_terminator_only() {
        assert_eq!(strip_newline(b"abc\n".to_vec()), b"abc");
        assert_eq!(strip_newline(b"abc\r\n".to_vec()), b"abc");
        assert_eq!(strip_newline(b"abc".to_vec()), b"abc");
        assert_eq!(strip_newline(b"\n".to_vec()), b"");
        assert_eq!(strip_newline(b"a\rb\n".to_vec()), b"a\rb");
    }

    #[test]
    fn generated_payloads_have_the_requested_size() {
        assert_eq!(&generated_payload(3, 12)[..], b"record-3 xxx");
        assert_eq!(&generated_payload(12345, 4)[..], b"reco");
        assert_eq!(generated_payload(1, 0).len(), 0);
    }

    #[test]
    fn only_connection_and_stream_level_failures_stop_a_publish_run() {
        let broker = |code| ClientError::Broker(felix_client::ErrorBody::new(code, "r", "m"));
        assert!(stops_the_run(&ClientError::Transport("gone".into())));
        assert!(stops_the_run(&ClientError::Timeout));
        assert!(stops_the_run(&broker(codes::UNKNOWN_STREAM)));
        assert!(!stops_the_run(&broker(codes::RECORD_TOO_LARGE)));
        assert!(!stops_the_run(&broker(codes::OVERLOADED)));
        assert!(!stops_the_run(&ClientError::InvalidArgument("big".into())));
    }
}
