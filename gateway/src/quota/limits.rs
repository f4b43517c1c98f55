//! Which publish rate each tenant gets on this broker: the defaults
//! (`tenant_publish_bytes_per_sec`, `tenant_publish_msgs_per_sec`) and the per-tenant
//! overrides of `tenant_publish_quotas`, read from the broker's own settings.
//!
//! The override format is comma-separated `TENANT=RATE` entries, where `RATE` is a byte
//! rate with its unit (`B/s`, `KB/s`, `MB/s`, `GB/s` in powers of 1000; `KiB/s`, `MiB/s`,
//! `GiB/s` in powers of 1024), a record rate (`msg/s`), or `unlimited` (neither kind
//! limited). A tenant named there takes its own rate for each kind it names and the
//! default for the other; a tenant may appear twice, once per kind.
//!
//! Invariant: a parsed limit is at least 1 a second, and each tenant names each kind at most
//! once; anything else is refused with the setting named, so a broker never starts with a
//! quota it did not understand.

use std::collections::HashMap;

/// The two kinds of publish rate, each unlimited (`None`) or a positive rate a second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rates {
    /// Record-batch bytes a second.
    pub bytes: Option<u64>,
    /// Records a second.
    pub records: Option<u64>,
}

impl Rates {
    pub fn is_unlimited(&self) -> bool {
        self.bytes.is_none() && self.records.is_none()
    }
}

/// A tenant's override: for each kind, whether it names one (`Some`) and what.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Override {
    bytes: Option<Option<u64>>,
    records: Option<Option<u64>>,
}

/// Every tenant's publish rates on this broker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaLimits {
    defaults: Rates,
    overrides: HashMap<String, Override>,
}

/// A setting that could not be read: which one, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitError {
    pub setting: &'static str,
    pub message: String,
}

fn refuse(setting: &'static str, message: impl Into<String>) -> LimitError {
    LimitError {
        setting,
        message: message.into(),
    }
}

impl QuotaLimits {
    /// Reads the three settings (each unset when `None`).
    pub fn parse(
        bytes_per_sec: Option<&str>,
        msgs_per_sec: Option<&str>,
        quotas: Option<&str>,
    ) -> Result<QuotaLimits, LimitError> {
        const BYTES: &str = "tenant_publish_bytes_per_sec";
        const MSGS: &str = "tenant_publish_msgs_per_sec";
        const QUOTAS: &str = "tenant_publish_quotas";
        let defaults = Rates {
            bytes: match bytes_per_sec {
                Some(s) => parse_default(s, Kind::Bytes).map_err(|m| refuse(BYTES, m))?,
                None => None,
            },
            records: match msgs_per_sec {
                Some(s) => parse_default(s, Kind::Records).map_err(|m| refuse(MSGS, m))?,
                None => None,
            },
        };
        let mut overrides: HashMap<String, Override> = HashMap::new();
        for entry in quotas
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (tenant, rate) = entry
                .split_once('=')
                .map(|(t, r)| (t.trim(), r.trim()))
                .ok_or_else(|| refuse(QUOTAS, format!("entry {entry:?} is not TENANT=RATE")))?;
            if tenant.is_empty() || tenant.contains(char::is_whitespace) {
                return Err(refuse(QUOTAS, format!("entry {entry:?} names no tenant")));
            }
            let o = overrides.entry(tenant.to_owned()).or_default();
            let twice = || refuse(QUOTAS, format!("tenant {tenant} names a rate kind twice"));
            if rate.eq_ignore_ascii_case("unlimited") {
                if o.bytes.is_some() || o.records.is_some() {
                    return Err(twice());
                }
                o.bytes = Some(None);
                o.records = Some(None);
                continue;
            }
            let (kind, value) =
                parse_rate(rate).map_err(|m| refuse(QUOTAS, format!("tenant {tenant}: {m}")))?;
            let slot = match kind {
                Kind::Bytes => &mut o.bytes,
                Kind::Records => &mut o.records,
            };
            if slot.is_some() {
                return Err(twice());
            }
            *slot = Some(Some(value));
        }
        Ok(QuotaLimits {
            defaults,
            overrides,
        })
    }

    /// Whether no tenant has any limit (the broker then skips the buckets altogether).
    pub fn is_unlimited(&self) -> bool {
        self.defaults.is_unlimited()
            && self.overrides.values().all(|o| {
                matches!(o.bytes, None | Some(None)) && matches!(o.records, None | Some(None))
            })
    }

    /// `tenant`'s rates: its override for each kind it names, else the default.
    pub fn of(&self, tenant: &str) -> Rates {
        let o = self.overrides.get(tenant).copied().unwrap_or_default();
        Rates {
            bytes: o.bytes.unwrap_or(self.defaults.bytes),
            records: o.records.unwrap_or(self.defaults.records),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bytes,
    Records,
}

/// A default setting: a plain number, the same with its unit, or `unlimited`.
fn parse_default(s: &str, kind: Kind) -> Result<Option<u64>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    if let Ok(n) = s.parse::<u64>() {
        return positive(n).map(Some);
    }
    match parse_rate(s)? {
        (k, n) if k == kind => Ok(Some(n)),
        _ => Err(format!(
            "{s:?} is a rate of the other kind (this setting takes {})",
            match kind {
                Kind::Bytes => "bytes: e.g. 1048576, 1MiB/s",
                Kind::Records => "records: e.g. 5000, 5000msg/s",
            }
        )),
    }
}

