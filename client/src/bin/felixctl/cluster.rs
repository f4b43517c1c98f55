//! `felixctl broker …` and `felixctl shard …`: the cluster's brokers, drains and shard moves
//! (docs/shard-moves.md). A drain or a move is started, then followed until it is done,
//! printing its progress; it exits with what is stuck if it does not finish in time.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};
use felix_client::{BrokerInfo, Connection, MoveInfo};

use crate::args::{StreamPath, stream_path};

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListOutput {
    /// An aligned table.
    Text,
    /// One JSON array of objects.
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum BrokerCommand {
    /// Every registered broker: addresses, zone, alive, draining, shards led and held, and
    /// the bytes of its local logs (blank when it did not answer).
    List {
        #[arg(long, value_enum, default_value_t = ListOutput::Text)]
        output: ListOutput,
    },
    /// Moves every replica and leadership off broker ID; shows progress and exits when it
    /// holds none (or with what is stuck after --wait).
    Drain {
        id: u64,
        /// How long to follow the drain before giving up (it carries on without felixctl).
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        wait: Duration,
        /// Start the drain and return at once.
        #[arg(long)]
        no_wait: bool,
    },
    /// Lets broker ID take shards again.
    Undrain { id: u64 },
    /// Forgets broker ID for good: takes it out of the broker list and the control plane's
    /// members. Refused while it is alive or holds a replica: drain it, stop it, then
    /// remove it (a dead broker's replicas are replaced by the controller after
    /// replica_replace_after_ms).
    Remove { id: u64 },
}

#[derive(Subcommand, Debug)]
pub(crate) enum ClusterCommand {
    /// Evens out leaders, then replicas, over the live brokers: prints the plan, then makes
    /// its moves four at a time, waiting for each batch, and plans again (at most three
    /// plans) if leaders or replicas changed meanwhile (e.g. a failover). Exits 1 naming what
    /// is stuck if a batch does not end within --wait, if a move was rolled back (its
    /// destination died), or if they are still not within one of even after three plans.
    Rebalance {
        /// Print the plan only.
        #[arg(long)]
        dry_run: bool,
        #[arg(long, value_enum, default_value_t = ListOutput::Text)]
        output: ListOutput,
        /// How long to follow each batch of moves before giving up.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        wait: Duration,
    },
}

/// Moves a rebalance starts at once.
const REBALANCE_BATCH: usize = 4;

/// Plans a rebalance makes at most: the first, then one more each time leaders or replicas
/// changed under it (a failover, a drain) so that the first plan's moves no longer even
/// them out.
const REBALANCE_ROUNDS: usize = 3;

pub(crate) async fn cluster_command(
    client: &Connection,
    cmd: ClusterCommand,
) -> anyhow::Result<u8> {
    let ClusterCommand::Rebalance {
        dry_run,
        output,
        wait,
    } = cmd;
    let plan = client
        .plan_rebalance()
        .await
        .context("planning a rebalance")?;
    match output {
        ListOutput::Json => println!("{}", serde_json::to_string(&plan)?),
        ListOutput::Text => {
            println!("{} moves planned", plan.len());
            for m in &plan {
                println!(
                    "  {}/{}/{} shard {}: broker {} -> broker {}",
                    m.tenant, m.namespace, m.stream, m.shard, m.from, m.to
                );
            }
        }
    }
    if dry_run || plan.is_empty() {
        return Ok(0);
    }
    let mut plan = plan;
    for round in 1..=REBALANCE_ROUNDS {
        let code = make_moves(client, &plan, wait).await?;
        if code != 0 {
            return Ok(code);
        }
        // Every planned move was made, which leaves leaders and replicas within one of even
        // unless something else moved them meanwhile (a failover of a leadership a move had
        // just handed over, a drain): then plan again from where they are now.
        let after = client
            .plan_rebalance()
            .await
            .context("checking the rebalance's result")?;
        if after.is_empty() {
            println!(
                "balanced: a new plan moves nothing (leaders and replicas within one of even \
                 where zones allow)"
            );
            return Ok(0);
        }
        let brokers = client.list_brokers().await.context("listing brokers")?;
        let counts: Vec<String> = brokers
            .iter()
            .map(|b| {
                format!(
                    "broker {}: {} leaders, {} replicas{}{}",
                    b.id,
                    b.leaders,
                    b.replicas,
                    if b.alive { "" } else { ", dead" },
                    if b.draining { ", draining" } else { "" }
                )
            })
            .collect();
        if round == REBALANCE_ROUNDS {
            eprintln!(
                "not balanced after {round} rounds: leaders or replicas kept changing while \
                 the moves ran (failovers? a drain?); {} more moves would be planned:",
                after.len()
            );
            for c in &counts {
                eprintln!("  {c}");
            }
            for m in &after {
                eprintln!("  would move {}", describe(m));
            }
            return Ok(1);
        }
        println!(
            "round {round} made its moves, but leaders or replicas changed meanwhile (a \
             failover? a drain?); now {}; {} more moves planned:",
            counts.join("; "),
            after.len()
        );
        for m in &after {
            println!("  {}", describe(m));
        }
        plan = after;
    }
    unreachable!("the last round returns")
}

/// Makes `plan`'s moves [`REBALANCE_BATCH`] at a time, waiting for each batch; 1 (with
/// what is stuck printed) if a batch is still under way after `wait` or a move was rolled
/// back.
async fn make_moves(client: &Connection, plan: &[MoveInfo], wait: Duration) -> anyhow::Result<u8> {
    let mut rest = plan;
    while !rest.is_empty() {
        // One move per shard at a time: a batch ends before a shard's second move.
        let mut batch: Vec<&MoveInfo> = Vec::new();
        for m in rest {
            if batch.len() == REBALANCE_BATCH || batch.iter().any(|b| same_shard(b, m)) {
                break;
            }
            batch.push(m);
        }
        rest = &rest[batch.len()..];
        for m in &batch {
            client
                .move_shard(
                    &m.tenant,
                    &m.namespace,
                    &m.stream,
                    m.shard,
                    m.to,
                    Some(m.from),
                )
                .await
                .with_context(|| format!("moving {}", describe(m)))?;
        }
        let code = follow(client, wait, |_, moves| {
            let left = batch
                .iter()
                .filter(|m| moves.iter().any(|u| same_shard(u, m)))
                .count();
            println!(
                "{left} of a batch of {} moves under way; {} more planned",
                batch.len(),
                rest.len()
            );
            (left == 0).then_some(())
        })
        .await?;
        if code != 0 {
            return Ok(code);
        }
        // Ended is not done: a move whose destination died was rolled back.
        let mut failed = Vec::new();
        for m in &batch {
            let t = client
                .topology(&m.tenant, &m.namespace, &m.stream)
                .await
                .with_context(|| format!("checking {}", describe(m)))?;
            let route = t.shard(m.shard);
            let made =
                route.is_some_and(|r| r.replicas.contains(&m.to) && !r.replicas.contains(&m.from));
            if !made {
                failed.push(format!(
                    "{}: not made (replicas now {:?}, leader {:?}); rolled back, its destination \
                     probably died",
                    describe(m),
                    route.map(|r| r.replicas.clone()).unwrap_or_default(),
                    route.and_then(|r| r.leader)
                ));
            }
        }
        if !failed.is_empty() {
            eprintln!(
                "rebalance stopped: {} of its moves did not happen:",
                failed.len()
            );
            for f in &failed {
                eprintln!("  {f}");
            }
            return Ok(1);
        }
    }
    Ok(0)
}

/// Whether two moves are of the same shard.
fn same_shard(a: &MoveInfo, b: &MoveInfo) -> bool {
    a.tenant == b.tenant && a.namespace == b.namespace && a.stream == b.stream && a.shard == b.shard
}

fn describe(m: &MoveInfo) -> String {
    format!(
        "{}/{}/{} shard {} from broker {} to broker {}",
        m.tenant, m.namespace, m.stream, m.shard, m.from, m.to
    )
}

#[derive(Subcommand, Debug)]
pub(crate) enum ShardCommand {
    /// Moves a shard's replica to broker --to: the leader's (so leadership moves), or the
    /// one on broker --replace. Waits until the move is done.
    ///
    /// With --force, for a Leader stream's shard whose leader is dead: broker --to (one of
    /// its followers) leads from the end of its own copy at once, and whatever the dead
    /// leader acknowledged past that is lost (printed as a warning). Without it such a
    /// shard waits for its leader to return, as nothing else surely holds every record it
    /// acknowledged.
    Move {
        #[arg(value_name = "TENANT/NS/STREAM", value_parser = stream_path)]
        path: StreamPath,
        shard: u32,
        #[arg(long)]
        to: u64,
        #[arg(long, conflicts_with = "force")]
        replace: Option<u64>,
        /// Accept losing what a dead leader acknowledged past --to's copy.
        #[arg(long)]
        force: bool,
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        wait: Duration,
    },
}

pub(crate) async fn broker_command(client: &Connection, cmd: BrokerCommand) -> anyhow::Result<u8> {
    match cmd {
        BrokerCommand::List { output } => {
            let brokers = client.list_brokers().await.context("listing brokers")?;
            print_brokers(&brokers, output)?;
            Ok(0)
        }
        BrokerCommand::Remove { id } => {
            client
                .remove_broker(id)
                .await
                .with_context(|| format!("removing broker {id}"))?;
            println!("broker {id} removed");
            Ok(0)
        }
        BrokerCommand::Undrain { id } => {
            client
                .set_draining(id, false)
                .await
                .with_context(|| format!("undraining broker {id}"))?;
            println!("broker {id} takes shards again");
            Ok(0)
        }
        BrokerCommand::Drain { id, wait, no_wait } => {
            let known = client.list_brokers().await.context("listing brokers")?;
            if !known.iter().any(|b| b.id == id) {
                bail!("no broker {id} is registered");
            }
            client
                .set_draining(id, true)
                .await
                .with_context(|| format!("draining broker {id}"))?;
            println!("draining broker {id}");
            if no_wait {
                return Ok(0);
            }
            follow(client, wait, |brokers, moves| {
                let b = brokers.iter().find(|b| b.id == id)?;
                let here: Vec<&MoveInfo> = moves.iter().filter(|m| m.from == id).collect();
                println!(
                    "broker {id}: {} replicas, {} leaderships left; {} moves under way",
                    b.replicas,
                    b.leaders,
                    here.len()
                );
                (b.replicas == 0).then_some(())
            })
            .await
        }
    }
}

pub(crate) async fn shard_command(client: &Connection, cmd: ShardCommand) -> anyhow::Result<u8> {
    let ShardCommand::Move {
        path: (t, ns, s),
        shard,
        to,
        replace,
        force,
        wait,
    } = cmd;
    if force {
        let (generation, start, old) = client
            .force_shard_leader(&t, &ns, &s, shard, to)
            .await
            .with_context(|| format!("forcing {t}/{ns}/{s} shard {shard} onto broker {to}"))?;
        let old = old.map_or("the dead leader".to_owned(), |o| format!("broker {o}"));
        eprintln!(
            "WARNING: records {old} acknowledged at or after offset {start} of {t}/{ns}/{s} \
             shard {shard} are lost; they are cut from its copy if it returns"
        );
        println!(
            "broker {to} leads {t}/{ns}/{s} shard {shard} from offset {start} (generation {generation})"
        );
        return Ok(0);
    }
    client
        .move_shard(&t, &ns, &s, shard, to, replace)
        .await
        .with_context(|| format!("moving {t}/{ns}/{s} shard {shard} to broker {to}"))?;
    println!("moving {t}/{ns}/{s} shard {shard} to broker {to}");
    follow(client, wait, |_, moves| {
        let m = moves
            .iter()
            .find(|m| m.tenant == t && m.namespace == ns && m.stream == s && m.shard == shard);
        match m {
            Some(m) => {
                println!("{}", m.phase);
                None
            }
            None => Some(()),
        }
    })
    .await
}

/// Polls the brokers and moves every 500 ms until `done` says so or `wait` passes; prints
/// what is stuck then.
async fn follow(
    client: &Connection,
    wait: Duration,
    mut done: impl FnMut(&[BrokerInfo], &[MoveInfo]) -> Option<()>,
) -> anyhow::Result<u8> {
    let deadline = Instant::now() + wait;
    let mut moves = Vec::new();
    loop {
        // Read linearizably by the broker: an answer may be refused while the control plane
        // elects a leader, which is asked again until the deadline.
        let read = async {
            anyhow::Ok((
                client.list_brokers().await.context("listing brokers")?,
                client.list_moves().await.context("listing moves")?,
            ))
        };
        let brokers = match read.await {
            Ok((brokers, now)) => {
                moves = now;
                Some(brokers)
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("{e:#}; asking again");
                None
            }
            Err(e) => return Err(e),
        };
        if let Some(brokers) = brokers
            && done(&brokers, &moves).is_some()
        {
            println!("done");
            return Ok(0);
        }
        if Instant::now() >= deadline {
            eprintln!("not done after {wait:?}; moves under way:");
            for m in &moves {
                eprintln!(
                    "  {}/{}/{} shard {}: {} -> {} ({})",
                    m.tenant, m.namespace, m.stream, m.shard, m.from, m.to, m.phase
                );
            }
            return Ok(1);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn print_brokers(brokers: &[BrokerInfo], output: ListOutput) -> anyhow::Result<()> {
    match output {
        ListOutput::Json => println!("{}", serde_json::to_string(brokers)?),
        ListOutput::Text => {
            println!(
                "{:>4}  {:<22} {:<22} {:<10} {:<6} {:<9} {:>7} {:>8} {:>10}",
                "id",
                "quic_addr",
                "kafka_addr",
                "zone",
                "alive",
                "draining",
                "leaders",
                "replicas",
                "hot_bytes"
            );
            for b in brokers {
                println!(
                    "{:>4}  {:<22} {:<22} {:<10} {:<6} {:<9} {:>7} {:>8} {:>10}",
                    b.id,
                    b.quic_addr,
                    b.kafka_addr.as_deref().unwrap_or("-"),
                    b.zone.as_deref().unwrap_or("-"),
                    b.alive,
                    b.draining,
                    b.leaders,
                    b.replicas,
                    b.hot_bytes.map_or("-".to_owned(), |n| n.to_string())
                );
            }
        }
    }
    Ok(())
}
