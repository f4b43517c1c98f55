//! The QUIC client protocol on the broker's side (docs/protocol.md): one bidirectional
//! stream per request; `Hello` first; a subscription answers `SubscribeOk` and then streams
//! `Event` frames on its own QUIC stream, so each subscriber has its own flow control and a
//! stalled one blocks nobody.
//!
//! Bad input is answered, never fatal: an oversized or malformed frame gets a typed error on
//! its own stream and the connection's other streams carry on; a client that disconnects
//! mid-request has nothing applied, because a request is acted on only once its whole frame
//! has arrived.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use felix_wire::HeaderIter;
use felix_wire::protocol::{
    AckMode, ErrorBody, Event, Frame, FrameKind, PROTOCOL_VERSION, Request, Response, codes,
    features,
};
use tokio::sync::watch;
use tracing::debug;

use crate::auth::{Credential, MintRequest, check_for};
use crate::broker::Broker;
use crate::metrics::{Metrics, TenantAction};
use crate::publish::Publisher;
use crate::publish_gate::{AnswersOwed, too_many_owed};
use crate::request_frames::{FrameReader, ReadError};
use crate::subscription::SubEvent;

/// Accepts connections until `shutdown` turns true.
pub async fn serve_quic(
    endpoint: quinn::Endpoint,
    broker: Arc<Broker>,
    mut shutdown: watch::Receiver<bool>,
) {
    // Counted from the handshake on: a flood of handshakes is held to the cap too.
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        tokio::select! {
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => {
                    if open.fetch_add(1, Ordering::AcqRel) >= broker.max_connections() {
                        open.fetch_sub(1, Ordering::AcqRel);
                        broker
                            .metrics()
                            .connections_refused
                            .get_or_create(&crate::metrics::ListenerLabel {
                                listener: "quic".into(),
                            })
                            .inc();
                        tracing::warn!(peer = %incoming.remote_address(),
                            max_connections = broker.max_connections(),
                            "refusing a QUIC connection: the listener is at max_connections");
                        incoming.refuse();
                        continue;
                    }
                    let open = open.clone();
                    let broker = broker.clone();
                    tokio::spawn(async move {
                        handle_connection(incoming, broker).await;
                        open.fetch_sub(1, Ordering::AcqRel);
                    });
                }
                None => return,
            },
            _ = shutdown.wait_for(|s| *s) => {
                endpoint.close(0u32.into(), b"broker stopping");
                return;
            }
        }
    }
}

struct ConnGuard(Arc<Metrics>);
impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.connections_active.dec();
    }
}

/// Per-connection protocol state.
struct Session {
    hello: AtomicBool,
    features: AtomicU64,
    /// Open subscriptions on this connection: they split `subscriber_egress_max_bytes`.
    subscriptions: std::sync::atomic::AtomicUsize,
    /// Acked publishes read and not yet answered.
    answers_owed: AnswersOwed,
    /// The token presented in hello or by the last `Authenticate` (auth on only).
    credential: parking_lot::Mutex<Option<Arc<Credential>>>,
}

async fn handle_connection(incoming: quinn::Incoming, broker: Arc<Broker>) {
    let conn = match incoming.await {
        Ok(c) => c,
        Err(e) => {
            debug!(error = %e, "QUIC handshake failed");
            return;
        }
    };
    broker.metrics().connections_active.inc();
    let _guard = ConnGuard(broker.metrics().clone());
    let session = Arc::new(Session {
        hello: AtomicBool::new(false),
        features: AtomicU64::new(0),
        subscriptions: std::sync::atomic::AtomicUsize::new(0),
        answers_owed: AnswersOwed::default(),
        credential: parking_lot::Mutex::new(None),
    });
    loop {
        match conn.accept_bi().await {
            Ok((send, recv)) => {
                tokio::spawn(handle_stream(send, recv, broker.clone(), session.clone()));
            }
            Err(e) => {
                debug!(remote = %conn.remote_address(), error = %e, "connection closed");
                return;
            }
        }
    }
}

async fn respond(send: &mut quinn::SendStream, response: &Response) -> bool {
    let frame = Frame::new(FrameKind::Response, response, Bytes::new());
    send.write_all(&frame.encode()).await.is_ok()
}

fn error(code: u16, reason: &str, message: impl Into<String>) -> Response {
    Response::Error(ErrorBody::new(code, reason, message))
}

/// Records in a buffer of stored batches, from their headers only (they were CRC-checked
/// when read from the log).
fn count_records(buf: &[u8]) -> u64 {
    HeaderIter::new(buf)
        .map_while(Result::ok)
        .map(|(h, _)| h.records_count.max(0) as u64)
        .sum()
}

