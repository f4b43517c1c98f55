//! Which object-store URLs Felix accepts: `file:///absolute/path`, `memory://[prefix]` and
//! `s3://bucket[/prefix]`. Invariant: a URL is checked whole (scheme, absolute path, S3
//! bucket naming rules, key prefix) before anything is opened, so a typo fails the
//! configuration check instead of the first upload.

use std::path::PathBuf;

use object_store::path::Path;

use super::StoreError;

const ACCEPTED_URLS: &str = "file:///absolute/path, memory:// or s3://bucket[/prefix]";

pub(super) enum Backend {
    File(PathBuf),
    Memory,
    S3 { bucket: String },
}

pub(super) struct StoreUrl {
    pub(super) backend: Backend,
    pub(super) prefix: Path,
}

/// Checks an object-store URL without opening anything (for configuration checks).
pub fn validate_url(url: &str) -> Result<(), StoreError> {
    parse_url(url).map(|_| ())
}

pub(super) fn parse_url(url: &str) -> Result<StoreUrl, StoreError> {
    let bad = |why: String| StoreError::BadUrl(format!("`{url}`: {why}"));
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(format!("not a URL; expected {ACCEPTED_URLS}")));
    };
    match scheme {
        "file" => {
            if !rest.starts_with('/') {
                return Err(bad(
                    "a file:// URL needs an absolute path: file:///abs/path".into(),
                ));
            }
            if rest.contains(['?', '#']) {
                return Err(bad("query strings and fragments are not supported".into()));
            }
            Ok(StoreUrl {
                backend: Backend::File(PathBuf::from(rest)),
                prefix: Path::default(),
            })
        }
        "memory" => Ok(StoreUrl {
            backend: Backend::Memory,
            prefix: parse_prefix(rest).map_err(bad)?,
        }),
        "s3" => {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket: expected s3://bucket[/prefix]".into()));
            }
            validate_bucket(bucket).map_err(bad)?;
            Ok(StoreUrl {
                backend: Backend::S3 {
                    bucket: bucket.to_string(),
                },
                prefix: parse_prefix(prefix).map_err(bad)?,
            })
        }
        other => Err(bad(format!(
            "unsupported scheme `{other}://`; expected {ACCEPTED_URLS}"
        ))),
    }
}

fn parse_prefix(prefix: &str) -> Result<Path, String> {
    if prefix.contains(['?', '#']) {
        return Err("query strings and fragments are not supported".into());
    }
    Path::parse(prefix.trim_matches('/')).map_err(|e| format!("bad key prefix: {e}"))
}

/// S3's bucket naming rules: 3–63 characters of lowercase letters, digits, `.` and `-`,
/// starting and ending with a letter or digit.
fn validate_bucket(bucket: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-';
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !(3..=63).contains(&bucket.len())
        || !bucket.chars().all(ok_char)
        || !ends_ok(bucket.chars().next())
        || !ends_ok(bucket.chars().last())
    {
        return Err(format!(
            "`{bucket}` is not a valid bucket name (3-63 lowercase letters, digits, `.` or `-`)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_strictly() {
        assert!(matches!(parse_url("ftp://x"), Err(StoreError::BadUrl(m)) if m.contains("s3://")));
        assert!(matches!(parse_url("s3://"), Err(StoreError::BadUrl(_))));
        assert!(matches!(
            parse_url("s3:///prefix"),
            Err(StoreError::BadUrl(_))
        ));
        assert!(matches!(
            parse_url("file://relative"),
            Err(StoreError::BadUrl(_))
        ));
        assert!(matches!(
            parse_url("/just/a/path"),
            Err(StoreError::BadUrl(_))
        ));
        assert!(matches!(
            parse_url("s3://Bad_Bucket"),
            Err(StoreError::BadUrl(_))
        ));
        let u = parse_url("s3://bucket/a/b/").unwrap();
        assert!(matches!(&u.backend, Backend::S3 { bucket } if bucket == "bucket"));
        assert_eq!(u.prefix.as_ref(), "a/b");
        let u = parse_url("file:///var/lib/felix").unwrap();
        assert!(
            matches!(&u.backend, Backend::File(p) if p == std::path::Path::new("/var/lib/felix"))
        );
        assert!(u.prefix.is_root());
        assert!(matches!(
            parse_url("memory://").unwrap().backend,
            Backend::Memory
        ));
    }
}
