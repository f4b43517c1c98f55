//! The requests that are not about one shard (tenants, namespaces, stream settings, segment
//! listings, producer ids) and the publish calls built on `publish_batch_detailed`: declared
//! once, and answered both by a [`crate::Client`] (on any live broker, re-sent when safe, to
//! each shard's leader) and by a [`crate::Connection`] (on its one broker, never re-sent).
//!
//! Invariant: a method sends the same request and accepts the same answer whichever of the
//! two sends it; only where it goes and whether it is re-sent differ. Each request says
//! whether it may be re-sent after an unknown outcome (`idempotent`: reads and
//! `ProducerInit` may, creates and deletes may not).

/// What an admin call does to a stream, for the routing and shard-count caches of whoever
/// sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamOp {
    Create,
    Alter,
    Describe,
    Delete,
}

/// The admin and publish methods of a type that has
/// `async fn admin(&self, Request, idempotent: bool) -> Result<Response, ClientError>`,
/// `fn stream_op_starts(&self, StreamOp, &StreamKey)`,
/// `fn stream_op_done(&self, StreamOp, &StreamInfo)` and `publish_each_shard` (one
/// stream's publish, each shard's outcome).
macro_rules! admin_requests {
    () => {
        async fn admin_done(&self, request: $crate::Request) -> Result<(), $crate::ClientError> {
            let what = $crate::request_name(&request);
            match self.admin(request, false).await? {
                $crate::Response::Done {} => Ok(()),
                other => Err($crate::unexpected(what, &other)),
            }
        }

        async fn admin_stream(
            &self,
            op: $crate::admin::StreamOp,
            request: $crate::Request,
        ) -> Result<$crate::StreamInfo, $crate::ClientError> {
            let what = $crate::request_name(&request);
            let idempotent = op == $crate::admin::StreamOp::Describe;
            match self.admin(request, idempotent).await? {
                $crate::Response::Stream { stream } => {
                    self.stream_op_done(op, &stream);
                    Ok(stream)
                }
                other => Err($crate::unexpected(what, &other)),
            }
        }

        /// Creates a tenant. Fails with `already_exists` if there is one of that name.
        pub async fn create_tenant(&self, name: &str) -> Result<(), $crate::ClientError> {
            self.admin_done($crate::Request::CreateTenant {
                name: name.to_owned(),
            })
            .await
        }

        /// Creates a namespace in a tenant.
        pub async fn create_namespace(
            &self,
            tenant: &str,
            name: &str,
        ) -> Result<(), $crate::ClientError> {
            self.admin_done($crate::Request::CreateNamespace {
                tenant: tenant.to_owned(),
                name: name.to_owned(),
            })
            .await
        }

        /// Creates a stream; unset settings take the broker's defaults (an ephemeral stream
        /// of one shard unless told otherwise). Returns the stream with every setting filled
        /// in. On a cluster its shards may have no leader for a moment: publishes and
        /// subscriptions wait for one (within the request timeout).
        ///
        /// ```no_run
        /// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
        /// use felix_client::StreamConfig;
        /// let config = StreamConfig {
        ///     durable: Some(true),
        ///     shards: Some(8),
        ///     consistency: Some("quorum".into()),
        ///     replicas: Some(3),
        ///     retention_ms: Some(7 * 24 * 3600 * 1000),
        ///     ..Default::default()
        /// };
        /// let info = client.create_stream("acme", "prod", "orders", config).await?;
        /// assert_eq!(info.config.shards, Some(8));
        /// # Ok(()) }
        /// ```
        pub async fn create_stream(
            &self,
            tenant: &str,
            namespace: &str,
            name: &str,
            config: $crate::StreamConfig,
        ) -> Result<$crate::StreamInfo, $crate::ClientError> {
            let op = $crate::admin::StreamOp::Create;
            self.stream_op_starts(op, &$crate::stream_key(tenant, namespace, name));
            self.admin_stream(
                op,
                $crate::Request::CreateStream {
                    tenant: tenant.to_owned(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    config,
                },
            )
            .await
        }

        /// Changes the settings that are set in `config`, leaving the others as they are.
        pub async fn alter_stream(
            &self,
            tenant: &str,
            namespace: &str,
            name: &str,
            config: $crate::StreamConfig,
        ) -> Result<$crate::StreamInfo, $crate::ClientError> {
            let op = $crate::admin::StreamOp::Alter;
            self.stream_op_starts(op, &$crate::stream_key(tenant, namespace, name));
            self.admin_stream(
                op,
                $crate::Request::AlterStream {
                    tenant: tenant.to_owned(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    config,
                },
            )
            .await
        }

        /// A stream's settings and, for a durable stream, each shard's offsets on the broker
        /// that answered.
        pub async fn describe_stream(
            &self,
            tenant: &str,
            namespace: &str,
            name: &str,
        ) -> Result<$crate::StreamInfo, $crate::ClientError> {
            self.admin_stream(
                $crate::admin::StreamOp::Describe,
                $crate::Request::DescribeStream {
                    tenant: tenant.to_owned(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                },
            )
            .await
        }

        /// The streams of a namespace.
        pub async fn list_streams(
            &self,
            tenant: &str,
            namespace: &str,
        ) -> Result<Vec<$crate::StreamInfo>, $crate::ClientError> {
            let request = $crate::Request::ListStreams {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
            };
            match self.admin(request, true).await? {
                $crate::Response::Streams { streams } => Ok(streams),
                other => Err($crate::unexpected("ListStreams", &other)),
            }
        }

        /// A stream's segments and objects (every shard, oldest first), as the broker that
        /// answered holds them.
        pub async fn list_segments(
            &self,
            tenant: &str,
            namespace: &str,
            stream: &str,
        ) -> Result<Vec<$crate::SegmentInfo>, $crate::ClientError> {
            let request = $crate::Request::ListSegments {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                stream: stream.to_owned(),
            };
            match self.admin(request, true).await? {
                $crate::Response::Segments { segments } => Ok(segments),
                other => Err($crate::unexpected("ListSegments", &other)),
            }
        }

        /// Deletes a stream and its records.
        pub async fn delete_stream(
            &self,
            tenant: &str,
            namespace: &str,
            name: &str,
        ) -> Result<(), $crate::ClientError> {
            let op = $crate::admin::StreamOp::Delete;
            self.stream_op_starts(op, &$crate::stream_key(tenant, namespace, name));
            self.admin_done($crate::Request::DeleteStream {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
            .await
        }

        /// Asks for an idempotent producer id and epoch (the broker must support
        /// [`crate::FEATURE_IDEMPOTENT_PRODUCER`]).
        pub async fn producer_init(&self) -> Result<(i64, i16), $crate::ClientError> {
            match self.admin($crate::Request::ProducerInit {}, true).await? {
                $crate::Response::ProducerId { producer_id, epoch } => Ok((producer_id, epoch)),
                other => Err($crate::unexpected("ProducerInit", &other)),
            }
        }

        /// Publishes one message; returns where it landed. With [`crate::AckMode::None`] it
        /// returns `None` once the broker has taken the request (queued, not yet written; the
        /// broker may still shed it under load).
        ///
        /// ```no_run
        /// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
        /// use felix_client::{AckMode, Message};
        /// let ack = client
        ///     .publish("acme", "prod", "orders", Message::new("hello").with_key("user-7"), AckMode::Batch)
        ///     .await?;
        /// if let Some(p) = ack {
        ///     println!("shard {} offset {}", p.shard, p.base_offset);
        /// }
        /// # Ok(()) }
        /// ```
        pub async fn publish(
            &self,
            tenant: &str,
            namespace: &str,
            stream: &str,
            message: impl Into<$crate::Message>,
            ack: $crate::AckMode,
        ) -> Result<Option<$crate::Published>, $crate::ClientError> {
            let mut published = self
                .publish_batch(tenant, namespace, stream, vec![message.into()], ack)
                .await?;
            Ok(published.pop())
        }

        /// Like `publish_batch`, but reports each shard's outcome separately, with the
        /// positions of the messages it carried: the `i`-th position of an acknowledged shard
        /// has offset `base_offset + i`. The outer error is for failures before anything was
        /// sent (the stream's shards could not be learned or routed).
        pub async fn publish_batch_detailed(
            &self,
            tenant: &str,
            namespace: &str,
            stream: &str,
            messages: Vec<$crate::Message>,
            ack: $crate::AckMode,
        ) -> Result<Vec<$crate::ShardOutcome>, $crate::ClientError> {
            if messages.is_empty() {
                return Ok(Vec::new());
            }
            let key = $crate::stream_key(tenant, namespace, stream);
            self.publish_each_shard(&key, std::sync::Arc::new(messages), ack)
                .await
        }

        /// Publishes messages: each shard's share goes as one RecordBatch in one request, the
        /// requests for different shards concurrently. Order is kept within a shard. Returns
        /// one [`crate::Published`] per shard, in shard order (empty for
        /// [`crate::AckMode::None`]).
        ///
        /// On error nothing says which shards were written: `publish_batch_detailed` gives a
        /// per-shard outcome.
        ///
        /// ```no_run
        /// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
        /// use felix_client::{AckMode, Message};
        /// // Key-less messages of one call go to one shard (round-robin per call), in order.
        /// let msgs = vec![Message::new("msg1"), Message::new("msg2"), Message::new("msg3")];
        /// let acks = client.publish_batch("acme", "prod", "orders", msgs, AckMode::Batch).await?;
        /// assert_eq!(acks.len(), 1);
        /// assert_eq!(acks[0].last_offset - acks[0].base_offset, 2);
        /// # Ok(()) }
        /// ```
        pub async fn publish_batch<M: Into<$crate::Message>>(
            &self,
            tenant: &str,
            namespace: &str,
            stream: &str,
            messages: Vec<M>,
            ack: $crate::AckMode,
        ) -> Result<Vec<$crate::Published>, $crate::ClientError> {
            let messages = messages.into_iter().map(Into::into).collect();
            let outcomes = self
                .publish_batch_detailed(tenant, namespace, stream, messages, ack)
                .await?;
            $crate::publish::acknowledged(outcomes)
        }
    };
}