/// Serves one request stream: its request, or, on a connection that agreed to
/// `features::REUSED_STREAMS`, each frame in turn while the client keeps the stream open
/// after cache operations (`request_frames.rs`).
async fn handle_stream(
    mut send: quinn::SendStream,
    recv: quinn::RecvStream,
    broker: Arc<Broker>,
    session: Arc<Session>,
) {
    let max = broker.max_frame_bytes();
    let mut frames = FrameReader::new(recv);
    loop {
        let reusing = session.features.load(Ordering::Acquire) & features::REUSED_STREAMS != 0;
        let frame = match frames.next(max).await {
            Ok(f) => f,
            // The client finished its side after its last request (a stream that ends
            // before its first frame has nothing to answer either).
            Err(ReadError::Ended) => {
                let _ = send.finish();
                return;
            }
            Err(ReadError::Gone) => return,
            Err(ReadError::TooLarge(e)) => {
                broker.metrics().frames_rejected.inc();
                frames.stop();
                let e = error(codes::FRAME_TOO_LARGE, "frame_too_large", e.to_string());
                respond(&mut send, &e).await;
                let _ = send.finish();
                return;
            }
            // Read whole: on a reused stream the next frame follows it.
            Err(ReadError::Malformed(e)) => {
                broker.metrics().frames_rejected.inc();
                let e = error(codes::BAD_REQUEST, "malformed_frame", e.to_string());
                if respond(&mut send, &e).await && reusing {
                    continue;
                }
                let _ = send.finish();
                return;
            }
        };
        match serve_frame(&mut send, frame, &broker, &session, reusing).await {
            Served::Open => continue,
            Served::Done => {
                let _ = send.finish();
                return;
            }
        }
    }
}

/// What a stream is good for after a request was served.
enum Served {
    /// Answered, and the stream stays open for the client's next request.
    Open,
    /// The stream's work is over: its send side is finished.
    Done,
}

fn open_if(open: bool) -> Served {
    if open { Served::Open } else { Served::Done }
}

