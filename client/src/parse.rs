//! Parsing the textual forms users type: `TENANT/NS/STREAM` paths and subscription start
//! positions (`earliest`, `latest`, an offset, or `@` and a time).

use std::time::UNIX_EPOCH;

use felix_wire::protocol::StartAt;

use crate::error::ClientError;

/// Splits `TENANT/NS/STREAM` into its three names.
///
/// ```
/// let (t, ns, s) = felix_client::parse_stream_path("acme/prod/orders").unwrap();
/// assert_eq!((t.as_str(), ns.as_str(), s.as_str()), ("acme", "prod", "orders"));
/// assert!(felix_client::parse_stream_path("acme/prod").is_err());
/// ```
pub fn parse_stream_path(s: &str) -> Result<(String, String, String), ClientError> {
    let [t, ns, st] = split_path::<3>(s, "TENANT/NAMESPACE/STREAM")?;
    Ok((t, ns, st))
}

/// Splits `TENANT/NS` into its two names.
///
/// ```
/// let (t, ns) = felix_client::parse_namespace_path("acme/prod").unwrap();
/// assert_eq!((t.as_str(), ns.as_str()), ("acme", "prod"));
/// ```
pub fn parse_namespace_path(s: &str) -> Result<(String, String), ClientError> {
    let [t, ns] = split_path::<2>(s, "TENANT/NAMESPACE")?;
    Ok((t, ns))
}

fn split_path<const N: usize>(s: &str, shape: &str) -> Result<[String; N], ClientError> {
    let names: Vec<String> = s.split('/').map(str::to_owned).collect();
    if names.iter().any(|n| n.is_empty()) {
        return Err(ClientError::InvalidArgument(format!(
            "{s:?} is not of the form {shape}"
        )));
    }
    names
        .try_into()
        .map_err(|_| ClientError::InvalidArgument(format!("{s:?} is not of the form {shape}")))
}

/// Parses a subscription start position:
///
/// * `earliest`, `latest`;
/// * a number: that offset;
/// * `@` and an RFC 3339 time (`@2024-05-01T12:00:00Z`, `@2024-05-01T14:00:00+02:00`,
///   `@2024-05-01 12:00:00` read as UTC, `@2024-05-01` as its midnight UTC), or `@` and
///   milliseconds since the Unix epoch (`@1714564800000`): the first record at or after it.
///
/// ```
/// use felix_client::{parse_start_at, StartAt};
/// assert_eq!(parse_start_at("earliest").unwrap(), StartAt::Earliest);
/// assert_eq!(parse_start_at("42").unwrap(), StartAt::Offset(42));
/// assert_eq!(parse_start_at("@1970-01-01T00:00:01Z").unwrap(), StartAt::Timestamp(1000));
/// ```
pub fn parse_start_at(s: &str) -> Result<StartAt, ClientError> {
    let bad = |why: String| {
        ClientError::InvalidArgument(format!(
            "{s:?} is not a start position ({why}); expected earliest, latest, OFFSET or @TIME"
        ))
    };
    match s {
        "earliest" => return Ok(StartAt::Earliest),
        "latest" => return Ok(StartAt::Latest),
        _ => {}
    }
    if let Some(time) = s.strip_prefix('@') {
        return parse_time_ms(time).map(StartAt::Timestamp).map_err(bad);
    }
    s.parse::<u64>()
        .map(StartAt::Offset)
        .map_err(|e| bad(e.to_string()))
}

/// Milliseconds since the Unix epoch of an RFC 3339 time (with `Z`, a numeric offset, or
/// none, meaning UTC), a bare date, or a plain number of milliseconds.
pub(crate) fn parse_time_ms(s: &str) -> Result<i64, String> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<i64>().map_err(|e| e.to_string());
    }
    let (local, offset_secs) = split_utc_offset(s)?;
    let local = if local.len() == 10 {
        format!("{local}T00:00:00Z")
    } else {
        local.to_owned()
    };
    let t = humantime::parse_rfc3339_weak(&local).map_err(|e| e.to_string())?;
    let since = t
        .duration_since(UNIX_EPOCH)
        .map_err(|_| "times before 1970 are not supported".to_owned())?;
    let ms = i64::try_from(since.as_millis()).map_err(|_| "time too far away".to_owned())?;
    Ok(ms - offset_secs * 1000)
}

