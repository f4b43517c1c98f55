//! Times reading a whole local log back, for comparing builds of the read path (issue 19:
//! the offset-continuity checks). Writes `BATCHES` batches of 10 records of 100 bytes to a
//! temporary log, then reads it from offset 0 in 1 MiB reads, `REPS` times, and prints the
//! best and median MB/s. Release only: `cargo run --release -p felix-hot --example read_cost`.

use std::time::Instant;

use felix_hot::{LogConfig, ShardLog};
use felix_wire::{BatchBuilder, Compression, Record};

fn main() {
    let batches: u64 = std::env::var("BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let dir = tempfile::tempdir().expect("temp dir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let log = rt.block_on(async {
        let log = ShardLog::open(
            dir.path(),
            LogConfig {
                shard: "read-cost".into(),
                ..LogConfig::default()
            },
        )
        .expect("open");
        for i in 0..batches {
            let mut b = BatchBuilder::new(Compression::None);
            for r in 0..10u64 {
                b.push(Record::value(1_700_000_000_000, vec![(i + r) as u8; 100]));
            }
            log.append(b.build().expect("batch")).await.expect("append");
        }
        log.sync().await.expect("sync");
        log
    });
    let end = log.next_offset();
    let mut rates = Vec::new();
    for _ in 0..reps {
        let started = Instant::now();
        let (mut at, mut bytes) = (0u64, 0usize);
        while at < end {
            let read = log.read(at, 1 << 20, None).expect("read");
            bytes += read.batches.len();
            at = read.next_offset;
        }
        rates.push(bytes as f64 / started.elapsed().as_secs_f64() / 1e6);
    }
    rates.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    println!(
        "{{\"records\":{end},\"best_mb_s\":{:.1},\"median_mb_s\":{:.1}}}",
        rates[rates.len() - 1],
        rates[rates.len() / 2]
    );
}
