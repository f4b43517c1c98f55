//! The `nats-pubsub` scenario (feature `nats`): the `pubsub` load against NATS JetStream, for
//! bench/pubsub-vs-nats.sh.
//!
//! Setup: a fresh file-storage stream (one replica) on subject `bench.pubsub.<name>`, deleted
//! afterwards unless `--keep`.
//!
//! Load: the same driver as `pubsub` ([`drive`]). A publisher's "batch" is `--batch`
//! JetStream publishes sent back to back, then every PubAck awaited; each publisher keeps
//! `--inflight` such batches outstanding. A subscriber is an ordered push consumer
//! (deliver policy `new`, flow control and idle heartbeats, no acks), created before
//! publishing — JetStream's closest match to a Felix subscription from `latest`. Every
//! publisher and subscriber has its own connection.

use anyhow::{Context, bail};
use async_nats::Subject;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use clap::Args;
use futures::StreamExt;

use crate::common::{print_line, runtime, unique_name};
use crate::load::{BatchSender, LoadArgs, RecordReceiver, drive};

#[derive(Args, Debug, Clone)]
pub struct NatsArgs {
    /// The NATS server (JetStream enabled).
    #[arg(long, default_value = "127.0.0.1:4222")]
    server: String,
    /// Keep the benchmark stream afterwards instead of deleting it.
    #[arg(long)]
    keep: bool,
    #[command(flatten)]
    load: LoadArgs,
}

struct NatsSender {
    js: jetstream::Context,
    subject: Subject,
}

impl BatchSender for NatsSender {
    async fn send(&self, payloads: Vec<Bytes>) -> anyhow::Result<()> {
        let mut acks = Vec::with_capacity(payloads.len());
        for p in payloads {
            acks.push(self.js.publish(self.subject.clone(), p).await?);
        }
        for ack in acks {
            ack.await?;
        }
        Ok(())
    }
}

struct NatsReceiver {
    messages: consumer::push::Ordered,
}

impl RecordReceiver for NatsReceiver {
    async fn next(&mut self) -> anyhow::Result<Option<Bytes>> {
        match self.messages.next().await {
            Some(Ok(m)) => Ok(Some(m.message.payload)),
            Some(Err(e)) => Err(e).context("ordered consumer"),
            None => Ok(None),
        }
    }
}

pub fn run(args: NatsArgs) -> anyhow::Result<()> {
    args.load.check()?;
    let report = runtime()?.block_on(async {
        let load = &args.load;
        // Room for every publish in flight, so the client never holds a publish back itself.
        let max_acks = (load.publishers * load.inflight * load.batch).max(5_000);
        let connect = || async {
            let client = async_nats::ConnectOptions::new()
                .name("felix-bench")
                .subscription_capacity(256 * 1024)
                .connect(args.server.as_str())
                .await
                .with_context(|| format!("connect to NATS at {}", args.server))?;
            let js = jetstream::ContextBuilder::new()
                .max_ack_inflight(max_acks)
                .build(client.clone());
            anyhow::Ok((client, js))
        };
        let (admin_client, admin) = connect().await?;
        let name = unique_name("pubsub");
        let subject = format!("bench.pubsub.{name}");
        admin
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                storage: stream::StorageType::File,
                num_replicas: 1,
                ..Default::default()
            })
            .await
            .with_context(|| format!("create JetStream stream {name}"))?;

        let mut receivers = Vec::new();
        let mut clients = vec![admin_client.clone()];
        for _ in 0..load.fanout {
            let (client, js) = connect().await?;
            let consumer = js
                .get_stream(&name)
                .await?
                .create_consumer(consumer::push::OrderedConfig {
                    deliver_subject: client.new_inbox(),
                    deliver_policy: consumer::DeliverPolicy::New,
                    ..Default::default()
                })
                .await
                .context("create an ordered push consumer")?;
            let messages = consumer.messages().await.context("consume")?;
            receivers.push(NatsReceiver { messages });
            clients.push(client);
        }
        let mut senders = Vec::new();
        for _ in 0..load.publishers {
            let (client, js) = connect().await?;
            senders.push(NatsSender {
                js,
                subject: Subject::from(subject.clone()),
            });
            clients.push(client);
        }

        let measured = drive(load, senders, receivers).await?;

        if !args.keep {
            let deleted = admin
                .delete_stream(&name)
                .await
                .with_context(|| format!("delete JetStream stream {name}"))?;
            if !deleted.success {
                bail!("JetStream did not delete stream {name}");
            }
        }
        for c in clients {
            let _ = c.drain().await;
        }
        anyhow::Ok(load.report("nats-pubsub", "nats", name, measured))
    })?;
    print_line(&report)
}
