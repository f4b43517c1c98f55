//! Resources and the patterns that name sets of them.
//!
//! Decides what a permission's pattern covers. A resource is a path of one to three
//! segments, `tenant`, `tenant/namespace` or `tenant/namespace/name` (a stream, a cache, a
//! group), or the cluster itself. A pattern is a path of the same shape in which a segment
//! may hold `*` wildcards. The rules, each with a unit test below:
//!
//! * `*` alone covers every resource, the cluster included; nothing else covers the cluster.
//! * Within a segment, `*` matches any run of characters (possibly empty) but never a `/`:
//!   `orders-*` matches `orders-eu` and `orders-`, not `orders` or `a/b`.
//! * A pattern whose last segment is exactly `*` covers the resource its other segments name
//!   and everything below it: `acme/*` covers `acme`, `acme/default` and
//!   `acme/default/orders`.
//! * Otherwise a pattern matches only resources with as many segments, each matched in turn:
//!   `acme/default` covers the namespace, not its streams; `acme/*/orders` covers `orders` in
//!   every namespace of `acme`.
//!
//! The invariant: matching never panics and never allocates per character, whatever the
//! input; a pattern is validated once, when parsed.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest pattern accepted, in bytes (three names of 255 bytes and their separators).
const MAX_PATTERN_LEN: usize = 3 * 255 + 2;

/// Something a permission is checked against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Cluster-wide operations (signing keys, role definitions).
    Cluster,
    /// A tenant, a namespace, or a named thing in a namespace.
    Path {
        tenant: String,
        namespace: Option<String>,
        name: Option<String>,
    },
}

impl Resource {
    pub fn tenant(tenant: &str) -> Resource {
        Resource::Path {
            tenant: tenant.to_owned(),
            namespace: None,
            name: None,
        }
    }
    pub fn namespace(tenant: &str, namespace: &str) -> Resource {
        Resource::Path {
            tenant: tenant.to_owned(),
            namespace: Some(namespace.to_owned()),
            name: None,
        }
    }
    /// A stream, a cache or a group: `tenant/namespace/name`.
    pub fn stream(tenant: &str, namespace: &str, name: &str) -> Resource {
        Resource::Path {
            tenant: tenant.to_owned(),
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
        }
    }

    /// The tenant the resource belongs to (`None` for the cluster).
    pub fn tenant_name(&self) -> Option<&str> {
        match self {
            Resource::Cluster => None,
            Resource::Path { tenant, .. } => Some(tenant),
        }
    }

    fn segments(&self) -> Vec<&str> {
        match self {
            Resource::Cluster => Vec::new(),
            Resource::Path {
                tenant,
                namespace,
                name,
            } => std::iter::once(tenant.as_str())
                .chain(namespace.as_deref())
                .chain(namespace.as_ref().and(name.as_deref()))
                .collect(),
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::Cluster => f.write_str("the cluster"),
            Resource::Path { .. } => f.write_str(&self.segments().join("/")),
        }
    }
}

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("a resource pattern cannot be empty")]
    Empty,
    #[error("a resource pattern is at most {MAX_PATTERN_LEN} bytes")]
    TooLong,
    #[error("a resource pattern has at most three segments: tenant/namespace/name")]
    TooManySegments,
    #[error("a resource pattern has an empty segment (two slashes, or one at an end)")]
    EmptySegment,
    #[error(
        "a resource pattern may hold letters, digits, '.', '_', '-' and the wildcard '*', not {0:?}"
    )]
    BadCharacter(char),
}

/// A set of resources: see the module's rules.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourcePattern(String);

