//! A liveness probe that says within seconds whether the store answers at all.
//!
//! [`TierStore::check`] goes through the guard: it waits for a permit, gets `op_timeout`
//! (30 s by default) per attempt and is retried, so a store that hangs (accepts connections
//! and never answers) took 35–65 s to be reported down. The ping bypasses the guard: no
//! permit (a store busy with long uploads still answers a HEAD), one attempt, its own short
//! timeout. Any answer from the store, "not found" included, means it is up.

use std::time::Duration;

use object_store::ObjectStoreExt;

use super::{StoreError, TierStore, store_error};

/// The key the ping asks about; it need not exist (a "not found" is an answer).
const PING_KEY: &str = ".felix-liveness";

impl TierStore {
    /// One HEAD of a fixed key, without the guard's permits and retries, within `timeout`.
    /// `Ok` when the store answered (found or not found).
    pub async fn ping(&self, timeout: Duration) -> Result<(), StoreError> {
        let path = self.path(PING_KEY);
        match tokio::time::timeout(timeout, self.store.inner.head(&path)).await {
            Err(_) => Err(StoreError::Timeout {
                op: "ping",
                key: PING_KEY.to_owned(),
                after: timeout,
            }),
            Ok(Ok(_)) | Ok(Err(object_store::Error::NotFound { .. })) => Ok(()),
            Ok(Err(e)) => Err(store_error("ping", PING_KEY, e)),
        }
    }
}
