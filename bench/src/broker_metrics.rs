//! The broker's `/metrics`, read around a benchmark phase: what the object store and the
//! cache did meanwhile, and the broker's own upload lag histogram.
//!
//! Decides how figures are taken from counters: as the difference between a scrape before
//! and one after the phase (counters never fall; a negative difference, after a restart,
//! counts as 0), and a histogram's quantiles as the upper bound of the bucket they fall in.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

/// The broker's `/metrics`, as sample name (with labels) → value.
pub(crate) struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }

    /// `(upper bound, cumulative count)` of a histogram's buckets, `+Inf` last.
    fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let prefix = format!("{name}_bucket{{le=\"");
        let mut out: Vec<(f64, f64)> = self
            .0
            .iter()
            .filter_map(|(k, v)| {
                let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, *v))
            })
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// A plain HTTP/1.0 GET of `http://{admin}/metrics` (no client library needed for one page).
pub(crate) fn scrape(admin: &str) -> anyhow::Result<Scrape> {
    let mut conn = TcpStream::connect(admin)
        .with_context(|| format!("connect to the admin address {admin}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: {admin}\r\n\r\n")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)
        .with_context(|| format!("read http://{admin}/metrics"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of headers in the /metrics response")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!(
            "GET http://{admin}/metrics: {}",
            head.lines().next().unwrap_or("")
        );
    }
    let mut samples = BTreeMap::new();
    for line in body.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some((name, value)) = line.rsplit_once(' ')
            && let Ok(v) = value.parse::<f64>()
        {
            samples.insert(name.to_owned(), v);
        }
    }
    Ok(Scrape(samples))
}

/// Object-store traffic between two scrapes.
#[derive(Serialize, Default)]
pub(crate) struct StoreDelta {
    pub(crate) get_requests: u64,
    pub(crate) get_bytes: u64,
    pub(crate) put_requests: u64,
    pub(crate) cache_hits: u64,
    pub(crate) cache_misses: u64,
    pub(crate) uploaded_objects: u64,
    pub(crate) uploaded_bytes: u64,
    pub(crate) upload_errors: u64,
}

impl StoreDelta {
    pub(crate) fn between(before: &Scrape, after: &Scrape) -> StoreDelta {
        let d = |name: &str| (after.get(name) - before.get(name)).max(0.0) as u64;
        StoreDelta {
            get_requests: d("felix_tier_store_get_requests_total"),
            get_bytes: d("felix_tier_store_get_bytes_total"),
            put_requests: d("felix_tier_store_put_requests_total"),
            cache_hits: d("felix_cold_cache_hits_total"),
            cache_misses: d("felix_cold_cache_misses_total"),
            uploaded_objects: d("felix_tier_uploaded_objects_total"),
            uploaded_bytes: d("felix_tier_uploaded_bytes_total"),
            upload_errors: d("felix_tier_upload_errors_total"),
        }
    }
}

const LAG: &str = "felix_tier_upload_lag_seconds";

/// Seal-to-record lag observed between two scrapes. Quantiles are bucket upper bounds
/// (`None` past the last finite bound).
#[derive(Serialize, Default)]
pub(crate) struct LagFigures {
    count: u64,
    mean_seconds: Option<f64>,
    p50_le_seconds: Option<f64>,
    p99_le_seconds: Option<f64>,
    max_le_seconds: Option<f64>,
    /// `(upper bound, observations in this bucket)`, empty buckets left out.
    buckets: Vec<(String, u64)>,
}

impl LagFigures {
    pub(crate) fn between(before: &Scrape, after: &Scrape) -> LagFigures {
        let b0 = before.buckets(LAG);
        let b1 = after.buckets(LAG);
        let count = (after.get(&format!("{LAG}_count")) - before.get(&format!("{LAG}_count")))
            .max(0.0) as u64;
        let sum = after.get(&format!("{LAG}_sum")) - before.get(&format!("{LAG}_sum"));
        // Cumulative counts in the window, per upper bound.
        let cum: Vec<(f64, f64)> = b1
            .iter()
            .map(|(le, v)| {
                let was = b0.iter().find(|(l, _)| l == le).map_or(0.0, |(_, v0)| *v0);
                (*le, v - was)
            })
            .collect();
        let quantile = |q: f64| -> Option<f64> {
            if count == 0 {
                return None;
            }
            let target = q * count as f64;
            cum.iter()
                .find(|(_, c)| *c >= target - 1e-9)
                .map(|(le, _)| *le)
                .filter(|le| le.is_finite())
        };
        let mut buckets = Vec::new();
        let mut prev = 0.0;
        for (le, c) in &cum {
            let n = (c - prev).max(0.0) as u64;
            prev = *c;
            if n > 0 {
                let name = if le.is_finite() {
                    format!("{le}")
                } else {
                    "+Inf".to_owned()
                };
                buckets.push((name, n));
            }
        }
        LagFigures {
            count,
            mean_seconds: (count > 0).then(|| sum / count as f64),
            p50_le_seconds: quantile(0.50),
            p99_le_seconds: quantile(0.99),
            max_le_seconds: quantile(1.0),
            buckets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape_of(text: &str) -> Scrape {
        let mut m = BTreeMap::new();
        for line in text.lines() {
            let (k, v) = line.rsplit_once(' ').unwrap();
            m.insert(k.to_owned(), v.parse().unwrap());
        }
        Scrape(m)
    }

    #[test]
    fn lag_quantiles_are_bucket_bounds_of_the_window() {
        let before = scrape_of(
            "felix_tier_upload_lag_seconds_bucket{le=\"0.5\"} 10\n\
             felix_tier_upload_lag_seconds_bucket{le=\"1.0\"} 10\n\
             felix_tier_upload_lag_seconds_bucket{le=\"+Inf\"} 10\n\
             felix_tier_upload_lag_seconds_count 10\n\
             felix_tier_upload_lag_seconds_sum 2.0",
        );
        let after = scrape_of(
            "felix_tier_upload_lag_seconds_bucket{le=\"0.5\"} 108\n\
             felix_tier_upload_lag_seconds_bucket{le=\"1.0\"} 109\n\
             felix_tier_upload_lag_seconds_bucket{le=\"+Inf\"} 110\n\
             felix_tier_upload_lag_seconds_count 110\n\
             felix_tier_upload_lag_seconds_sum 52.0",
        );
        let lag = LagFigures::between(&before, &after);
        assert_eq!(lag.count, 100);
        assert_eq!(lag.mean_seconds, Some(0.5));
        assert_eq!(lag.p50_le_seconds, Some(0.5));
        assert_eq!(lag.p99_le_seconds, Some(1.0));
        assert_eq!(
            lag.max_le_seconds, None,
            "one observation past the last bound"
        );
        assert_eq!(
            lag.buckets,
            vec![
                ("0.5".to_owned(), 98),
                ("1".to_owned(), 1),
                ("+Inf".to_owned(), 1)
            ]
        );
    }
}