impl ResourcePattern {
    /// Parses and validates a pattern.
    pub fn parse(s: &str) -> Result<ResourcePattern, PatternError> {
        if s.is_empty() {
            return Err(PatternError::Empty);
        }
        if s.len() > MAX_PATTERN_LEN {
            return Err(PatternError::TooLong);
        }
        let mut count = 0;
        for seg in s.split('/') {
            count += 1;
            if count > 3 {
                return Err(PatternError::TooManySegments);
            }
            if seg.is_empty() {
                return Err(PatternError::EmptySegment);
            }
            if let Some(c) = seg
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '*')))
            {
                return Err(PatternError::BadCharacter(c));
            }
        }
        Ok(ResourcePattern(s.to_owned()))
    }

    /// The pattern that covers everything of one tenant: `T/*`.
    pub fn tenant_wide(tenant: &str) -> ResourcePattern {
        ResourcePattern(format!("{tenant}/*"))
    }

    /// The pattern that covers everything: `*`.
    pub fn everything() -> ResourcePattern {
        ResourcePattern("*".to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the pattern covers `resource`.
    pub fn matches(&self, resource: &Resource) -> bool {
        if self.0 == "*" {
            return true;
        }
        let Resource::Path { .. } = resource else {
            return false;
        };
        let pat: Vec<&str> = self.0.split('/').collect();
        let res = resource.segments();
        let (last, head) = pat.split_last().expect("split yields at least one segment");
        if *last == "*" {
            // `prefix/*`: the prefix itself and everything below it.
            res.len() >= head.len() && head.iter().zip(&res).all(|(p, r)| glob(p, r))
        } else {
            pat.len() == res.len() && pat.iter().zip(&res).all(|(p, r)| glob(p, r))
        }
    }

    /// Whether the pattern covers `resource` or something below it: what "any permission on
    /// it" means for describing and listing (a grant on one stream lets its holder see the
    /// namespace and tenant that hold it, not their other contents).
    pub fn touches(&self, resource: &Resource) -> bool {
        if self.matches(resource) {
            return true;
        }
        let Resource::Path { .. } = resource else {
            return false;
        };
        let res = resource.segments();
        let pat: Vec<&str> = self.0.split('/').collect();
        pat.len() > res.len() && pat.iter().zip(&res).all(|(p, r)| glob(p, r))
    }
}

impl fmt::Display for ResourcePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for ResourcePattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ResourcePattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ResourcePattern::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Matches one segment against a glob in which `*` is any run of characters. Iterative with
/// one backtrack point, so linear-ish in the lengths and never recursive.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pat(s: &str) -> ResourcePattern {
        ResourcePattern::parse(s).unwrap()
    }

    #[test]
    fn star_alone_covers_every_resource_and_the_cluster() {
        let p = pat("*");
        assert!(p.matches(&Resource::Cluster));
        assert!(p.matches(&Resource::tenant("a")));
        assert!(p.matches(&Resource::stream("a", "b", "c")));
    }

    #[test]
    fn only_star_alone_covers_the_cluster() {
        assert!(!pat("a/*").matches(&Resource::Cluster));
        assert!(!pat("*/*").matches(&Resource::Cluster));
        assert!(!pat("a").matches(&Resource::Cluster));
    }

    #[test]
    fn a_star_inside_a_segment_matches_any_run_but_no_slash() {
        let p = pat("acme/default/orders-*");
        assert!(p.matches(&Resource::stream("acme", "default", "orders-eu")));
        assert!(p.matches(&Resource::stream("acme", "default", "orders-")));
        assert!(!p.matches(&Resource::stream("acme", "default", "orders")));
        assert!(!p.matches(&Resource::stream("acme", "default", "xorders-eu")));
        let q = pat("acme/default/*-eu");
        assert!(q.matches(&Resource::stream("acme", "default", "orders-eu")));
        assert!(!q.matches(&Resource::stream("acme", "default", "orders-us")));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
    }

    #[test]
    fn a_trailing_star_segment_covers_the_prefix_and_everything_below() {
        let p = pat("acme/*");
        assert!(p.matches(&Resource::tenant("acme")));
        assert!(p.matches(&Resource::namespace("acme", "default")));
        assert!(p.matches(&Resource::stream("acme", "default", "orders")));
        assert!(!p.matches(&Resource::tenant("acme2")));
        assert!(!p.matches(&Resource::stream("other", "default", "orders")));
        let q = pat("acme/default/*");
        assert!(q.matches(&Resource::namespace("acme", "default")));
        assert!(q.matches(&Resource::stream("acme", "default", "x")));
        assert!(!q.matches(&Resource::namespace("acme", "other")));
        assert!(!q.matches(&Resource::tenant("acme")));
    }

    #[test]
    fn other_patterns_match_only_resources_of_the_same_depth() {
        let p = pat("acme/default");
        assert!(p.matches(&Resource::namespace("acme", "default")));
        assert!(!p.matches(&Resource::stream("acme", "default", "orders")));
        assert!(!p.matches(&Resource::tenant("acme")));
        let q = pat("acme/*/orders");
        assert!(q.matches(&Resource::stream("acme", "x", "orders")));
        assert!(q.matches(&Resource::stream("acme", "y", "orders")));
        assert!(!q.matches(&Resource::stream("acme", "y", "orders2")));
        assert!(!q.matches(&Resource::namespace("acme", "y")));
        let t = pat("acme");
        assert!(t.matches(&Resource::tenant("acme")));
        assert!(!t.matches(&Resource::namespace("acme", "default")));
    }

    #[test]
    fn a_grant_below_a_resource_touches_it_but_not_its_siblings() {
        let p = pat("acme/default/orders");
        assert!(p.touches(&Resource::tenant("acme")));
        assert!(p.touches(&Resource::namespace("acme", "default")));
        assert!(p.touches(&Resource::stream("acme", "default", "orders")));
        assert!(!p.touches(&Resource::stream("acme", "default", "payments")));
        assert!(!p.touches(&Resource::namespace("acme", "other")));
        assert!(!p.touches(&Resource::tenant("other")));
        assert!(!p.touches(&Resource::Cluster));
    }

    #[test]
    fn malformed_patterns_are_refused_with_a_reason() {
        assert_eq!(ResourcePattern::parse(""), Err(PatternError::Empty));
        assert_eq!(
            ResourcePattern::parse("a/b/c/d"),
            Err(PatternError::TooManySegments)
        );
        assert_eq!(
            ResourcePattern::parse("a//c"),
            Err(PatternError::EmptySegment)
        );
        assert_eq!(
            ResourcePattern::parse("a/"),
            Err(PatternError::EmptySegment)
        );
        assert_eq!(
            ResourcePattern::parse("a/b c"),
            Err(PatternError::BadCharacter(' '))
        );
        assert_eq!(
            ResourcePattern::parse(&"x".repeat(MAX_PATTERN_LEN + 1)),
            Err(PatternError::TooLong)
        );
        assert!(serde_json::from_str::<ResourcePattern>("\"a//b\"").is_err());
    }
}
