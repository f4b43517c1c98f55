//! Removing a deleted stream's objects from the object store, whatever crashes on the way.
//!
//! Deleting a durable stream records its name in the control plane's `deleting_objects`
//! and keeps it reserved there: a stream created under the same name would upload objects
//! under the same keys, which this removal could take. One broker does the removal, the one
//! whose metadata node leads Raft, so two brokers never race a new stream's first upload: it
//! lists everything under the stream's prefix (which also finds objects of uploads whose
//! record never committed), deletes it, and only then proposes `ObjectsDeleted`, which frees
//! the name. A crash or a leader change mid-way leaves the record in place, and the next
//! leader starts over; deleting an object twice is harmless.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use felix_cold::store::{StoreError, TierStore};
use felix_meta::MetaHandle;
use felix_meta::model::Command;
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::node::Node;

/// How often a leader looks for unfinished removals when the registry does not change.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Longest wait between two tries of a failing removal.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The names in a stream key `tenant/namespace/stream` (names never hold `/`).
fn names(stream_key: &str) -> Option<(&str, &str, &str)> {
    let mut parts = stream_key.splitn(3, '/');
    Some((parts.next()?, parts.next()?, parts.next()?))
}

/// Runs for the broker's life: while this broker's metadata node leads, it removes the
/// objects of every stream the control plane lists as deleting.
pub(crate) async fn finish_object_deletes(node: Weak<Node>, store: TierStore) {
    let Some(meta) = node.upgrade().map(|n| n.meta.clone()) else {
        return;
    };
    let running: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut registry = meta.registry();
    loop {
        if node.strong_count() == 0 {
            return;
        }
        if meta.is_leader() {
            let pending = meta.local(|s| s.deleting_objects.clone());
            for key in pending {
                if running.lock().insert(key.clone()) {
                    tokio::spawn(remove_objects(
                        meta.clone(),
                        store.clone(),
                        key,
                        running.clone(),
                    ));
                }
            }
        }
        // A delete shows in the registry (the stream goes); otherwise look again shortly,
        // which also notices gaining leadership. A closed registry (shutting down) must not
        // turn this into a busy loop.
        if let Ok(Err(_)) = tokio::time::timeout(SWEEP_EVERY, registry.changed()).await {
            tokio::time::sleep(SWEEP_EVERY).await;
        }
    }
}

/// Removes everything under one deleted stream's prefix, then frees its name. Gives up (to
/// the next leader) when this node stops leading.
async fn remove_objects(
    meta: MetaHandle,
    store: TierStore,
    key: String,
    running: Arc<Mutex<BTreeSet<String>>>,
) {
    let Some((tenant, namespace, name)) = names(&key) else {
        warn!(
            stream = key,
            "a deleting stream's name is not tenant/namespace/stream"
        );
        running.lock().remove(&key);
        return;
    };
    let prefix = format!("tenant={tenant}/namespace={namespace}/stream={name}/");
    info!(stream = key, "removing a deleted stream's objects");
    let mut backoff = Duration::from_millis(200);
    while meta.is_leader() {
        match remove_prefix(&store, &prefix).await {
            Ok(removed) => {
                let done = Command::ObjectsDeleted {
                    tenant: tenant.to_owned(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                };
                match meta.propose(done).await {
                    Ok(_) => {
                        info!(
                            stream = key,
                            objects = removed,
                            "a deleted stream's objects are removed"
                        );
                        break;
                    }
                    Err(e) => warn!(stream = key, error = %e,
                        "could not record that a deleted stream's objects are removed"),
                }
            }
            Err(e) => warn!(prefix, error = %e, retry_in = ?backoff,
                "could not remove a deleted stream's objects"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    running.lock().remove(&key);
}

/// Lists and deletes every object under `prefix`; returns how many there were.
async fn remove_prefix(store: &TierStore, prefix: &str) -> Result<usize, StoreError> {
    let listed = store.list(prefix).await?;
    let count = listed.len();
    for (object, _) in listed {
        store.delete(&object).await?;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_key_splits_into_its_three_names() {
        assert_eq!(names("acme/prod/orders"), Some(("acme", "prod", "orders")));
        assert_eq!(names("acme/prod"), None);
    }
}
