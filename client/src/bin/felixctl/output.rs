//! How felixctl prints what it gets: stream descriptions, segment listings, publish
//! acknowledgements and events, as text or JSON lines. Nothing here talks to a broker.

use std::io::Write;

use anyhow::Context;
use base64::Engine as _;
use felix_client::Event;
use serde::Serialize;

use crate::args::{Output, PayloadEncoding};

pub(crate) fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("formatting JSON")?;
    println!("{text}");
    Ok(())
}

/// Streams (one, or a list) as JSON for a person or a script: "no limit" shown as `null`,
/// not as the wire's u64::MAX, which jq and JavaScript round (felix_wire::user_json).
pub(crate) fn stream_json<T: Serialize>(streams: &T) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(streams)?;
    felix_wire::user_json::stream_for_user(&mut v);
    Ok(v)
}

/// The stream as JSON, with the figures an operator asks for computed: per shard the
/// upload lag (records committed but not yet in recorded objects), and the broker's cold
/// cache hit rate.
pub(crate) fn describe_json(info: &felix_client::StreamInfo) -> anyhow::Result<serde_json::Value> {
    let mut v = stream_json(info)?;
    if let Some(shards) = v.get_mut("shards").and_then(|s| s.as_array_mut()) {
        for (json, shard) in shards.iter_mut().zip(&info.shards) {
            let lag = if info.config.tiered == Some(true) {
                shard.next_offset.saturating_sub(shard.uploaded_end)
            } else {
                0
            };
            json["upload_lag_records"] = lag.into();
        }
    }
    let lookups = info.cache_hits + info.cache_misses;
    v["cache_hit_rate"] = if lookups > 0 {
        (info.cache_hits as f64 / lookups as f64).into()
    } else {
        serde_json::Value::Null
    };
    Ok(v)
}

pub(crate) fn print_segments(
    segments: &[felix_client::SegmentInfo],
    output: Output,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match output {
        Output::Jsonl => {
            for s in segments {
                writeln!(out, "{}", serde_json::to_string(s)?)?;
            }
        }
        Output::Text => {
            writeln!(
                out,
                "{:>5} {:>20} {:>20} {:<24} {:<24} {:>9} {:>12} {:<5}  OBJECT",
                "SHARD", "BASE", "LAST", "FIRST TIME", "LAST TIME", "TIER", "BYTES", "LOCAL"
            )?;
            for s in segments {
                writeln!(
                    out,
                    "{:>5} {:>20} {:>20} {:<24} {:<24} {:>9} {:>12} {:<5}  {}",
                    s.shard,
                    s.base_offset,
                    s.last_offset,
                    utc_millis(s.min_timestamp),
                    utc_millis(s.max_timestamp),
                    s.tier,
                    s.size_bytes,
                    if s.local { "yes" } else { "no" },
                    s.object_key.as_deref().unwrap_or("-")
                )?;
            }
        }
    }
    Ok(())
}

/// A record timestamp (milliseconds since the epoch) as RFC 3339 UTC with milliseconds, or
/// the number itself when it is not a time (before 1970, or past year 9999).
pub(crate) fn utc_millis(ms: i64) -> String {
    u64::try_from(ms)
        .ok()
        .map(|ms| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
        .filter(|t| *t < std::time::UNIX_EPOCH + std::time::Duration::from_secs(253_402_300_800))
        .map(|t| humantime::format_rfc3339_millis(t).to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// `{"shard":..,"offset":..,"line":N}`: offsets are per shard, so a script pairing
/// acknowledgements with records needs both.
#[derive(Serialize)]
pub(crate) struct PublishedLine {
    pub(crate) shard: u32,
    pub(crate) offset: u64,
    pub(crate) line: u64,
}

pub(crate) fn published_json(shard: u32, offset: u64, line: u64) -> String {
    serde_json::to_string(&PublishedLine {
        shard,
        offset,
        line,
    })
    .unwrap_or_default()
}

/// `{"shard":..,"offset":..,"timestamp":..,"key":..,"payload":..,"headers":[..]}`.
#[derive(Serialize)]
pub(crate) struct EventLine<'a> {
    pub(crate) shard: u32,
    pub(crate) offset: u64,
    pub(crate) timestamp: i64,
    pub(crate) key: Option<std::borrow::Cow<'a, str>>,
    pub(crate) payload: std::borrow::Cow<'a, str>,
    /// In record order, duplicates kept: `{"key":..,"value":..}`, the value encoded as the
    /// payload is.
    pub(crate) headers: Vec<HeaderLine<'a>>,
}

#[derive(Serialize)]
pub(crate) struct HeaderLine<'a> {
    pub(crate) key: &'a str,
    pub(crate) value: std::borrow::Cow<'a, str>,
}

pub(crate) fn encode_bytes(b: &[u8], encoding: PayloadEncoding) -> std::borrow::Cow<'_, str> {
    match encoding {
        PayloadEncoding::Utf8 => String::from_utf8_lossy(b),
        PayloadEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(b).into(),
    }
}

pub(crate) fn event_json(shard: u32, event: &Event, encoding: PayloadEncoding) -> String {
    serde_json::to_string(&EventLine {
        shard,
        offset: event.offset,
        timestamp: event.timestamp,
        key: event.key.as_deref().map(|k| encode_bytes(k, encoding)),
        payload: encode_bytes(&event.payload, encoding),
        headers: event
            .headers
            .iter()
            .map(|(key, value)| HeaderLine {
                key,
                value: encode_bytes(value, encoding),
            })
            .collect(),
    })
    .unwrap_or_default()
}

/// One printed record (text: the payload and a newline).
pub(crate) fn format_event(
    shard: u32,
    event: &Event,
    output: Output,
    encoding: PayloadEncoding,
) -> Vec<u8> {
    let mut out = match (output, encoding) {
        (Output::Jsonl, _) => event_json(shard, event, encoding).into_bytes(),
        (Output::Text, PayloadEncoding::Utf8) => event.payload.to_vec(),
        (Output::Text, PayloadEncoding::Base64) => encode_bytes(&event.payload, encoding)
            .into_owned()
            .into_bytes(),
    };
    out.push(b'\n');
    out
}
