//! `felixctl group create|describe|list|delete|consume`: consumer groups (docs/groups.md).
//!
//! Unlike the other commands, these go through a cluster [`Client`] made from the same
//! `--broker` list: a group's shards are served by their leaders, which the client finds and
//! follows. `consume` prints each record, then answers it (ack by default, `--nack`, or
//! nothing with `--no-ack`) and waits for the answers before it exits.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use felix_client::{Client, GroupConfig, GroupInfo, GroupRecord, GroupStart, StartAt};
use serde::Serialize;

use crate::args::{Output, PayloadEncoding, StreamPath, start_at, stream_path};
use crate::output::{HeaderLine, encode_bytes};

#[derive(Subcommand, Debug)]
pub(crate) enum GroupCommand {
    /// Create a consumer group of a durable stream.
    Create {
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
        group: String,
        /// How long a claimed record is held for its consumer.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
        visibility_timeout: Duration,
        /// Deliveries before a record is dead-lettered.
        #[arg(long, default_value_t = 5)]
        max_attempts: u32,
        /// Where exhausted records go (default: retired and counted).
        #[arg(long, value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        dead_letter: Option<StreamPath>,
        /// Where the group starts on each shard: earliest, latest, an offset, or @TIME.
        #[arg(long, default_value = "earliest", value_name = "POSITION", value_parser = start_at)]
        from: StartAt,
    },
    /// Change a group's settings (those given; the start position cannot change).
    Alter {
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
        group: String,
        #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
        visibility_timeout: Option<Duration>,
        #[arg(long)]
        max_attempts: Option<u32>,
        /// The new dead-letter stream, or `none` to retire exhausted records instead.
        #[arg(long, value_name = "TENANT/NS/STREAM|none")]
        dead_letter: Option<String>,
    },
    /// Show a group's settings and, per shard: acked-up-to, in flight, waiting for
    /// redelivery, dead-lettered, and consumers seen in the last minute.
    Describe {
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
        group: String,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// List a stream's groups.
    List {
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Delete a group and its progress.
    Delete {
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
        group: String,
    },
    /// Claim records, print each, then acknowledge it (or --nack, or --no-ack).
    Consume(ConsumeArgs),
}

#[derive(Args, Debug)]
pub(crate) struct ConsumeArgs {
    #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
    path: StreamPath,
    group: String,
    /// Handle at most N records, then exit.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Exit once no record has arrived for this long (default: wait for --count, or
    /// forever).
    #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
    wait: Option<Duration>,
    /// Answer nothing: the claims lapse at their deadline and the records are redelivered.
    #[arg(long, conflicts_with = "nack")]
    no_ack: bool,
    /// Nack each record after printing it (redelivered at once, or after --delay).
    #[arg(long)]
    nack: bool,
    /// With --nack: redeliver after this long.
    #[arg(long, requires = "nack", value_parser = humantime::parse_duration, value_name = "DURATION")]
    delay: Option<Duration>,
    /// text: each payload on its own line; jsonl: {"shard","offset","attempt","timestamp",
    /// "key","payload","headers"} per record.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// How keys and payloads are printed.
    #[arg(long, value_enum, default_value_t = PayloadEncoding::Utf8)]
    payload_encoding: PayloadEncoding,
}

/// The longest single poll: a consumer with no --wait keeps polling.
const POLL_WAIT: Duration = Duration::from_secs(20);
/// Records asked for per poll.
const POLL_RECORDS: u64 = 100;

fn group_start(s: StartAt) -> GroupStart {
    match s {
        StartAt::Earliest => GroupStart::Earliest,
        StartAt::Latest => GroupStart::Latest,
        StartAt::Offset(o) => GroupStart::Offset(o),
        StartAt::Timestamp(t) => GroupStart::Timestamp(t),
    }
}

pub(crate) async fn group_command(client: &Client, cmd: GroupCommand) -> anyhow::Result<u8> {
    match cmd {
        GroupCommand::Create {
            path: (t, n, s),
            group,
            visibility_timeout,
            max_attempts,
            dead_letter,
            from,
        } => {
            let config = GroupConfig {
                visibility_timeout_ms: Some(visibility_timeout.as_millis() as u64),
                max_attempts: Some(max_attempts),
                dead_letter: dead_letter.map(|(t, n, s)| format!("{t}/{n}/{s}")),
                start: Some(group_start(from)),
            };
            let info = client
                .create_group(&t, &n, &s, &group, config)
                .await
                .with_context(|| format!("creating group {group} of {t}/{n}/{s}"))?;
            print_group(&info, Output::Text)?;
        }
        GroupCommand::Alter {
            path: (t, n, s),
            group,
            visibility_timeout,
            max_attempts,
            dead_letter,
        } => {
            let dead_letter = match dead_letter.as_deref() {
                None => None,
                Some("none") => Some(String::new()),
                Some(path) => {
                    let (t, n, s) = stream_path(path).map_err(|e| anyhow!(e))?;
                    Some(format!("{t}/{n}/{s}"))
                }
            };
            let config = GroupConfig {
                visibility_timeout_ms: visibility_timeout.map(|d| d.as_millis() as u64),
                max_attempts,
                dead_letter,
                start: None,
            };
            let info = client
                .alter_group(&t, &n, &s, &group, config)
                .await
                .with_context(|| format!("altering group {group} of {t}/{n}/{s}"))?;
            print_group(&info, Output::Text)?;
        }
        GroupCommand::Describe {
            path: (t, n, s),
            group,
            output,
        } => {
            let info = client
                .describe_group(&t, &n, &s, &group)
                .await
                .with_context(|| format!("describing group {group} of {t}/{n}/{s}"))?;
            print_group(&info, output)?;
        }
        GroupCommand::List {
            path: (t, n, s),
            output,
        } => {
            let groups = client
                .list_groups(&t, &n, &s)
                .await
                .with_context(|| format!("listing the groups of {t}/{n}/{s}"))?;
            for g in &groups {
                match output {
                    Output::Jsonl => println!("{}", serde_json::to_string(g)?),
                    Output::Text => println!(
                        "{}\tvisibility_timeout={}ms\tmax_attempts={}\tdead_letter={}",
                        g.name,
                        g.visibility_timeout_ms,
                        g.max_attempts,
                        g.dead_letter.as_deref().unwrap_or("-")
                    ),
                }
            }
        }
        GroupCommand::Delete {
            path: (t, n, s),
            group,
        } => {
            client
                .delete_group(&t, &n, &s, &group)
                .await
                .with_context(|| format!("deleting group {group} of {t}/{n}/{s}"))?;
            eprintln!("deleted group {group} of {t}/{n}/{s}");
        }
        GroupCommand::Consume(args) => return consume(client, args).await,
    }
    Ok(0)
}

fn print_group(info: &GroupInfo, output: Output) -> anyhow::Result<()> {
    if output == Output::Jsonl {
        println!("{}", serde_json::to_string(info)?);
        return Ok(());
    }
    println!(
        "group {} of {}/{}/{}: visibility_timeout={}ms max_attempts={} dead_letter={} start={:?}",
        info.name,
        info.tenant,
        info.namespace,
        info.stream,
        info.visibility_timeout_ms,
        info.max_attempts,
        info.dead_letter.as_deref().unwrap_or("-"),
        info.start
    );
    if !info.shards.is_empty() {
        println!(
            "shard\tacked_up_to\tnext\tin_flight\twaiting\tbacklog\tacked\tdead_lettered\tconsumers"
        );
    }
    for s in &info.shards {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            s.shard,
            s.acked_up_to,
            s.next_offset,
            s.in_flight,
            s.waiting,
            s.backlog,
            s.acked,
            s.dead_lettered,
            s.consumers.join(",")
        );
    }
    Ok(())
}

#[derive(Serialize)]
struct RecordLine<'a> {
    shard: u32,
    offset: u64,
    attempt: u32,
    timestamp: i64,
    key: Option<std::borrow::Cow<'a, str>>,
    payload: std::borrow::Cow<'a, str>,
    headers: Vec<HeaderLine<'a>>,
}