fn positive(n: u64) -> Result<u64, String> {
    if n == 0 {
        Err("must be at least 1 a second (leave it unset, or say unlimited, for no limit)".into())
    } else {
        Ok(n)
    }
}

/// `N<unit>/s` (the `/s` may be left off): a byte rate with `B`, `KB`, `MB`, `GB`, `KiB`,
/// `MiB`, `GiB`, or a record rate with `msg`/`msgs`. `N` may have a fraction (`1.5MiB/s`).
fn parse_rate(s: &str) -> Result<(Kind, u64), String> {
    let bad =
        || format!("{s:?} is not a rate: say e.g. 1MiB/s, 500KB/s, 100B/s, 5000msg/s or unlimited");
    let body = s.trim();
    let body = body.strip_suffix("/s").unwrap_or(body).trim();
    let split = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (number, unit) = body.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let (kind, scale) = match unit.trim().to_ascii_lowercase().as_str() {
        "b" => (Kind::Bytes, 1.0),
        "kb" => (Kind::Bytes, 1e3),
        "mb" => (Kind::Bytes, 1e6),
        "gb" => (Kind::Bytes, 1e9),
        "kib" => (Kind::Bytes, 1024.0),
        "mib" => (Kind::Bytes, 1024.0 * 1024.0),
        "gib" => (Kind::Bytes, 1024.0 * 1024.0 * 1024.0),
        "msg" | "msgs" => (Kind::Records, 1.0),
        _ => return Err(bad()),
    };
    let value = (number * scale).round();
    if !value.is_finite() || value > u64::MAX as f64 {
        return Err(bad());
    }
    Ok((kind, positive(value as u64)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_take_plain_numbers_units_or_unlimited() {
        let l = QuotaLimits::parse(Some("1MiB/s"), Some("5000"), None).unwrap();
        assert_eq!(
            l.of("anyone"),
            Rates {
                bytes: Some(1 << 20),
                records: Some(5000)
            }
        );
        let l = QuotaLimits::parse(Some("1048576"), Some("200msg/s"), None).unwrap();
        assert_eq!(l.of("x").bytes, Some(1 << 20));
        assert_eq!(l.of("x").records, Some(200));
        assert!(
            QuotaLimits::parse(Some("unlimited"), None, None)
                .unwrap()
                .is_unlimited()
        );
        assert!(QuotaLimits::parse(None, None, None).unwrap().is_unlimited());
    }

    #[test]
    fn an_override_replaces_only_the_kinds_it_names() {
        let l = QuotaLimits::parse(
            Some("100KB/s"),
            Some("1000"),
            Some("acme=1MiB/s, acme=5000msg/s,free-tier=10KiB/s,vip=unlimited"),
        )
        .unwrap();
        assert_eq!(l.of("acme").bytes, Some(1 << 20));
        assert_eq!(l.of("acme").records, Some(5000));
        assert_eq!(l.of("free-tier").bytes, Some(10 * 1024));
        assert_eq!(l.of("free-tier").records, Some(1000), "the default");
        assert!(l.of("vip").is_unlimited());
        assert_eq!(l.of("other").bytes, Some(100_000));
        assert_eq!(l.of("other").records, Some(1000));
        assert!(!l.is_unlimited());
        let only_overrides = QuotaLimits::parse(None, None, Some("a=1.5MB/s")).unwrap();
        assert_eq!(only_overrides.of("a").bytes, Some(1_500_000));
        assert!(only_overrides.of("b").is_unlimited());
    }

    #[test]
    fn bad_values_are_refused_naming_the_setting() {
        /// The three settings, and the one the error must name.
        type Case<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>, &'a str);
        let cases: &[Case<'_>] = &[
            (Some("fast"), None, None, "tenant_publish_bytes_per_sec"),
            (Some("0"), None, None, "tenant_publish_bytes_per_sec"),
            (Some("10msg/s"), None, None, "tenant_publish_bytes_per_sec"),
            (None, Some("1MiB/s"), None, "tenant_publish_msgs_per_sec"),
            (None, Some("-3"), None, "tenant_publish_msgs_per_sec"),
            (None, None, Some("acme"), "tenant_publish_quotas"),
            (None, None, Some("acme=100"), "tenant_publish_quotas"),
            (
                None,
                None,
                Some("acme=1MiB/s,acme=2MiB/s"),
                "tenant_publish_quotas",
            ),
            (
                None,
                None,
                Some("acme=unlimited,acme=5msg/s"),
                "tenant_publish_quotas",
            ),
            (None, None, Some("=1MiB/s"), "tenant_publish_quotas"),
            (None, None, Some("acme=0msg/s"), "tenant_publish_quotas"),
            (None, None, Some("acme=1TiB/s"), "tenant_publish_quotas"),
        ];
        for (bytes, msgs, quotas, setting) in cases {
            let e = QuotaLimits::parse(*bytes, *msgs, *quotas)
                .expect_err(&format!("{bytes:?} {msgs:?} {quotas:?}"));
            assert_eq!(e.setting, *setting, "{e:?}");
        }
    }
}