/// Serves one request frame; `reusing`: the connection agreed to `REUSED_STREAMS`, so a
/// cache operation's stream stays open after its answer.
async fn serve_frame(
    send: &mut quinn::SendStream,
    frame: Frame,
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    reusing: bool,
) -> Served {
    // A binary header (`features::BINARY_CACHE_HEADERS`, `BINARY_GROUP_HEADERS`) is
    // answered in binary.
    let binary = felix_wire::binary::is_binary(&frame.header);
    let binary_group = felix_wire::binary_groups::is_binary(&frame.header);
    let request: Request = match (frame.kind, felix_wire::binary::read_request(&frame.header)) {
        (FrameKind::Request, Ok(r)) => r,
        (FrameKind::Request, Err(e)) => {
            broker.metrics().frames_rejected.inc();
            respond(
                send,
                &error(codes::BAD_REQUEST, "malformed_request", e.to_string()),
            )
            .await;
            return open_if(reusing);
        }
        (kind, _) => {
            broker.metrics().frames_rejected.inc();
            respond(
                send,
                &error(
                    codes::BAD_REQUEST,
                    "malformed_request",
                    format!("expected a request frame, got {kind:?}"),
                ),
            )
            .await;
            return open_if(reusing);
        }
    };
    // A refusal of a cache operation keeps a reused stream open as its answer would.
    let open_after = open_if(
        reusing
            && matches!(&request, Request::Cache(r)
                if !matches!(r, felix_wire::cache::CacheRequest::Watch { .. })),
    );
    if !matches!(request, Request::Hello { .. }) && !session.hello.load(Ordering::Acquire) {
        respond(
            send,
            &error(
                codes::BAD_REQUEST,
                "hello_required",
                "the first request of a connection must be hello",
            ),
        )
        .await;
        return open_after;
    }
    // Authorization comes before any work (docs/security.md): a refused request changes
    // nothing and is not counted against the connection's publish answers.
    let checking = broker.access().enabled();
    let credential = if checking {
        session.credential.lock().clone()
    } else {
        None
    };
    if checking && let Err(e) = check_for(&request).run(broker.access(), credential.as_deref()) {
        broker.metrics().auth_refused(&e.reason);
        respond(send, &Response::Error(e)).await;
        return open_after;
    }
    let credential = credential.as_deref();
    // An acked publish owes an answer from here until it is written (`_owed` is dropped at
    // the end); past the connection's limit it is refused before anything is queued.
    let _owed = match &request {
        Request::Publish { tenant, ack, .. } if *ack != AckMode::None => {
            match session.answers_owed.take() {
                Some(owed) => Some(owed),
                None => {
                    broker
                        .metrics()
                        .publish_queue_full
                        .get_or_create(&TenantAction {
                            tenant: tenant.clone(),
                            action: "rejected".into(),
                        })
                        .inc();
                    respond(send, &Response::Error(too_many_owed(tenant))).await;
                    return Served::Done;
                }
            }
        }
        _ => None,
    };
    let response = match request {
        Request::Hello {
            version,
            features: offered,
            token,
            ..
        } => {
            let presented = match token {
                Some(t) if broker.access().enabled() => broker.access().authenticate(&t).map(Some),
                _ => Ok(None),
            };
            if version != PROTOCOL_VERSION {
                error(
                    codes::UNSUPPORTED_VERSION,
                    "unsupported_version",
                    format!(
                        "this broker speaks protocol version {PROTOCOL_VERSION}, not {version}"
                    ),
                )
            } else if let Err(e) = presented {
                broker.metrics().auth_refused(&e.reason);
                Response::Error(e)
            } else {
                if let Ok(Some(c)) = presented {
                    *session.credential.lock() = Some(c);
                }
                let agreed = offered & features::ALL;
                session.features.store(agreed, Ordering::Release);
                session.hello.store(true, Ordering::Release);
                Response::HelloOk {
                    version: PROTOCOL_VERSION,
                    features: agreed,
                    broker_id: broker.broker_id(),
                }
            }
        }
        Request::Authenticate { token } => authenticate(broker, session, &token),
        Request::MintToken {
            tenant,
            subject,
            namespace,
            roles,
            allow,
            ttl_secs,
        } => {
            let req = MintRequest {
                tenant,
                subject,
                namespace,
                roles,
                allow,
                ttl_secs,
            };
            match broker.access().mint_token(credential, req).await {
                Ok(m) => Response::Token {
                    token: m.token,
                    jti: m.jti,
                    expires_at: m.expires_at,
                },
                Err(e) => Response::Error(e),
            }
        }
        Request::RevokeToken { jti } => done(broker.access().revoke_token(credential, &jti).await),
        Request::PutRole { name, allow } => {
            done(broker.access().put_role(credential, &name, &allow).await)
        }
        Request::ListRoles {} => match broker.access().list_roles(credential) {
            Ok(roles) => Response::Roles { roles },
            Err(e) => Response::Error(e),
        },
        Request::DeleteRole { name } => done(broker.access().delete_role(credential, &name).await),
        Request::BindRole {
            tenant,
            subject,
            role,
        } => done(
            broker
                .access()
                .bind_role(credential, &tenant, &subject, &role)
                .await,
        ),
        Request::RotateKey {} => match broker.access().rotate_key(credential).await {
            Ok(kid) => Response::SigningKey { kid },
            Err(e) => Response::Error(e),
        },
        Request::PutOidcIssuer { issuer } => {
            done(broker.access().put_oidc_issuer(credential, issuer).await)
        }
        Request::ListOidcIssuers {} => match broker.access().list_oidc_issuers(credential) {
            Ok(issuers) => Response::OidcIssuers { issuers },
            Err(e) => Response::Error(e),
        },
        Request::DeleteOidcIssuer { issuer } => done(
            broker
                .access()
                .delete_oidc_issuer(credential, &issuer)
                .await,
        ),
        Request::ExchangeOidcToken { tenant, token } => {
            match broker.access().exchange_oidc(&token, Some(&tenant)).await {
                Ok(m) => Response::Token {
                    token: m.token,
                    jti: m.jti,
                    expires_at: m.expires_at,
                },
                Err(e) => {
                    if e.code == codes::UNAUTHORIZED {
                        broker.metrics().auth_refused(&e.reason);
                    }
                    Response::Error(e)
                }
            }
        }
        Request::CreateTenant { name } => done(broker.create_tenant(&name).await),
        Request::CreateNamespace { tenant, name } => {
            done(broker.create_namespace(&tenant, &name).await)
        }
        Request::CreateStream {
            tenant,
            namespace,
            name,
            config,
        } => stream(
            broker
                .create_stream(&tenant, &namespace, &name, config)
                .await,
        ),
        Request::AlterStream {
            tenant,
            namespace,
            name,
            config,
        } => stream(
            broker
                .alter_stream(&tenant, &namespace, &name, config)
                .await,
        ),
        Request::DescribeStream {
            tenant,
            namespace,
            name,
        } => stream(broker.describe_stream(&tenant, &namespace, &name).await),
        Request::ListStreams { tenant, namespace } => {
            match broker.list_streams(&tenant, &namespace).await {
                // Only what the caller may see (with auth off, everything).
                Ok(streams) => Response::Streams {
                    streams: streams
                        .into_iter()
                        .filter(|s| {
                            broker.access().can_view(
                                credential,
                                &felix_meta::auth::Resource::stream(&tenant, &namespace, &s.name),
                            )
                        })
                        .collect(),
                },
                Err(e) => Response::Error(e),
            }
        }
        Request::DeleteStream {
            tenant,
            namespace,
            name,
        } => done(broker.delete_stream(&tenant, &namespace, &name).await),
        Request::Publish {
            tenant,
            namespace,
            stream,
            shard,
            ack,
        } => match broker
            .publish_by(
                Publisher::client(credential.map(Credential::token)),
                &tenant,
                &namespace,
                &stream,
                shard,
                ack,
                frame.body,
            )
            .await
        {
            Ok(Some((base_offset, last_offset))) => Response::Published {
                shard,
                base_offset,
                last_offset,
            },
            Ok(None) => Response::Done {},
            Err(e) => Response::Error(e),
        },
        Request::Subscribe {
            tenant,
            namespace,
            stream,
            shard,
            from,
        } => {
            let lagged_feature =
                session.features.load(Ordering::Acquire) & features::SUBSCRIPTION_LAGGED != 0;
            session.subscriptions.fetch_add(1, Ordering::AcqRel);
            serve_subscription(
                send,
                broker,
                session,
                credential,
                &tenant,
                &namespace,
                &stream,
                shard,
                from,
                lagged_feature,
            )
            .await;
            session.subscriptions.fetch_sub(1, Ordering::AcqRel);
            return Served::Done;
        }
        Request::ProducerInit {} => match broker.producer_init().await {
            Ok((producer_id, epoch)) => Response::ProducerId { producer_id, epoch },
            Err(e) => Response::Error(e),
        },
        Request::ListSegments {
            tenant,
            namespace,
            stream,
        } => match broker.list_segments(&tenant, &namespace, &stream).await {
            Ok(segments) => Response::Segments { segments },
            Err(e) => Response::Error(e),
        },
        Request::Topology {
            tenant,
            namespace,
            stream,
        } => match broker.topology(&tenant, &namespace, &stream) {
            Ok((shards, brokers)) => Response::Topology { shards, brokers },
            Err(e) => Response::Error(e),
        },
        Request::PublishIf {
            tenant,
            namespace,
            stream,
            shard,
            expected_offset,
        } => match broker
            .publish_if(
                &tenant,
                &namespace,
                &stream,
                shard,
                expected_offset,
                frame.body,
            )
            .await
        {
            Ok((base_offset, last_offset)) => Response::Published {
                shard,
                base_offset,
                last_offset,
            },
            Err(e) => Response::Error(e),
        },
        Request::Cluster(request) => match crate::moves::admin::serve(broker, request).await {
            Ok(answer) => Response::Cluster(answer),
            Err(e) => Response::Error(e),
        },
        Request::Cache(request) => {
            if matches!(request, felix_wire::cache::CacheRequest::Watch { .. }) {
                crate::cache::watch::serve_watch(send, broker, credential, request).await;
                return Served::Done;
            }
            let token = credential.map(Credential::token);
            let (response, body) =
                crate::cache::requests::serve(broker, request, frame.body, token, false).await;
            let frame = Frame {
                kind: FrameKind::Response,
                header: felix_wire::binary::response_header(&response, binary),
                body,
            };
            let mut chunks = [Bytes::from(frame.encode_head()), frame.body];
            let written = send.write_all_chunks(&mut chunks).await.is_ok();
            return open_if(written && reusing);
        }
        Request::Group(request) => {
            // A client that goes away ends its parked poll (which then claims nothing);
            // a poll's answer carries its records as a body.
            let stopped = send.stopped();
            let (response, body) = tokio::select! {
                answer = crate::groups::requests::serve(broker, request) => answer,
                _ = stopped => return Served::Done,
            };
            let frame = Frame {
                kind: FrameKind::Response,
                header: felix_wire::binary_groups::response_header(&response, binary_group),
                body,
            };
            let mut chunks = [Bytes::from(frame.encode_head()), frame.body.clone()];
            let _ = send.write_all_chunks(&mut chunks).await;
            return Served::Done;
        }
    };
    respond(send, &response).await;
    Served::Done
}

