//! `felixctl publish`: records from stdin (a line each) or generated, batched up to a
//! frame, published with the acknowledgement asked for, and each acknowledgement printed.
//! A refused record is reported and the run goes on, unless the refusal would hit every
//! later record too (`stops_the_run`).

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use bytes::Bytes;
use felix_client::{AckMode, ClientError, Connection, Message, codes};
use felix_wire::protocol::DEFAULT_MAX_FRAME;
use tokio::sync::mpsc;

use crate::args::{Acks, Output, PublishArgs};
use crate::output::published_json;

/// One input record: its 1-based line (or generated record) number and payload.
pub(crate) struct Line {
    pub(crate) number: u64,
    pub(crate) payload: Bytes,
}

/// Strips the line terminator (`\n`, or `\r\n`) read with a line.
pub(crate) fn strip_newline(mut line: Vec<u8>) -> Vec<u8> {
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    line
}

/// The payload of generated record `n`: "record-N " padded with 'x' (or cut) to `size`.
pub(crate) fn generated_payload(n: u64, size: usize) -> Bytes {
    let mut p = format!("record-{n} ").into_bytes();
    p.resize(size, b'x');
    Bytes::from(p)
}

/// Feeds input records into a channel from a plain thread (so a blocked stdin read never
/// holds up the exit). An input error ends the feed with `Err`.
pub(crate) fn spawn_source(
    args: &PublishArgs,
    capacity: usize,
) -> mpsc::Receiver<Result<Line, String>> {
    let (tx, rx) = mpsc::channel(capacity);
    let generated = args.count.map(|count| (count, args.size.unwrap_or(100)));
    std::thread::spawn(move || match generated {
        Some((count, size)) => {
            for number in 1..=count {
                let line = Line {
                    number,
                    payload: generated_payload(number, size),
                };
                if tx.blocking_send(Ok(line)).is_err() {
                    return;
                }
            }
        }
        None => {
            let mut stdin = std::io::stdin().lock();
            let mut number = 0;
            loop {
                let mut buf = Vec::new();
                match stdin.read_until(b'\n', &mut buf) {
                    Ok(0) => return,
                    Ok(_) => {
                        number += 1;
                        let line = Line {
                            number,
                            payload: Bytes::from(strip_newline(buf)),
                        };
                        if tx.blocking_send(Ok(line)).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(format!("reading stdin: {e}")));
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// Whether a failed publish should stop the run: the connection is gone, or the stream
/// itself is refused (every later record would fail the same way). Per-record refusals and
/// transient ones are reported and the run goes on.
pub(crate) fn stops_the_run(e: &ClientError) -> bool {
    match e {
        ClientError::Broker(b) => !matches!(
            b.code,
            codes::RECORD_TOO_LARGE
                | codes::FRAME_TOO_LARGE
                | codes::INVALID_ARGUMENT
                | codes::BAD_REQUEST
                | codes::OVERLOADED
                | codes::QUORUM_TIMEOUT
                | codes::LEADERSHIP_LOST
                | codes::SHARD_UNAVAILABLE
        ),
        ClientError::InvalidArgument(_) => false,
        _ => true,
    }
}

/// Room for a batch's records in one frame, leaving space for the frame and batch headers
/// and per-record overhead.
pub(crate) const BATCH_BYTE_BUDGET: usize = DEFAULT_MAX_FRAME / 2;
/// Per-record bytes counted on top of key and payload.
pub(crate) const RECORD_OVERHEAD: usize = 32;
/// How often an `overloaded` publish is retried (after the broker's `retry_after_ms`).
pub(crate) const OVERLOAD_RETRIES: u32 = 5;

/// Progress on stderr once a second (only when stderr is a terminal).
pub(crate) fn spawn_progress(
    published: Arc<AtomicU64>,
    total: Option<u64>,
) -> Option<tokio::task::JoinHandle<()>> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let mut last = 0;
        loop {
            tick.tick().await;
            let now = published.load(Ordering::Relaxed);
            // One line, rewritten in place (carriage return, then clear to its end).
            eprint!("\r\x1b[2K{}", progress_line(now, now - last, total));
            last = now;
        }
    }))
}

/// What the progress line says: done (of the total, with --count), the rate over the last
/// second and, with a total, the time left at that rate.
pub(crate) fn progress_line(done: u64, per_sec: u64, total: Option<u64>) -> String {
    match total {
        Some(total) => {
            let eta = match (total.saturating_sub(done), per_sec) {
                (0, _) => "done".to_owned(),
                (_, 0) => "ETA unknown".to_owned(),
                (left, rate) => format!(
                    "ETA {}",
                    humantime::format_duration(Duration::from_secs(left.div_ceil(rate)))
                ),
            };
            format!(
                "felixctl: {done}/{total} records published ({:.0}%), {per_sec} records/s, {eta}",
                done as f64 * 100.0 / total.max(1) as f64
            )
        }
        None => format!("felixctl: {done} records published, {per_sec} records/s"),
    }
}

pub(crate) async fn publish(client: &Connection, args: PublishArgs) -> anyhow::Result<u8> {
    let (t, ns, s) = args.path.clone();
    let client = client.with_compression(args.compression);
    let (ack, batch_size) = match args.acks {
        Acks::None => (AckMode::None, args.batch_size as usize),
        Acks::Message => (AckMode::Batch, 1),
        Acks::Batch => (AckMode::Batch, args.batch_size as usize),
    };
    let key = args.key.clone().map(Bytes::from);
    let headers: Vec<(String, Bytes)> = args
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Bytes::from(v.clone())))
        .collect();
    let mut source = spawn_source(&args, batch_size.max(1024));
    let published = Arc::new(AtomicU64::new(0));
    let progress = spawn_progress(published.clone(), args.count);
    let started = Instant::now();
    let mut failed = 0u64;
    let mut stdout = std::io::stdout();
    let mut carry: Option<Line> = None;
    let mut input_error = None;
    let mut stopped = None;

    'run: loop {
        // Gather a batch: whatever is ready now, up to the record and byte limits.
        let first = match carry.take() {
            Some(line) => line,
            None => match source.recv().await {
                Some(Ok(line)) => line,
                Some(Err(e)) => {
                    input_error = Some(e);
                    break;
                }
                None => break,
            },
        };
        let record_bytes =
            |l: &Line| l.payload.len() + key.as_ref().map_or(0, |k| k.len()) + RECORD_OVERHEAD;
        let mut bytes = record_bytes(&first);
        let mut batch = vec![first];
        while batch.len() < batch_size {
            match source.try_recv() {
                Ok(Ok(line)) => {
                    let b = record_bytes(&line);
                    if bytes + b > BATCH_BYTE_BUDGET {
                        carry = Some(line);
                        break;
                    }
                    bytes += b;
                    batch.push(line);
                }
                Ok(Err(e)) => {
                    input_error = Some(e);
                    break;
                }
                Err(_) => break,
            }
        }

        let mut attempt = 0;
        let outcomes = loop {
            let messages: Vec<Message> = batch
                .iter()
                .map(|l| Message {
                    key: key.clone(),
                    payload: l.payload.clone(),
                    headers: headers.clone(),
                    timestamp: None,
                })
                .collect();
            let outcomes = match client
                .publish_batch_detailed(&t, &ns, &s, messages, ack)
                .await
            {
                Ok(o) => o,
                Err(e) => {
                    for l in &batch {
                        eprintln!("felixctl: line {}: not published: {e}", l.number);
                    }
                    failed += batch.len() as u64;
                    stopped = Some((e, batch.last().map_or(0, |l| l.number) + 1));
                    break 'run;
                }
            };
            let overloaded = outcomes
                .iter()
                .all(|o| matches!(&o.result, Err(e) if e.code() == Some(codes::OVERLOADED)));
            if overloaded && attempt < OVERLOAD_RETRIES {
                attempt += 1;
                let wait = outcomes
                    .iter()
                    .find_map(|o| o.result.as_ref().err().and_then(ClientError::retry_after))
                    .unwrap_or(Duration::from_millis(100));
                tokio::time::sleep(wait).await;
                continue;
            }
            break outcomes;
        };

        // (line, shard, offset) of each acknowledged record.
        let mut acked: Vec<(u64, u32, u64)> = Vec::new();
        let mut fatal = None;
        for outcome in outcomes {
            match outcome.result {
                Ok(Some(p)) => {
                    for (i, &idx) in outcome.indices.iter().enumerate() {
                        acked.push((batch[idx].number, p.shard, p.offset_of(i)));
                    }
                }
                Ok(None) => {
                    published.fetch_add(outcome.indices.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    let what = if e.outcome_unknown() {
                        "outcome unknown"
                    } else {
                        "not published"
                    };
                    for &idx in &outcome.indices {
                        eprintln!("felixctl: line {}: {what}: {e}", batch[idx].number);
                    }
                    failed += outcome.indices.len() as u64;
                    if stops_the_run(&e) && fatal.is_none() {
                        fatal = Some(e);
                    }
                }
            }
        }
        acked.sort_unstable();
        published.fetch_add(acked.len() as u64, Ordering::Relaxed);
        if args.output == Output::Jsonl && !acked.is_empty() {
            let mut out = String::with_capacity(acked.len() * 32);
            for &(line, shard, offset) in &acked {
                out.push_str(&published_json(shard, offset, line));
                out.push('\n');
            }
            if let Err(e) = stdout
                .write_all(out.as_bytes())
                .and_then(|_| stdout.flush())
            {
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(if failed > 0 { 1 } else { 0 });
                }
                return Err(anyhow!(e).context("writing stdout"));
            }
        }
        if let Some(e) = fatal {
            stopped = Some((e, batch.last().map_or(0, |l| l.number) + 1));
            break;
        }
        if input_error.is_some() {
            break;
        }
    }

    if let Some(p) = progress {
        p.abort();
        // End the progress line, so what follows starts on a line of its own.
        eprintln!();
    }
    let count = published.load(Ordering::Relaxed);
    let mut code = if failed > 0 { 1 } else { 0 };
    if let Some((e, next_line)) = stopped {
        eprintln!("felixctl: stopped after {e}; records from line {next_line} on were not sent");
        code = 1;
    }
    if let Some(e) = input_error {
        eprintln!("felixctl: {e}");
        code = 1;
    }
    if args.output == Output::Text {
        let secs = started.elapsed().as_secs_f64();
        let verb = if ack == AckMode::None {
            "sent (unacknowledged)"
        } else {
            "published"
        };
        println!(
            "{verb} {count} records to {t}/{ns}/{s} in {secs:.2} s ({:.0} records/s){}",
            count as f64 / secs.max(1e-9),
            if failed > 0 {
                format!("; {failed} failed")
            } else {
                String::new()
            }
        );
    }
    Ok(code)
}
