//! The control-plane membership a node is given (`cluster`): `ID=HOST:PORT` entries, as a
//! flag or variable string or as a TOML table, and the listen address it implies.
//!
//! Invariant: a parsed cluster has numeric ids, each once, and every address has a
//! non-empty host and a port; a peer address may name a host, a listen address may not.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::{ConfigError, invalid};

/// Parses `1=HOST:PORT,2=HOST:PORT`; an empty string is an empty cluster (one node).
pub fn parse_cluster(s: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("cluster member {part:?} is not ID=HOST:PORT"))?;
        insert_member(&mut out, id, addr)?;
    }
    Ok(out)
}

fn insert_member(out: &mut BTreeMap<u64, String>, id: &str, addr: &str) -> Result<(), String> {
    let id: u64 = id
        .trim()
        .parse()
        .map_err(|_| format!("cluster node id {:?} is not a number", id.trim()))?;
    let addr = addr.trim();
    check_host_port(addr).map_err(|e| format!("cluster member {id}: {e}"))?;
    if out.insert(id, addr.to_owned()).is_some() {
        return Err(format!("cluster node id {id} appears twice"));
    }
    Ok(())
}

/// A peer address may name a host; it needs a non-empty host and a port.
pub(super) fn check_host_port(addr: &str) -> Result<(), String> {
    let bad = || format!("address {addr:?} is not HOST:PORT");
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains(char::is_whitespace) || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(())
}

/// The default `internal_addr`: this node's cluster entry, which must then be `IP:PORT` to
/// be listened on, else `fallback`.
pub(super) fn listen_addr(
    node_id: u64,
    cluster: &BTreeMap<u64, String>,
    fallback: SocketAddr,
) -> Result<SocketAddr, ConfigError> {
    let Some(member) = cluster.get(&node_id) else {
        return Ok(fallback);
    };
    member.parse().map_err(|_| {
        invalid(
            "internal_addr",
            format!(
                "this node's cluster address {member:?} is not IP:PORT, so it cannot \
                 be listened on: set internal_addr to the local IP:PORT"
            ),
        )
    })
}

/// `cluster` in TOML: a table `{ "1" = "host:port", ... }` or the flag's string form;
/// written back as a table with ids in numeric order. Read into the resolved map or into a
/// layer's `Option` of it alike.
pub(super) mod cluster_serde {
    use std::collections::BTreeMap;
    use std::fmt;

    use serde::de::{self, MapAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        cluster: &BTreeMap<u64, String>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_map(cluster.iter().map(|(id, addr)| (id.to_string(), addr)))
    }

    pub fn deserialize<'de, D, T>(deserializer: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: From<BTreeMap<u64, String>>,
    {
        deserializer.deserialize_any(ClusterVisitor).map(T::from)
    }

    struct ClusterVisitor;

    impl<'de> Visitor<'de> for ClusterVisitor {
        type Value = BTreeMap<u64, String>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(r#"a table of node id = "HOST:PORT", or "1=HOST:PORT,2=HOST:PORT""#)
        }

        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            super::parse_cluster(s).map_err(E::custom)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((id, addr)) = map.next_entry::<String, String>()? {
                super::insert_member(&mut out, &id, &addr).map_err(de::Error::custom)?;
            }
            Ok(out)
        }
    }
}
