//! `felixctl subscribe`: every shard asked for (or all), on the shard's leader, printed
//! as records arrive until the count is reached or the subscription ends.

use std::io::Write;

use anyhow::{Context, anyhow};
use felix_client::{ClientError, Connection, Event, codes};
use tokio::sync::mpsc;

use crate::args::{GlobalArgs, SubscribeArgs};
use crate::client_config;
use crate::output::format_event;

pub(crate) async fn subscribe(
    client: &Connection,
    g: &GlobalArgs,
    args: SubscribeArgs,
) -> anyhow::Result<u8> {
    let (t, ns, s) = args.path.clone();
    let shards: Vec<u32> = match args.shard {
        Some(shard) => vec![shard],
        None => {
            let n = client
                .shard_count(&t, &ns, &s)
                .await
                .with_context(|| format!("describing stream {t}/{ns}/{s}"))?;
            (0..n).collect()
        }
    };
    if args.count == Some(0) {
        return Ok(0);
    }
    // Open every subscription before printing anything, so a bad shard fails up front.
    let mut subs = Vec::with_capacity(shards.len());
    for &shard in &shards {
        let sub = match client.subscribe(&t, &ns, &s, shard, args.from).await {
            // In a cluster, a shard is read on its leader: follow the broker's hint once.
            Err(ClientError::Broker(e))
                if e.code == codes::NOT_LEADER && e.leader_addr.is_some() =>
            {
                let addr = e.leader_addr.unwrap_or_default();
                let leader = Connection::connect(&addr, client_config(g))
                    .await
                    .with_context(|| format!("connecting to shard {shard}'s leader at {addr}"))?;
                leader.subscribe(&t, &ns, &s, shard, args.from).await
            }
            other => other,
        }
        .with_context(|| format!("subscribing to {t}/{ns}/{s} shard {shard}"))?;
        subs.push(sub);
    }
    let (tx, mut rx) = mpsc::channel::<(u32, Result<Option<Event>, ClientError>)>(1024);
    for mut sub in subs {
        let tx = tx.clone();
        tokio::spawn(async move {
            let shard = sub.shard();
            loop {
                let next = sub.next_event().await;
                let last = !matches!(next, Ok(Some(_)));
                if tx.send((shard, next)).await.is_err() || last {
                    return;
                }
            }
        });
    }
    drop(tx);

    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut printed = 0u64;
    let mut code = 0;
    while let Some((shard, next)) = rx.recv().await {
        match next {
            Ok(Some(event)) => {
                let bytes = format_event(shard, &event, args.output, args.payload_encoding);
                let mut write = out.write_all(&bytes);
                printed += 1;
                let done = args.count.is_some_and(|n| printed >= n);
                if write.is_ok() && (done || rx.is_empty()) {
                    write = out.flush();
                }
                if let Err(e) = write {
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        return Ok(0);
                    }
                    return Err(anyhow!(e).context("writing stdout"));
                }
                if done {
                    break;
                }
            }
            Ok(None) => {}
            Err(ClientError::SubscriptionLagged { resume_offset }) => {
                let _ = out.flush();
                eprintln!(
                    "felixctl: shard {shard} lagged: resume from offset {resume_offset} \
                     (--shard {shard} --from {resume_offset})"
                );
                code = 1;
                break;
            }
            Err(e) => {
                let _ = out.flush();
                eprintln!("felixctl: shard {shard}: {e}");
                code = 1;
                break;
            }
        }
    }
    let _ = out.flush();
    Ok(code)
}
