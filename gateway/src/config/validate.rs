//! The checks across settings: what no single setting's type or own check can refuse
//! (a cluster without this node, two listeners on one address, a certificate without its
//! key, a batch larger than a frame).
//!
//! Invariant: the first problem found is the error, and it names the setting to change.

use std::str::FromStr;

use felix_meta::network::MIN_SECRET_BYTES;

use super::cluster::check_host_port;
use super::{BrokerConfig, ConfigError, invalid};

impl BrokerConfig {
    /// Checks the settings against each other; the first problem found is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        if !self.cluster.is_empty() {
            if !self.cluster.contains_key(&self.node_id) {
                let ids: Vec<String> = self.cluster.keys().map(u64::to_string).collect();
                return Err(invalid(
                    "cluster",
                    format!(
                        "does not contain this node's id {} (members: {})",
                        self.node_id,
                        ids.join(", ")
                    ),
                ));
            }
            for (id, addr) in &self.cluster {
                check_host_port(addr)
                    .map_err(|e| invalid("cluster", format!("member {id}: {e}")))?;
            }
        }
        if let Some(zone) = &self.zone {
            felix_meta::model::check_zone(zone).map_err(|e| invalid("zone", e))?;
        }
        if self.admin_addr == self.internal_addr {
            return Err(invalid(
                "admin_addr",
                format!(
                    "{} is also internal_addr; the admin and internal HTTP listeners need \
                     different addresses",
                    self.admin_addr
                ),
            ));
        }
        felix_cold::store::validate_url(&self.object_store).map_err(|e| {
            invalid(
                "object_store",
                e.to_string()
                    .trim_start_matches("bad object store URL: ")
                    .to_owned(),
            )
        })?;
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => {
                return Err(invalid("tls_cert", "is set without tls_key (--tls-key)"));
            }
            (None, Some(_)) => {
                return Err(invalid("tls_key", "is set without tls_cert (--tls-cert)"));
            }
            _ => {}
        }
        match (&self.kafka_tls_cert, &self.kafka_tls_key) {
            (Some(_), None) => {
                return Err(invalid(
                    "kafka_tls_cert",
                    "is set without kafka_tls_key (--kafka-tls-key)",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "kafka_tls_key",
                    "is set without kafka_tls_cert (--kafka-tls-cert)",
                ));
            }
            _ => {}
        }
        felix_hot::FsyncPolicy::from_str(&self.fsync).map_err(|e| invalid("fsync", e))?;
        self.check_each()?;
        self.quota_limits()?;
        if self.kafka_default_partitions > 4096 {
            return Err(invalid(
                "kafka_default_partitions",
                "must be at most 4096 (a stream's most shards)",
            ));
        }
        for (key, addr) in [
            ("admin_addr", self.admin_addr),
            ("internal_addr", self.internal_addr),
        ] {
            if addr == self.kafka_addr && addr.port() != 0 {
                return Err(invalid(
                    "kafka_addr",
                    format!("{addr} is also {key}; the Kafka listener needs an address of its own"),
                ));
            }
        }
        if self.max_frame_bytes > u32::MAX as usize {
            return Err(invalid(
                "max_frame_bytes",
                format!("must be at most {} (a frame's length is 32 bits)", u32::MAX),
            ));
        }
        let listeners = [
            self.quic_addr,
            self.admin_addr,
            self.internal_addr,
            self.kafka_addr,
        ];
        if !self.auth
            && !self.insecure_no_auth
            && let Some(open) = listeners.iter().find(|a| !a.ip().is_loopback())
        {
            return Err(invalid(
                "auth",
                format!(
                    "is off while a listener ({open}) is off loopback: anyone who reaches it \
                     could read and write every tenant's streams; turn auth on, or set \
                     insecure_no_auth on a private test network"
                ),
            ));
        }
        self.check_cluster_secret()?;
        if self.max_batch_bytes > self.max_frame_bytes {
            return Err(invalid(
                "max_batch_bytes",
                format!(
                    "{} exceeds max_frame_bytes {}: a batch must fit in a frame",
                    self.max_batch_bytes, self.max_frame_bytes
                ),
            ));
        }
        Ok(())
    }

    /// One source for the secret, long enough, and given to every member of a cluster that
    /// authenticates (a member cannot make one up: its peers would not know it).
    fn check_cluster_secret(&self) -> Result<(), ConfigError> {
        let given = self.cluster_secret.is_some() || self.cluster_secret_file.is_some();
        if self.cluster_secret.is_some() && self.cluster_secret_file.is_some() {
            return Err(invalid(
                "cluster_secret",
                "is set as well as cluster_secret_file (--cluster-secret-file); give one",
            ));
        }
        if let Some(secret) = &self.cluster_secret
            && secret.expose().len() < MIN_SECRET_BYTES
        {
            return Err(invalid(
                "cluster_secret",
                format!(
                    "is {} bytes; it must be at least {MIN_SECRET_BYTES} (e.g. `openssl rand \
                     -hex 32`)",
                    secret.expose().len()
                ),
            ));
        }
        if self.cluster_secret_previous_file.is_some() && !given {
            return Err(invalid(
                "cluster_secret_previous_file",
                "is set without a current secret (cluster_secret_file or FELIX_CLUSTER_SECRET)",
            ));
        }
        if self.auth && !given && self.cluster.len() > 1 {
            return Err(invalid(
                "cluster_secret_file",
                format!(
                    "is not set, and auth is on in a cluster of {} brokers: give every broker \
                     the same cluster secret (at least {MIN_SECRET_BYTES} bytes) with \
                     --cluster-secret-file FILE or FELIX_CLUSTER_SECRET; see \
                     docs/internal-network.md",
                    self.cluster.len()
                ),
            ));
        }
        Ok(())
    }
}
