//! The shards this broker holds open: opened on first use (recovering a durable shard's log
//! and starting its tasks), closed when their stream is deleted, and opened at start for
//! every durable stream so uploads and retention resume without waiting for a client.
//!
//! Opening a durable shard starts its tasks: the fanout that follows the log, the producer
//! snapshot at each seal, the uploader, retention, and in a cluster the replication driver
//! (or, for an ephemeral shard, its leadership).
//!
//! Invariant: at most one open shard per key, of the stream's current incarnation; a shard
//! of a deleted stream (or of an older stream of the same name) is closed before its key is
//! opened again, so two logs never serve one name.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use felix_cold::cache::ColdCache;
use felix_cold::store::TierStore;
use felix_cold::tiered::{Manifest, TieredShard};
use felix_cold::uploader::{TierObserver, Uploader, UploaderConfig};
use felix_hot::{LogConfig, ShardLog};
use felix_meta::model::{Durability, ShardKey, StreamSettings};
use felix_wire::protocol::{ErrorBody, codes};
use parking_lot::Mutex;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::errors::{err, log_error};
use crate::fanout::{Fanout, follow_log};
use crate::node::{Node, settings_of};
use crate::producers::ProducerTable;
use crate::replication::driver::drive_shard;
use crate::replication::role::ReplState;
use crate::retention::run_retention;
use crate::shard::{Shard, shard_key, snapshot_producers_at_seal};

/// The open shards and what opening one needs.
pub(crate) struct Shards {
    node: Arc<Node>,
    open: Mutex<HashMap<ShardKey, Arc<Shard>>>,
    pub(crate) tier_store: TierStore,
    pub(crate) cold_cache: ColdCache,
    /// Hot history blocks shared by catching-up subscribers of every shard.
    pub(crate) hot_reads: Arc<felix_hot::ReadCache>,
    tier_observer: Arc<dyn TierObserver>,
    /// Shards whose replica moved away and whose files are being let go (`retire_moved`),
    /// and whether that was asked again meanwhile (then it runs once more).
    retiring: Mutex<HashMap<ShardKey, bool>>,
}

impl Shards {
    pub(crate) fn new(
        node: Arc<Node>,
        tier_store: TierStore,
        cold_cache: ColdCache,
        tier_observer: Arc<dyn TierObserver>,
    ) -> Shards {
        Shards {
            hot_reads: Arc::new(felix_hot::ReadCache::new(node.config.hot_read_cache_bytes)),
            node,
            open: Mutex::new(HashMap::new()),
            tier_store,
            cold_cache,
            tier_observer,
            retiring: Mutex::new(HashMap::new()),
        }
    }

    /// An open shard, if it is open.
    pub(crate) fn get(&self, key: &ShardKey) -> Option<Arc<Shard>> {
        self.open.lock().get(key).cloned()
    }

    /// The open shards of one stream.
    pub(crate) fn of_stream(&self, tenant: &str, namespace: &str, name: &str) -> Vec<Arc<Shard>> {
        self.open
            .lock()
            .values()
            .filter(|s| {
                s.key.tenant == tenant && s.key.namespace == namespace && s.key.stream == name
            })
            .cloned()
            .collect()
    }

    /// Closes every open shard of a stream and forgets them.
    pub(crate) fn retire_stream(&self, tenant: &str, namespace: &str, name: &str) {
        retire_stream(&mut self.open.lock(), tenant, namespace, name);
    }

    /// Bytes of the open shards' local logs.
    pub(crate) fn hot_bytes(&self) -> u64 {
        self.open
            .lock()
            .values()
            .filter_map(|s| s.log.as_ref())
            .map(ShardLog::size_bytes)
            .sum()
    }

    /// Removes the local files of `shards` (placed only on other brokers), at start. Each is
    /// checked again under the open-shard lock, which opening a shard holds: one placed here
    /// again meanwhile keeps its files.
    fn remove_moved_replicas(&self, shards: &[ShardKey]) {
        let me = self.node.config.node_id;
        for key in shards {
            let mut open = self.open.lock();
            let placed_here = self
                .node
                .registry
                .borrow()
                .placements
                .get(key)
                .is_none_or(|p| p.replicas.contains(&me) || p.leader == Some(me));
            if placed_here {
                continue;
            }
            // Opened meanwhile from the control plane's history as it was replayed at
            // start (a placement that named this broker then): closed, as a deleted
            // stream's shard is; its group journal is let go by the groups' next pass.
            if let Some(s) = open.remove(key) {
                s.close();
            }
            let dir = self.stream_dir(&key.tenant, &key.namespace, &key.stream);
            if crate::stream_files::remove_replica_files(&dir, key.shard) {
                info!(shard = %key, "removed the files of a replica now placed on other brokers");
            }
        }
    }

