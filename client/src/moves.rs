//! The cluster operations (docs/shard-moves.md): the broker list, drains and shard moves,
//! declared once for [`crate::Client`] and [`crate::Connection`] like the admin requests.
//! Each needs `cluster.manage` on `*` when auth is on. A move or a drain is answered once the
//! control plane recorded it; its progress shows in [`list_moves`](crate::Client::list_moves)
//! and [`list_brokers`](crate::Client::list_brokers).

/// The cluster methods of a type with `admin` (see `admin_requests!`).
macro_rules! cluster_requests {
    () => {
        async fn cluster(
            &self,
            request: $crate::ClusterRequest,
            idempotent: bool,
        ) -> Result<$crate::ClusterResponse, $crate::ClientError> {
            match self
                .admin($crate::Request::Cluster(request), idempotent)
                .await?
            {
                $crate::Response::Cluster(answer) => Ok(answer),
                other => Err($crate::unexpected("Cluster", &other)),
            }
        }

        /// Every registered broker: addresses, zone, liveness, whether it drains, and how
        /// many shards it leads and holds.
        pub async fn list_brokers(&self) -> Result<Vec<$crate::BrokerInfo>, $crate::ClientError> {
            match self
                .cluster($crate::ClusterRequest::ListBrokers {}, true)
                .await?
            {
                $crate::ClusterResponse::Brokers { brokers } => Ok(brokers),
                other => Err($crate::ClientError::Protocol(format!(
                    "unexpected answer to ListBrokers: {other:?}"
                ))),
            }
        }

        /// The shard moves under way.
        pub async fn list_moves(&self) -> Result<Vec<$crate::MoveInfo>, $crate::ClientError> {
            match self
                .cluster($crate::ClusterRequest::ListMoves {}, true)
                .await?
            {
                $crate::ClusterResponse::Moves { moves } => Ok(moves),
                other => Err($crate::ClientError::Protocol(format!(
                    "unexpected answer to ListMoves: {other:?}"
                ))),
            }
        }

        /// The moves that would even out leaders, then replicas, over the live brokers
        /// (each `planned`; nothing is moved).
        pub async fn plan_rebalance(&self) -> Result<Vec<$crate::MoveInfo>, $crate::ClientError> {
            match self
                .cluster($crate::ClusterRequest::PlanRebalance {}, true)
                .await?
            {
                $crate::ClusterResponse::Moves { moves } => Ok(moves),
                other => Err($crate::ClientError::Protocol(format!(
                    "unexpected answer to PlanRebalance: {other:?}"
                ))),
            }
        }

        /// Starts draining broker `id` (or stops, with `draining` false): its shards move
        /// to the other brokers, a few at a time.
        pub async fn set_draining(
            &self,
            id: u64,
            draining: bool,
        ) -> Result<(), $crate::ClientError> {
            let request = if draining {
                $crate::ClusterRequest::DrainBroker { id }
            } else {
                $crate::ClusterRequest::UndrainBroker { id }
            };
            self.cluster(request, true).await.map(|_| ())
        }

        /// Forgets broker `id` (registry and control-plane membership); refused while it is
        /// alive or holds a replica.
        pub async fn remove_broker(&self, id: u64) -> Result<(), $crate::ClientError> {
            self.cluster($crate::ClusterRequest::RemoveBroker { id }, true)
                .await
                .map(|_| ())
        }

        /// Starts moving one shard's replica (the leader's, unless `replace` names one) to
        /// broker `to`; answered with the shard's generation once recorded.
        pub async fn move_shard(
            &self,
            tenant: &str,
            namespace: &str,
            stream: &str,
            shard: u32,
            to: u64,
            replace: Option<u64>,
        ) -> Result<(), $crate::ClientError> {
            let request = $crate::ClusterRequest::MoveShard {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                stream: stream.to_owned(),
                shard,
                to,
                replace,
                force: false,
            };
            self.cluster(request, false).await.map(|_| ())
        }

        /// Makes broker `to` (a follower) lead a Leader stream's shard whose leader is dead,
        /// from the end of its own copy: what the old leader acknowledged past it is lost.
        /// Returns `(generation, start, old_leader)`: records the old leader acknowledged at
        /// or after `start` are gone.
        pub async fn force_shard_leader(
            &self,
            tenant: &str,
            namespace: &str,
            stream: &str,
            shard: u32,
            to: u64,
        ) -> Result<(u64, u64, Option<u64>), $crate::ClientError> {
            let request = $crate::ClusterRequest::MoveShard {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                stream: stream.to_owned(),
                shard,
                to,
                replace: None,
                force: true,
            };
            match self.cluster(request, false).await? {
                $crate::ClusterResponse::Forced {
                    generation,
                    start,
                    old_leader,
                } => Ok((generation, start, old_leader)),
                other => Err($crate::ClientError::Protocol(format!(
                    "unexpected answer to a forced move: {other:?}"
                ))),
            }
        }
    };
}
