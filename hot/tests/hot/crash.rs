//! Crash safety with real processes: a child process appends and prints every offset it was
//! told is committed; the test kills it with SIGKILL at random moments, reopens the log and
//! checks that every acknowledged batch is there with its exact bytes, and that nothing
//! after a torn tail is ever returned. The seed is printed; set FELIX_TEST_SEED to replay.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use felix_hot::{FsyncPolicy, LogConfig, ShardLog};
use felix_wire::batch::stamp_base_offset;
use felix_wire::{BatchBuilder, BatchIter, Compression, DecodedBatch, Record};

const CHILD_DIR_ENV: &str = "FELIX_CRASH_CHILD_DIR";
const CHILD_FSYNC_ENV: &str = "FELIX_CRASH_CHILD_FSYNC";
const CHILD_TEST: &str = "hot::crash::crash_child_appends_until_killed";
const WRITERS: u64 = 8;

fn config(fsync: &str) -> LogConfig {
    LogConfig {
        shard: "crash/test/stream/0".into(),
        // Small segments so kills also land during rolls and seals.
        segment_bytes: 48 * 1024,
        fsync: fsync.parse::<FsyncPolicy>().expect("valid fsync policy"),
        ..LogConfig::default()
    }
}

/// The batch a child appends for `seed`: its key names the seed, so the parent can rebuild
/// the exact bytes of any batch it finds in the log, acknowledged or not.
fn seeded_batch(seed: u64) -> Vec<u8> {
    let records = 1 + (seed % 7) as usize;
    let mut b = BatchBuilder::new(if seed.is_multiple_of(3) {
        Compression::Zstd
    } else {
        Compression::None
    });
    for i in 0..records {
        let len = 16 + ((seed.wrapping_mul(31) + i as u64) % 900) as usize;
        let fill = (seed as u8).wrapping_add(i as u8);
        b.push(Record {
            offset: 0,
            timestamp: 1_700_000_000_000 + seed as i64,
            key: Some(format!("seed={seed}").into_bytes().into()),
            value: Some(vec![fill; len].into()),
            headers: Vec::new(),
        });
    }
    b.build().expect("batch encodes")
}

fn seed_of(batch: &[u8]) -> u64 {
    let decoded = DecodedBatch::decode(batch, 1 << 24).expect("stored batch decodes");
    let key = decoded.records[0]
        .key
        .clone()
        .expect("child batches have keys");
    std::str::from_utf8(&key)
        .ok()
        .and_then(|k| k.strip_prefix("seed="))
        .and_then(|s| s.parse().ok())
        .expect("key names the seed")
}

/// Not a test on its own: the child process of the kill tests. It appends forever from
/// several tasks and prints `ack BASE LAST SEED` after each commit.
#[test]
#[ignore = "child process of the kill -9 tests; they run it"]
fn crash_child_appends_until_killed() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let fsync = std::env::var(CHILD_FSYNC_ENV).unwrap_or_else(|_| "on_commit".into());
    let start_seed: u64 = std::env::var("FELIX_CRASH_CHILD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let log = ShardLog::open(&dir, config(&fsync)).expect("child opens the log");
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                for n in 0u64.. {
                    let seed = start_seed + n * WRITERS + w;
                    let ticket = log
                        .append(seeded_batch(seed))
                        .await
                        .expect("append accepted");
                    let (base, last) = ticket.committed().await.expect("append committed");
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ack {base} {last} {seed}").expect("stdout");
                    out.flush().expect("stdout");
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Runs one child until it has acknowledged at least one more batch and a random extra
/// while, then SIGKILLs it. Returns the acks it printed in whole lines.
fn run_child_and_kill(
    dir: &Path,
    fsync: &str,
    first_seed: u64,
    rng: &mut Rng,
) -> Vec<(u64, u64, u64)> {
    let mut child = Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "--exact",
            CHILD_TEST,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_FSYNC_ENV, fsync)
        .env("FELIX_CRASH_CHILD_SEED", first_seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let parts: Vec<&str> = line.split_whitespace().collect();
            if let ["ack", base, last, seed] = parts[..]
                && let (Ok(b), Ok(l), Ok(s)) = (base.parse(), last.parse(), seed.parse())
            {
                let _ = tx.send((b, l, s));
            }
        }
    });
    let mut acks = Vec::new();
    // Wait for the child to be up and acknowledging, then let it run a random while.
    let deadline = Instant::now() + Duration::from_secs(60);
    while acks.is_empty() && Instant::now() < deadline {
        if let Ok(a) = rx.recv_timeout(Duration::from_millis(100)) {
            acks.push(a);
        }
    }
    assert!(!acks.is_empty(), "child acknowledged nothing within 60 s");
    std::thread::sleep(Duration::from_millis(5 + rng.next() % 250));
    child.kill().expect("SIGKILL the child");
    let _ = child.wait();
    reader.join().expect("reader thread");
    acks.extend(rx.try_iter());
    acks
}