    /// Lets go of a replica a committed move (a drain, a rebalance, a dead broker's
    /// replacement, a rolled-back move's destination) took off this running broker: closes
    /// the shard and removes its files (log, group journal; a cache's log is its backing
    /// stream's) once nothing holds the shard any more. Subscriptions here ended at the
    /// hand-over (`shard_moved`); what still holds the shard lets go once it is closed.
    ///
    /// Judged on a linearizable read, as at start-up: a placement replayed or applied late
    /// here must not be taken for the shard's last one, or a replica placed here again would
    /// lose its files. Rechecked under the open-shard lock before anything goes, so one
    /// placed here again meanwhile keeps them (its next open finds them).
    fn retire_moved(self: &Arc<Self>, key: ShardKey) {
        if let Some(again) = self.retiring.lock().get_mut(&key) {
            *again = true;
            return;
        }
        self.retiring.lock().insert(key.clone(), false);
        let shards = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                retire_moved(&shards, &key).await;
                let Some(b) = shards.upgrade() else { return };
                let mut retiring = b.retiring.lock();
                match retiring.get_mut(&key) {
                    Some(again) if *again => *again = false,
                    _ => {
                        retiring.remove(&key);
                        return;
                    }
                }
            }
        });
    }

    /// Whether the local view places `key` on this broker (or is moving it here or away).
    fn placed_here(&self, key: &ShardKey) -> bool {
        let me = self.node.config.node_id;
        self.node
            .registry
            .borrow()
            .placements
            .get(key)
            .is_some_and(|p| names(p, me))
    }

    /// Takes every open shard out (shutdown).
    pub(crate) fn drain(&self) -> Vec<Arc<Shard>> {
        self.open.lock().drain().map(|(_, s)| s).collect()
    }

    /// Opens every shard of a durable stream, so its upload and retention run.
    pub(crate) fn open_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), ErrorBody> {
        let (_, settings) = self.node.stream_settings(tenant, namespace, name)?;
        if settings.durability == Durability::Durable {
            for k in 0..settings.shards {
                let key = shard_key(tenant, namespace, name, k);
                if self.node.holds_replica(&key) {
                    self.open(&key)?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn stream_dir(&self, tenant: &str, namespace: &str, name: &str) -> PathBuf {
        // Names are validated by the control plane ([A-Za-z0-9._-], never "." or ".."), so
        // they are safe path components.
        self.node
            .config
            .data_dir
            .join("streams")
            .join(tenant)
            .join(namespace)
            .join(name)
    }

    /// A shard's local state, opened on first use, whatever this broker's role for it.
    pub(crate) fn open(&self, key: &ShardKey) -> Result<(Arc<Shard>, StreamSettings), ErrorBody> {
        let (tenant, namespace, stream, shard) = (
            &key.tenant[..],
            &key.namespace[..],
            &key.stream[..],
            key.shard,
        );
        let (settings, incarnation) = self.node.stream_entry(tenant, namespace, stream, |s| {
            (s.settings.clone(), s.incarnation)
        })?;
        if shard >= settings.shards {
            return Err(err(
                codes::UNKNOWN_SHARD,
                "unknown_shard",
                format!(
                    "stream {tenant}/{namespace}/{stream} has {} shards; shard {shard} does not exist",
                    settings.shards
                ),
            ));
        }
        let mut shards = self.open.lock();
        match shards.get(key) {
            Some(s) if s.incarnation == incarnation => return Ok((s.clone(), settings)),
            // Still open here from a deleted stream of the same name (this broker has not
            // acted on the delete yet): that stream is over, on every shard.
            Some(_) => retire_stream(&mut shards, tenant, namespace, stream),
            None => {}
        }
        let fanout = Arc::new(Fanout::default());
        let closed = Arc::new(AtomicBool::new(false));
        let (stop_tasks, stop_rx) = watch::channel(false);
        let mut producers = ProducerTable::default();
        // In a cluster every shard has a role (an ephemeral one too: one leader per shard).
        let repl = self.node.cluster.then(|| Arc::new(ReplState::new(0)));
        // The uploader re-reads the control plane before each upload, and a new leader
        // refreshes this copy (`refresh_manifest`).
        let manifest_state = self.node.meta.local(|s| s.manifest(key));
        let log = if settings.durability == Durability::Durable {
            let stream_dir = self.stream_dir(tenant, namespace, stream);
            crate::stream_files::claim(&stream_dir, incarnation).map_err(|e| {
                err(
                    codes::SHARD_UNAVAILABLE,
                    "shard_unavailable",
                    format!("cannot prepare {}: {e}", stream_dir.display()),
                )
                .retry_after(1000)
            })?;
            let dir = stream_dir.join(shard.to_string());
            let log = ShardLog::open(
                &dir,
                LogConfig {
                    shard: key.to_string(),
                    segment_bytes: settings.segment_bytes,
                    segment_age: Some(Duration::from_millis(settings.segment_ms)),
                    fsync: self.node.config.fsync_policy(),
                    max_batch_bytes: self.node.config.max_batch_bytes,
                    retention: felix_hot::RetentionPolicy {
                        max_bytes: settings.hot_retention_bytes,
                        max_age: settings.hot_retention_ms.map(Duration::from_millis),
                    },
                    // A wiped or lost local volume: continue after the uploaded history
                    // instead of handing out its offsets again.
                    start_offset: manifest_state.uploaded_end(),
                    ..LogConfig::default()
                },
            )
            .map_err(|e| log_error(&e))?;
            if repl.is_some() {
                log.set_write_gate(crate::enqueue_ack::write_gate(self.node.lease.clone()));
            }
            let visible = match &repl {
                Some(r) => r.mark.watch(),
                None => log.watch_committed(),
            };
            fanout.reset(*visible.borrow());
            producers = ProducerTable::rebuild(&log).map_err(|e| log_error(&e))?;
            tokio::spawn(snapshot_producers_at_seal(
                log.clone(),
                closed.clone(),
                stop_rx.clone(),
            ));
            tokio::spawn(follow_log(
                log.clone(),
                visible,
                fanout.clone(),
                closed.clone(),
                self.node.metrics.clone(),
                stop_rx.clone(),
            ));
            info!(shard = %key, next_offset = log.next_offset(), "opened durable shard");
            Some(log)
        } else {
            None
        };
        let retention_now = Arc::new(tokio::sync::Notify::new());
        let tier = log.as_ref().map(|log| {
            let manifest = Arc::new(Manifest::new(manifest_state));
            log.mark_uploaded_below(manifest.uploaded_end());
            let tier = Arc::new(
                TieredShard::new(
                    key.clone(),
                    log.clone(),
                    manifest.clone(),
                    Some(self.cold_cache.clone()),
                )
                .with_hot_read_cache(self.hot_reads.clone()),
            );
            self.spawn_shard_tasks(&tier, repl.clone(), stop_rx, retention_now.clone());
            tier
        });
        let s = Arc::new(Shard {
            key: key.clone(),
            log,
            repl: repl.clone(),
            fanout,
            ephemeral_next: AtomicU64::new(0),
            closed,
            producers: tokio::sync::Mutex::new(producers),
            tier,
            stop_tasks,
            retention_now,
            incarnation,
        });
        shards.insert(key.clone(), s.clone());
        drop(shards);
        if let Some(repl) = repl {
            repl.placement
                .send_replace(self.node.registry.borrow().placements.get(key).cloned());
            match &s.log {
                Some(_) => {
                    tokio::spawn(drive_shard(Arc::downgrade(&self.node), s.clone()));
                }
                None => crate::ephemeral::lead(&self.node, &s, s.stop_tasks.subscribe()),
            }
        }
        Ok((s, settings))
    }

    /// Starts a durable shard's uploader and retention tasks.
    fn spawn_shard_tasks(
        &self,
        tier: &Arc<TieredShard>,
        repl: Option<Arc<ReplState>>,
        stop: watch::Receiver<bool>,
        retention_now: Arc<tokio::sync::Notify>,
    ) {
        let key = tier.key.clone();
        let registry = self.node.registry.clone();
        let settings =
            move || -> Option<StreamSettings> { settings_of(&registry.borrow(), &key).cloned() };
        let settings: Arc<dyn Fn() -> Option<StreamSettings> + Send + Sync> = Arc::new(settings);
        let enabled = settings.clone();
        let uploader = Uploader::new(
            tier.key.clone(),
            tier.log.clone(),
            tier.manifest.clone(),
            self.tier_store.clone(),
            self.node.meta.clone(),
            self.node.config.node_id,
            UploaderConfig {
                encode: felix_cold::segment::EncodeOptions {
                    row_group_bytes: self.node.config.tier_row_group_bytes,
                    ..Default::default()
                },
                ..UploaderConfig::default()
            },
            self.tier_observer.clone(),
        )
        .with_enabled({
            let repl = repl.clone();
            // In a cluster only the leader uploads, and only what readers may see (on a
            // Quorum stream, what a majority holds), so a failover cannot cut it.
            Arc::new(move || {
                enabled().is_some_and(|s| s.tiered)
                    && repl.as_ref().is_none_or(|r| r.leading().is_some())
            })
        });
        let uploader = match &repl {
            Some(r) => {
                let visible = r.mark.watch();
                uploader.with_limit(Arc::new(move || *visible.borrow()))
            }
            None => uploader,
        };
        tokio::spawn(uploader.run(stop.clone()));
        tokio::spawn(run_retention(
            tier.clone(),
            repl,
            self.node.meta.clone(),
            settings,
            Duration::from_millis(self.node.config.retention_check_ms),
            retention_now,
            stop,
        ));
    }
}

/// Whether placement `p` still concerns broker `me`: a replica, the leader, or either end of
/// a move under way.
pub(crate) fn names(p: &felix_meta::model::Placement, me: u64) -> bool {
    p.replicas.contains(&me)
        || p.leader == Some(me)
        || p.moving.is_some_and(|m| m.from == me || m.to == me)
}

/// How long a retired replica's files wait for what still holds its shard before they go
/// all the same (an open file is unlinked safely; only its space waits for the close).
const RETIRE_WAIT: Duration = Duration::from_secs(30);

/// [`Shards::retire_moved`]'s task.
async fn retire_moved(shards: &Weak<Shards>, key: &ShardKey) {
    let me = match shards.upgrade() {
        Some(b) => b.node.config.node_id,
        None => return,
    };
    let meta = match shards.upgrade() {
        Some(b) => b.node.meta.clone(),
        None => return,
    };
    match meta
        .read(|s| s.placements.get(key).is_some_and(|p| names(p, me)))
        .await
    {
        Ok(false) => {}
        Ok(true) => return, // placed here again: the shard stays
        Err(e) => {
            warn!(shard = %key, error = %e, "no linearizable read of the placement; a moved replica's files stay until the next start");
            return;
        }
    }
    let closed = {
        let Some(b) = shards.upgrade() else { return };
        let mut open = b.open.lock();
        if b.placed_here(key) {
            return;
        }
        open.remove(key)
    };
    if let Some(closed) = closed {
        closed.close();
        // What still reads the shard (a subscription's last read, a group journal the
        // groups' pass lets go of within a second) ends once it sees the shard closed.
        let deadline = tokio::time::Instant::now() + RETIRE_WAIT;
        while Arc::strong_count(&closed) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Placed here again meanwhile: its next open uses the files.
            if shards.upgrade().is_none_or(|b| b.placed_here(key)) {
                return;
            }
        }
    }
    let Some(b) = shards.upgrade() else { return };
    let open = b.open.lock();
    if b.placed_here(key) || open.contains_key(key) {
        return;
    }
    let dir = b.stream_dir(&key.tenant, &key.namespace, &key.stream);
    if crate::stream_files::remove_replica_files(&dir, key.shard) {
        info!(shard = %key, "removed the files of a replica moved to other brokers");
    }
}

/// Closes every open shard of a stream (its tasks stop, its subscribers end) and forgets
/// them; their files stay until the caller removes them.
fn retire_stream(
    shards: &mut HashMap<ShardKey, Arc<Shard>>,
    tenant: &str,
    namespace: &str,
    name: &str,
) {
    let of_stream = |k: &ShardKey, _: &mut Arc<Shard>| {
        k.tenant == tenant && k.namespace == namespace && k.stream == name
    };
    for (_, s) in shards.extract_if(of_stream) {
        s.close();
    }
}

/// Acts on deletes this broker did not handle itself (it is a follower of the stream, or
/// the delete came through another broker or straight to the control plane): once a stream
/// is gone from the registry, its open shards close and its files go. A stream created
/// again under the same name meanwhile is another incarnation; [`Shards::open`]
/// retires the old shards when it opens the new one.
pub(crate) async fn watch_deletes(shards: Weak<Shards>) {
    let mut registry = match shards.upgrade() {
        Some(b) => b.node.registry.clone(),
        None => return,
    };
    loop {
        let reg = registry.borrow_and_update().clone();
        {
            let Some(b) = shards.upgrade() else { return };
            let gone: BTreeSet<(String, String, String)> = b
                .open
                .lock()
                .keys()
                .filter(|k| reg.stream(&k.tenant, &k.namespace, &k.stream).is_none())
                .map(|k| (k.tenant.clone(), k.namespace.clone(), k.stream.clone()))
                .collect();
            for (t, n, s) in gone {
                retire_stream(&mut b.open.lock(), &t, &n, &s);
                let dir = b.stream_dir(&t, &n, &s);
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => info!(
                        stream = format!("{t}/{n}/{s}"),
                        "removed a deleted stream's files"
                    ),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        warn!(dir = %dir.display(), error = %e, "could not remove a deleted stream's files")
                    }
                }
            }
        }
        if registry.changed().await.is_err() {
            return;
        }
    }
}