fn format_record(r: &GroupRecord, output: Output, encoding: PayloadEncoding) -> Vec<u8> {
    let mut out = match (output, encoding) {
        (Output::Jsonl, _) => serde_json::to_string(&RecordLine {
            shard: r.shard,
            offset: r.offset,
            attempt: r.attempt,
            timestamp: r.timestamp,
            key: r.key.as_deref().map(|k| encode_bytes(k, encoding)),
            payload: encode_bytes(&r.payload, encoding),
            headers: r
                .headers
                .iter()
                .map(|(key, value)| HeaderLine {
                    key,
                    value: encode_bytes(value, encoding),
                })
                .collect(),
        })
        .unwrap_or_default()
        .into_bytes(),
        (Output::Text, _) => encode_bytes(&r.payload, encoding).into_owned().into_bytes(),
    };
    out.push(b'\n');
    out
}

async fn consume(client: &Client, args: ConsumeArgs) -> anyhow::Result<u8> {
    let (t, n, s) = &args.path;
    let mut consumer = client.group(t, n, s, &args.group);
    let mut handled = 0u64;
    let mut last_record = Instant::now();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    loop {
        let want = match args.count {
            Some(n) if handled >= n => break,
            Some(n) => (n - handled).min(POLL_RECORDS),
            None => POLL_RECORDS,
        };
        let wait = match args.wait {
            Some(w) => {
                let idle = last_record.elapsed();
                if idle >= w {
                    break;
                }
                (w - idle).min(POLL_WAIT)
            }
            None => POLL_WAIT,
        };
        let records = consumer
            .poll(want as usize, wait)
            .await
            .with_context(|| format!("polling group {} of {t}/{n}/{s}", args.group))?;
        if records.is_empty() {
            continue;
        }
        last_record = Instant::now();
        for r in &records {
            let line = format_record(r, args.output, args.payload_encoding);
            if let Err(e) = out.write_all(&line) {
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(0);
                }
                return Err(anyhow!(e).context("writing stdout"));
            }
        }
        out.flush().context("writing stdout")?;
        // Printed first, answered after: a crash in between redelivers, never loses.
        if args.nack {
            consumer
                .nack_all(&records, args.delay, Some("nacked by felixctl"))
                .await
                .context("nacking the records printed")?;
        } else if !args.no_ack {
            consumer
                .ack_all(&records)
                .await
                .context("acknowledging the records printed")?;
        }
        handled += records.len() as u64;
    }
    Ok(0)
}