/// Reopens the log and checks it against everything acknowledged so far.
fn check_log(dir: &Path, fsync: &str, acked: &BTreeMap<u64, (u64, u64)>) -> u64 {
    let log = ShardLog::open(dir, config(fsync)).expect("log reopens after SIGKILL");
    log.verify().expect("every stored batch passes its checks");
    let end = log.committed_offset();
    let mut found = BTreeMap::new();
    let mut offset = log.first_offset();
    let mut expected_next = offset;
    while offset < end {
        let read = log
            .read(offset, 256 * 1024, None)
            .expect("read after recovery");
        assert!(
            !read.batches.is_empty(),
            "read at {offset} below the end {end} returned nothing"
        );
        for item in BatchIter::new(&read.batches, usize::MAX) {
            let (header, bytes) = item.expect("returned batches are valid");
            let base = header.base_offset as u64;
            assert_eq!(
                base, expected_next,
                "offsets are dense: nothing skipped or repeated"
            );
            expected_next = header.last_offset() as u64 + 1;
            // Every batch in the log, acknowledged or not, is one the child wrote, byte for byte.
            let seed = seed_of(bytes);
            let mut expect = seeded_batch(seed);
            stamp_base_offset(&mut expect, base as i64);
            assert_eq!(
                bytes,
                &expect[..],
                "batch at {base} (seed {seed}) has the exact bytes appended"
            );
            found.insert(base, (header.last_offset() as u64, seed));
        }
        offset = read.next_offset;
    }
    for (base, (last, seed)) in acked {
        assert_eq!(
            found.get(base),
            Some(&(*last, *seed)),
            "acknowledged batch [{base}, {last}] (seed {seed}) survived SIGKILL"
        );
    }
    end
}

fn kill_loop(fsync: &str, rounds: usize) {
    let seed = std::env::var("FELIX_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            now.map_or(7, |d| d.as_nanos() as u64) ^ std::process::id() as u64
        });
    eprintln!("kill loop ({fsync}) seed {seed} (FELIX_TEST_SEED={seed} replays it)");
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut acked = BTreeMap::new();
    let mut next_seed = 1u64;
    for round in 0..rounds {
        let acks = run_child_and_kill(dir.path(), fsync, next_seed, &mut rng);
        for (base, last, s) in &acks {
            acked.insert(*base, (*last, *s));
        }
        // Seeds must not repeat across children, or a batch could be mistaken for another.
        next_seed += 1_000_000;
        let end = check_log(dir.path(), fsync, &acked);
        eprintln!(
            "round {round}: {} acks this round, {} in all, log end {end}",
            acks.len(),
            acked.len()
        );
    }
    assert!(acked.len() >= rounds, "every round acknowledged something");
}

#[test]
fn acked_record_survives_kill_9_under_on_commit() {
    kill_loop("on_commit", 12);
}

#[test]
fn committed_record_survives_kill_9_under_periodic_fsync() {
    // A process crash keeps what reached the page cache, so under `periodic` everything
    // committed (written) must survive too; a machine crash can lose the last interval
    // (docs/durability.md).
    kill_loop("periodic:50", 6);
}
