//! `felixctl cache create|describe|list|delete|put|get|del|incr|watch` (docs/cache.md).
//!
//! These go through a cluster [`Client`] made from the `--broker` list: the broker it
//! reaches forwards an operation on a key to the key's owner, and a watch is opened at the
//! owner and follows it. A refused conditional write exits 1 with the broker's reason
//! (`version_conflict`) on stderr.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, anyhow};
use bytes::Bytes;
use clap::{Subcommand, ValueEnum};
use felix_client::{CacheConfig, CacheInfo, ChangeKind, Client, Condition, WatchTarget};
use serde_json::json;

use crate::args::{Output, StreamPath, stream_path};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Consistency {
    Leader,
    Quorum,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GetOutput {
    /// The value alone (nothing when absent, exit 0).
    Text,
    /// `{"key","value","version","ttl_ms"}`; `value` null when absent.
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum CacheCommand {
    /// Create a cache (in memory unless --durable).
    Create {
        #[arg(value_name = "TENANT/NS/CACHE", value_parser = stream_path)]
        path: StreamPath,
        /// Log-backed: survives restarts, replicated, compacted.
        #[arg(long)]
        durable: bool,
        #[arg(long, value_enum, default_value_t = Consistency::Leader)]
        consistency: Consistency,
        #[arg(long)]
        shards: Option<u32>,
        #[arg(long)]
        replicas: Option<u32>,
    },
    /// Show a cache's settings.
    Describe {
        #[arg(value_name = "TENANT/NS/CACHE", value_parser = stream_path)]
        path: StreamPath,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// List a namespace's caches.
    List {
        #[arg(value_name = "TENANT/NS", value_parser = namespace_path)]
        path: (String, String),
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Drop a cache and every entry in it.
    Delete {
        #[arg(value_name = "TENANT/NS/CACHE", value_parser = stream_path)]
        path: StreamPath,
    },
    /// Store VALUE under KEY; prints the new version.
    Put {
        #[arg(value_name = "TENANT/NS/CACHE", value_parser = stream_path)]
        path: StreamPath,
        key: String,
        value: String,
        /// Expire this long after the put returns (e.g. 60s).
        #[arg(long, value_parser = humantime::parse_duration, value_name = "DURATION")]
        ttl: Option<Duration>,
        /// Only if the key holds no value.
        #[arg(long, conflicts_with = "if_version")]
        if_absent: bool,
        /// Only if the key is at this version.
        #[arg(long, value_name = "V")]
        if_version: Option<u64>,
    },
    /// Print KEY's value.
    Get {
        #[arg(value_name = "TENANT/NS/CACHE", value_parser = stream_path)]
        path: StreamPath,
        key: String,
        #[arg(long, value_enum, default_value_t = GetOutput::Text)]
        output: GetOutput,
    },
    /// Delete KEY (prints whether it held a value).
    Del {
        #[arg(value_name = "TENANT/NS/CACHE", value_parser = stream_path)]
        path: StreamPath,
        key: String,
        /// Only if the key is at this version.
        #[arg(long, value_name = "V")]
        if_version: Option<u64>,
    },
    /// Add to KEY's counter (atomically at its owner); prints the new value.
    Incr {
        #[arg(value_name = "TENANT/NS/CACHE", value_parser = stream_path)]
        path: StreamPath,
        key: String,
        #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
        by: i64,
    },
    /// Print changes to KEY (or to every key with --prefix) as they happen.
    Watch {
        #[arg(value_name = "TENANT/NS/CACHE", value_parser = stream_path)]
        path: StreamPath,
        #[arg(required_unless_present = "prefix", conflicts_with = "prefix")]
        key: Option<String>,
        #[arg(long)]
        prefix: Option<String>,
        /// Exit after this many changes.
        #[arg(long)]
        count: Option<u64>,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

fn namespace_path(s: &str) -> Result<(String, String), String> {
    felix_client::parse_namespace_path(s).map_err(|e| e.to_string())
}

fn print_info(info: &CacheInfo, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Text => println!(
            "{}/{}/{}  durable={} consistency={} shards={} replicas={}",
            info.tenant,
            info.namespace,
            info.name,
            info.durable,
            info.consistency,
            info.shards,
            info.replicas
        ),
        Output::Jsonl => println!(
            "{}",
            json!({
                "tenant": info.tenant, "namespace": info.namespace, "name": info.name,
                "durable": info.durable, "consistency": info.consistency,
                "shards": info.shards, "replicas": info.replicas,
            })
        ),
    }
    Ok(())
}

/// A value as JSON: a counter's (a decimal integer) as its number, other UTF-8 as a string,
/// anything else as base64 under `value_base64`.
fn value_json(value: &Bytes) -> serde_json::Value {
    match std::str::from_utf8(value) {
        Ok(s) => match s.parse::<i64>() {
            Ok(n) if n.to_string() == s => json!(n),
            _ => json!(s),
        },
        Err(_) => {
            use base64::Engine;
            json!({ "base64": base64::engine::general_purpose::STANDARD.encode(value) })
        }
    }
}

pub(crate) async fn cache_command(client: &Client, cmd: CacheCommand) -> anyhow::Result<u8> {
    match cmd {
        CacheCommand::Create {
            path: (t, n, c),
            durable,
            consistency,
            shards,
            replicas,
        } => {
            let config = CacheConfig {
                durable: Some(durable),
                consistency: Some(
                    match consistency {
                        Consistency::Leader => "leader",
                        Consistency::Quorum => "quorum",
                    }
                    .to_owned(),
                ),
                shards,
                replicas,
            };
            client
                .create_cache(&t, &n, &c, config)
                .await
                .with_context(|| format!("creating cache {t}/{n}/{c}"))?;
            println!("created cache {t}/{n}/{c}");
        }
        CacheCommand::Describe {
            path: (t, n, c),
            output,
        } => print_info(&client.describe_cache(&t, &n, &c).await?, output)?,
        CacheCommand::List {
            path: (t, n),
            output,
        } => {
            for info in client.list_caches(&t, &n).await? {
                print_info(&info, output)?;
            }
        }
        CacheCommand::Delete { path: (t, n, c) } => {
            client.delete_cache(&t, &n, &c).await?;
            println!("deleted cache {t}/{n}/{c}");
        }
        CacheCommand::Put {
            path: (t, n, c),
            key,
            value,
            ttl,
            if_absent,
            if_version,
        } => {
            let ttl_ms = ttl.map(|d| d.as_millis().max(1) as u64);
            let condition = match (if_absent, if_version) {
                (true, _) => Some(Condition::Absent),
                (_, Some(v)) => Some(Condition::Version(v)),
                _ => None,
            };
            let value = Bytes::from(value.into_bytes());
            let version = match condition {
                Some(cond) => {
                    client
                        .cache_put_if(&t, &n, &c, &key, value, ttl_ms, cond)
                        .await
                }
                None => client.cache_put(&t, &n, &c, &key, value, ttl_ms).await,
            }
            .map_err(|e| anyhow!(e))?;
            println!("{version}");
        }
        CacheCommand::Get {
            path: (t, n, c),
            key,
            output,
        } => {
            let found = client.cache_get_versioned(&t, &n, &c, &key).await?;
            match output {
                GetOutput::Text => {
                    if let Some(v) = &found {
                        let mut out = std::io::stdout().lock();
                        out.write_all(&v.value)?;
                        out.write_all(b"\n")?;
                    }
                }
                GetOutput::Json => {
                    let line = match &found {
                        Some(v) => json!({
                            "key": key, "value": value_json(&v.value),
                            "version": v.version, "ttl_ms": v.ttl_ms,
                        }),
                        None => {
                            json!({ "key": key, "value": null, "version": null, "ttl_ms": null })
                        }
                    };
                    println!("{line}");
                }
            }
        }
        CacheCommand::Del {
            path: (t, n, c),
            key,
            if_version,
        } => {
            let existed = match if_version {
                Some(v) => {
                    client
                        .cache_delete_if(&t, &n, &c, &key, Condition::Version(v))
                        .await
                }
                None => client.cache_delete(&t, &n, &c, &key).await,
            }
            .map_err(|e| anyhow!(e))?;
            println!("{}", if existed { "deleted" } else { "absent" });
        }
        CacheCommand::Incr {
            path: (t, n, c),
            key,
            by,
        } => println!("{}", client.counter_add(&t, &n, &c, &key, by).await?),
        CacheCommand::Watch {
            path: (t, n, c),
            key,
            prefix,
            count,
            output,
        } => {
            let target = match (key, prefix) {
                (Some(k), _) => WatchTarget::Key(k),
                (None, Some(p)) => WatchTarget::Prefix(p),
                (None, None) => unreachable!("clap requires a key or --prefix"),
            };
            let mut watch = client.watch_cache(&t, &n, &c, target).await?;
            let mut seen = 0u64;
            while count.is_none_or(|c| seen < c) {
                let change = watch.next_change().await?;
                seen += 1;
                let kind = match change.kind {
                    ChangeKind::Put => "put",
                    ChangeKind::Delete => "delete",
                    ChangeKind::Expire => "expire",
                };
                match output {
                    Output::Text => println!(
                        "{kind} {} v{} {}",
                        change.key,
                        change.version,
                        String::from_utf8_lossy(&change.value)
                    ),
                    Output::Jsonl => println!(
                        "{}",
                        json!({
                            "key": change.key, "kind": kind, "version": change.version,
                            "value": if change.kind == ChangeKind::Put { value_json(&change.value) } else { serde_json::Value::Null },
                        })
                    ),
                }
                std::io::stdout().flush()?;
            }
        }
    }
    Ok(0)
}