/// Opens every durable shard once the registry is loaded, so uploads and retention resume
/// after a restart without waiting for a client to touch each stream. First removes the
/// files of streams deleted while this broker was down or mid-delete, and of shards moved
/// to other brokers: judged on a linearizable read, so a stream this broker has not heard
/// of yet is never taken for one, nor a shard placed here again taken for one moved away.
pub(crate) async fn open_durable_shards(shards: Weak<Shards>) {
    loop {
        let Some(b) = shards.upgrade() else { return };
        if b.node.meta.is_ready() {
            let me = b.node.cluster.then_some(b.node.config.node_id);
            match b
                .node
                .meta
                .read(|s| crate::stream_files::LiveStreams::of(s, me))
                .await
            {
                Ok(live) => {
                    let root = b.node.config.data_dir.join("streams");
                    crate::stream_files::sweep(&root, &live);
                    b.remove_moved_replicas(&live.elsewhere);
                }
                Err(e) => {
                    warn!(error = %e, "no linearizable read of the streams; deleted streams' files stay until the next start")
                }
            }
            let streams: Vec<(String, String, String)> = b
                .node
                .registry
                .borrow()
                .streams
                .values()
                .filter(|s| s.settings.durability == Durability::Durable)
                .map(|s| (s.tenant.clone(), s.namespace.clone(), s.name.clone()))
                .collect();
            for (t, n, s) in streams {
                if let Err(e) = b.open_stream(&t, &n, &s) {
                    warn!(stream = format!("{t}/{n}/{s}"), error = %e.message, "could not open a stream's shards");
                }
            }
            return;
        }
        drop(b);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Cluster mode: hands every placement that names this broker to its shard (opening the
/// shard if needed), so each shard's driver takes the role the control plane gives it.
pub(crate) async fn watch_placements(shards: Weak<Shards>) {
    let mut registry = match shards.upgrade() {
        Some(b) => b.node.registry.clone(),
        None => return,
    };
    // The shards whose last placement seen here named this broker: one that stops naming it
    // is let go even when it is not open here now (its files may be).
    let mut named_here: BTreeSet<ShardKey> = BTreeSet::new();
    loop {
        let placements = registry.borrow_and_update().placements.clone();
        {
            let Some(b) = shards.upgrade() else { return };
            if b.node.stopping.load(Ordering::Acquire) {
                return;
            }
            let me = b.node.config.node_id;
            b.node.metrics.moves.prune(me, placements.iter());
            for (key, p) in placements {
                if !p.replicas.contains(&me) {
                    // Not (or no longer) a replica: a shard still open here stops serving,
                    // and once no move concerns this broker its files go.
                    let open = b.open.lock().get(&key).cloned();
                    if let Some(r) = open.as_ref().and_then(|s| s.repl.as_ref()) {
                        r.set_placement(&p);
                    }
                    let was_here = named_here.remove(&key);
                    if names(&p, me) {
                        named_here.insert(key);
                    } else if open.is_some_and(|s| s.log.is_some()) || was_here {
                        b.retire_moved(key);
                    }
                    continue;
                }
                named_here.insert(key.clone());
                match b.open(&key) {
                    Ok((s, _)) => {
                        if let Some(r) = &s.repl {
                            r.set_placement(&p);
                        }
                    }
                    Err(e) => {
                        warn!(shard = %key, error = %e.message, "cannot open a placed shard")
                    }
                }
            }
        }
        if registry.changed().await.is_err() {
            return;
        }
    }
}