/// `Authenticate`: a fresh token replaces the connection's; a bad one leaves it as it was.
fn authenticate(broker: &Broker, session: &Session, token: &str) -> Response {
    if !broker.access().enabled() {
        return Response::Done {};
    }
    match broker.access().authenticate(token) {
        Ok(c) => {
            *session.credential.lock() = Some(c);
            Response::Done {}
        }
        Err(e) => {
            broker.metrics().auth_refused(&e.reason);
            Response::Error(e)
        }
    }
}

fn done(r: Result<(), ErrorBody>) -> Response {
    match r {
        Ok(()) => Response::Done {},
        Err(e) => Response::Error(e),
    }
}

fn stream(r: Result<felix_wire::protocol::StreamInfo, ErrorBody>) -> Response {
    match r {
        Ok(stream) => Response::Stream { stream },
        Err(e) => Response::Error(e),
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve_subscription(
    send: &mut quinn::SendStream,
    broker: &Broker,
    session: &Session,
    credential: Option<&Credential>,
    tenant: &str,
    namespace: &str,
    stream: &str,
    shard: u32,
    from: felix_wire::protocol::StartAt,
    announce_lag: bool,
) {
    let mut sub = match broker
        .subscribe(tenant, namespace, stream, shard, from)
        .await
    {
        Ok(s) => s,
        Err(e) => {
            respond(send, &Response::Error(e)).await;
            return;
        }
    };
    if !announce_lag {
        // The spec: a client that did not offer the feature keeps its subscription and
        // sees a drop as a jump between consecutive offsets.
        sub.keep_through_drops();
    }
    let metrics = broker.metrics().clone();
    metrics.subscriptions_active.inc();
    let _guard = SubGuard(metrics.clone());
    if !respond(
        send,
        &Response::SubscribeOk {
            start_offset: sub.start_offset,
            live_offset: sub.live_offset,
        },
    )
    .await
    {
        return;
    }
    let tenant_label = Metrics::tenant(tenant);
    // A subscriber that goes away (stops the stream or closes the connection) is removed
    // at once, not at the next failed write, which on a quiet stream may never come.
    let stopped = send.stopped();
    tokio::pin!(stopped);
    // With auth on, an open subscription is cut once its token expires or is revoked
    // (checked every second against the local replica): it ends with the `unauthorized`
    // error, and the client resumes with a fresh token from the offsets it has seen.
    let mut recheck = tokio::time::interval(std::time::Duration::from_secs(1));
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let checking = broker.access().enabled();
    loop {
        let share = broker.subscriber_egress_max_bytes()
            / session.subscriptions.load(Ordering::Acquire).max(1);
        sub.set_egress_share(share);
        let event = tokio::select! {
            event = sub.next() => event,
            _ = &mut stopped => return,
            _ = recheck.tick(), if checking => match broker.access().still_live(credential) {
                Ok(()) => continue,
                Err(e) => SubEvent::Failed(e),
            },
        };
        let end = match event {
            SubEvent::Batches(b) => {
                let records = count_records(&b.bytes);
                let frame = Frame::new(
                    FrameKind::Event,
                    &Event::Records {
                        first_offset: b.first_offset,
                        next_offset: b.next_offset,
                    },
                    b.bytes,
                );
                // Head and body as two chunks: the stored batches go to QUIC without a copy.
                let mut chunks = [Bytes::from(frame.encode_head()), frame.body.clone()];
                if send.write_all_chunks(&mut chunks).await.is_err() {
                    return; // the subscriber went away
                }
                metrics
                    .sub_delivered_records
                    .get_or_create(&tenant_label)
                    .inc_by(records);
                continue;
            }
            SubEvent::Lagged { resume_offset } => {
                let mut body = ErrorBody::new(
                    codes::SUBSCRIPTION_LAGGED,
                    "subscription_lagged",
                    format!(
                        "the subscriber fell behind live delivery; resume from offset {resume_offset}"
                    ),
                );
                body.resume_offset = Some(resume_offset);
                if !announce_lag {
                    // Not reached (its queue skips drops), but should one come: end the
                    // stream; the offsets the client has seen tell it where to resume.
                    return;
                }
                body
            }
            SubEvent::Failed(body) => body,
            SubEvent::Closed => ErrorBody::new(
                codes::SHARD_UNAVAILABLE,
                "shard_closed",
                "the shard was closed (stream deleted or broker stopping)",
            ),
        };
        let frame = Frame::new(FrameKind::Event, &Event::End(end), Bytes::new());
        let _ = send.write_all(&frame.encode()).await;
        return;
    }
}

struct SubGuard(Arc<Metrics>);
impl Drop for SubGuard {
    fn drop(&mut self) {
        self.0.subscriptions_active.dec();
    }
}
