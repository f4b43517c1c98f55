// kafkajs (pure JavaScript, no librdkafka) as gateway/tests/broker/kafka_clients.rs drives it:
// one run creates a topic, produces records, consumes them through a consumer group, and
// asks for transactions. JSON on stdout. kafkajs is found through NODE_PATH (scripts/test.sh
// installs it under ~/.cache/felix/kafkajs). By hand:
//
//   NODE_PATH=~/.cache/felix/kafkajs/node_modules node kafka_js.js 127.0.0.1:9092 js-topic 10

const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic, countArg] = process.argv.slice(2);
const count = Number(countArg);

async function main() {
  const kafka = new Kafka({ clientId: "felix-kafkajs", brokers: [bootstrap], logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: 2 }], waitForLeaders: true });
  await admin.disconnect();

  const producer = kafka.producer();
  await producer.connect();
  const messages = [];
  for (let i = 0; i < count; i++) messages.push({ key: `key-${i}`, value: `value-${i}` });
  await producer.send({ topic, messages });
  await producer.disconnect();

  // A consumer group reads them all back and commits (kafkajs commits as it goes).
  const consumer = kafka.consumer({ groupId: `${topic}-group`, sessionTimeout: 10000, heartbeatInterval: 1000 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const records = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`only ${records.length} of ${count} records in 30 s`)), 30000);
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        records.push([partition, Number(message.offset), message.key.toString(), message.value.toString()]);
        if (records.length >= count) {
          clearTimeout(timer);
          resolve();
        }
      },
    }).catch(reject);
  });
  await consumer.disconnect();
  const committed = await (async () => {
    const a = kafka.admin();
    await a.connect();
    const offsets = await a.fetchOffsets({ groupId: `${topic}-group`, topics: [topic] });
    await a.disconnect();
    return offsets[0].partitions.reduce((sum, p) => sum + Math.max(0, Number(p.offset)), 0);
  })();

  // Transactions: Felix has none and must refuse at once with a non-retriable error.
  const tx = kafka.producer({ transactionalId: "felix-js-tx", maxInFlightRequests: 1, idempotent: true,
                               retry: { retries: 5 } });
  const started = Date.now();
  let refusal = { error: null };
  try {
    await tx.connect();
    const t = await tx.transaction();
    await t.abort();
  } catch (e) {
    const cause = e.cause || e;
    refusal = { error: cause.type || e.type || e.name, name: e.name, message: String(e.message),
                retriable: Boolean(e.retriable), seconds: (Date.now() - started) / 1000 };
  }
  await tx.disconnect().catch(() => {});
  process.stdout.write(JSON.stringify({ records, committed, transactions: refusal }) + "\n");
}

main().catch((e) => {
  process.stderr.write(`${e.stack || e}\n`);
  process.exit(1);
});