/// Splits a trailing `+HH:MM` / `-HH:MM` off a time; the offset is returned in seconds
/// (east of UTC positive).
fn split_utc_offset(s: &str) -> Result<(&str, i64), String> {
    let b = s.as_bytes();
    if b.len() > 16 && b[b.len() - 3] == b':' && matches!(b[b.len() - 6], b'+' | b'-') {
        let (local, off) = s.split_at(s.len() - 6);
        let hours: i64 = off[1..3].parse().map_err(|_| format!("bad offset {off}"))?;
        let minutes: i64 = off[4..6].parse().map_err(|_| format!("bad offset {off}"))?;
        if hours > 23 || minutes > 59 {
            return Err(format!("bad offset {off}"));
        }
        let secs = hours * 3600 + minutes * 60;
        return Ok((local, if off.starts_with('-') { -secs } else { secs }));
    }
    Ok((s, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_paths_need_exactly_three_non_empty_names() {
        assert_eq!(
            parse_stream_path("a/b/c").unwrap(),
            ("a".into(), "b".into(), "c".into())
        );
        for bad in ["", "a", "a/b", "a/b/c/d", "a//c", "/b/c", "a/b/"] {
            assert!(
                matches!(parse_stream_path(bad), Err(ClientError::InvalidArgument(_))),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn namespace_paths_need_exactly_two_non_empty_names() {
        assert_eq!(
            parse_namespace_path("a/b").unwrap(),
            ("a".into(), "b".into())
        );
        for bad in ["", "a", "a/b/c", "a/", "/b"] {
            assert!(parse_namespace_path(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn start_positions_parse_every_form() {
        assert_eq!(parse_start_at("earliest").unwrap(), StartAt::Earliest);
        assert_eq!(parse_start_at("latest").unwrap(), StartAt::Latest);
        assert_eq!(parse_start_at("0").unwrap(), StartAt::Offset(0));
        assert_eq!(
            parse_start_at("18446744073709551615").unwrap(),
            StartAt::Offset(u64::MAX)
        );
        assert_eq!(
            parse_start_at("@2024-05-01T12:00:00Z").unwrap(),
            StartAt::Timestamp(1_714_564_800_000)
        );
        assert_eq!(
            parse_start_at("@2024-05-01T12:00:00.250Z").unwrap(),
            StartAt::Timestamp(1_714_564_800_250)
        );
        assert_eq!(
            parse_start_at("@2024-05-01T14:00:00+02:00").unwrap(),
            StartAt::Timestamp(1_714_564_800_000)
        );
        assert_eq!(
            parse_start_at("@2024-05-01T10:30:00-01:30").unwrap(),
            StartAt::Timestamp(1_714_564_800_000)
        );
        assert_eq!(
            parse_start_at("@2024-05-01 12:00:00").unwrap(),
            StartAt::Timestamp(1_714_564_800_000)
        );
        assert_eq!(
            parse_start_at("@2024-05-01").unwrap(),
            StartAt::Timestamp(1_714_521_600_000)
        );
        assert_eq!(
            parse_start_at("@1714564800000").unwrap(),
            StartAt::Timestamp(1_714_564_800_000)
        );
    }

    #[test]
    fn bad_start_positions_are_invalid_arguments() {
        for bad in [
            "",
            "first",
            "-1",
            "1.5",
            "@",
            "@yesterday",
            "@2024-13-01T00:00:00Z",
        ] {
            assert!(
                matches!(parse_start_at(bad), Err(ClientError::InvalidArgument(_))),
                "{bad:?} accepted"
            );
        }
    }
}
