//! One Kafka connection: length-prefixed request frames, read one at a time and answered in
//! order, as Kafka does (a client pipelines requests and matches answers by order and
//! correlation id).
//!
//! Decides what ends a connection: end of stream, a frame over `max_frame_bytes`, a request
//! this listener does not serve or cannot decode (never a panic: see [`super::api`]), a
//! response that cannot be written within [`WRITE_TIMEOUT`], [`super::IDLE_TIMEOUT`]
//! without a request, a request whose bytes do not all arrive within [`REQUEST_TIMEOUT`],
//! or the broker stopping, and with auth on, a request other than ApiVersions and SASL
//! before authentication, a failed authentication, or a request after the connection's
//! token expired or was revoked (see [`super::sasl`]). Each is logged with the peer's
//! address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tracing::{debug, warn};

use super::api::{self, Route};
use super::groups::{self, Caller};
use super::sasl::{self, SaslState};
use super::scope::Scope;
use super::{
    IDLE_TIMEOUT, Kafka, configs, delete_records, describe_partitions, describe_producers, fetch,
    list_offsets, partitions, produce, share, topics, unbuilt,
};

/// How long writing one response may take before the client is considered gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
enum FrameError {
    #[error("request of {len} bytes exceeds the limit of {max} (max_frame_bytes)")]
    TooLarge { len: i64, max: usize },
    #[error("a request of {len} bytes did not arrive within {REQUEST_TIMEOUT:?}")]
    Slow { len: usize },
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
}

/// One request's share of the broker's in-flight request bytes, held until its answer is
/// written; the gauge follows it.
struct InFlight {
    _permit: OwnedSemaphorePermit,
    bytes: i64,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec_by(self.bytes);
    }
}

/// Waits for a request's length prefix (up to [`IDLE_TIMEOUT`]); `None` at a clean end of
/// stream or when the connection was idle that long.
async fn read_prefix<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> Result<Option<usize>, FrameError> {
    let mut len = [0u8; 4];
    match tokio::time::timeout(IDLE_TIMEOUT, reader.read_exact(&mut len)).await {
        Err(_) => return Ok(None),
        Ok(Ok(_)) => {}
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Ok(Err(e)) => return Err(e.into()),
    }
    let len = i32::from_be_bytes(len);
    if len < 0 || len as usize > max {
        return Err(FrameError::TooLarge {
            len: i64::from(len),
            max,
        });
    }
    Ok(Some(len as usize))
}

/// Reads one length-prefixed request. Memory follows what the client has sent, not what
/// its prefix declares: the body is taken only once the declared bytes fit the broker's
/// in-flight budget, and read as it arrives, within [`REQUEST_TIMEOUT`] of its prefix (a
/// client that declares 16 MiB and stalls is cut off instead of pinning a buffer).
async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    kafka: &Kafka,
) -> Result<Option<(Bytes, InFlight)>, FrameError> {
    let Some(len) = read_prefix(reader, kafka.settings.max_request_bytes).await? else {
        return Ok(None);
    };
    kafka
        .broker
        .metrics()
        .kafka
        .received_bytes
        .inc_by(len as u64 + 4);
    let body = async {
        let want = u32::try_from(len.min(kafka.settings.max_inflight_request_bytes))
            .unwrap_or(u32::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS as u32);
        let permit = kafka
            .inflight
            .clone()
            .acquire_many_owned(want)
            .await
            .map_err(|_| FrameError::Io(std::io::ErrorKind::BrokenPipe.into()))?;
        let gauge = kafka.broker.metrics().kafka_inflight_request_bytes.clone();
        gauge.inc_by(len as i64);
        let held = InFlight {
            _permit: permit,
            bytes: len as i64,
            gauge,
        };
        let mut buf = BytesMut::with_capacity(len.min(READ_CHUNK));
        while buf.len() < len {
            let room = (len - buf.len()).min(READ_CHUNK);
            buf.reserve(room);
            let n = (&mut *reader).take(room as u64).read_buf(&mut buf).await?;
            if n == 0 {
                return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
        Ok((buf.freeze(), held))
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, body).await {
        Ok(r) => r.map(Some),
        Err(_) => {
            kafka.broker.metrics().kafka_slow_requests.inc();
            Err(FrameError::Slow { len })
        }
    }
}

/// A request's bytes must all arrive within this of its length prefix.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of a request body is asked of the socket at a time.
const READ_CHUNK: usize = 256 << 10;

/// What a connection knows about its client.
struct Session {
    peer: SocketAddr,
    /// The address the client reached us on: what Metadata and FindCoordinator advertise.
    advertised: SocketAddr,
    client_id: String,
    /// How long to read nothing more after this answer: a produce over its tenant's publish
    /// quota (Kafka's KIP-219 mute).
    muted_for: Duration,
    /// Whose topics and groups, and the credential requests are checked against.
    scope: Scope,
    sasl: SaslState,
    /// Close the connection once this answer is written (a failed authentication).
    close: bool,
}

/// Serves one connection (its two halves, plaintext or TLS) until it ends. `advertised`
/// is the address the client reached.
pub async fn serve<R, W>(
    reader: R,
    mut writer: W,
    peer: SocketAddr,
    advertised: SocketAddr,
    kafka: Arc<Kafka>,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut reader = BufReader::with_capacity(64 << 10, reader);
    let mut session = Session {
        peer,
        advertised,
        client_id: String::new(),
        muted_for: Duration::ZERO,
        scope: Scope::listener(&kafka),
        sasl: SaslState::new(),
        close: false,
    };
    loop {
        let frame = tokio::select! {
            read = read_frame(&mut reader, &kafka) => read,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        // Held until the answer is written: a request counts against the in-flight budget
        // while it is handled too.
        let (frame, _inflight) = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                debug!(%peer, "Kafka client closed the connection or was idle for {IDLE_TIMEOUT:?}");
                return;
            }
            Err(FrameError::Io(e)) => {
                debug!(%peer, error = %e, "Kafka connection failed");
                return;
            }
            Err(e) => {
                warn!(%peer, client = session.client_id, error = %e, "closing a Kafka connection");
                return;
            }
        };
        let answer = tokio::select! {
            answer = handle(&kafka, &mut session, frame) => answer,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        match answer {
            Ok(Some(bytes)) => {
                // Flushed too: over TLS the last records of a large answer can stay in the
                // session's buffer once the socket is full, until the next write, which
                // would not come before the client's next request.
                let write = async {
                    writer.write_all(&bytes).await?;
                    writer.flush().await
                };
                match tokio::time::timeout(WRITE_TIMEOUT, write).await {
                    Ok(Ok(())) => {
                        kafka
                            .broker
                            .metrics()
                            .kafka
                            .sent_bytes
                            .inc_by(bytes.len() as u64);
                    }
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "Kafka client went away before its answer");
                        return;
                    }
                    Err(_) => {
                        warn!(%peer, client = session.client_id, "Kafka client did not read its answer within {WRITE_TIMEOUT:?}; closing");
                        return;
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                warn!(%peer, client = session.client_id, error = %format!("{e:#}"), "closing a Kafka connection");
                return;
            }
        }
        if session.close {
            let _ = writer.flush().await;
            debug!(%peer, client = session.client_id, "closing a Kafka connection after its SASL refusal");
            return;
        }
        // Throttled for its tenant's publish quota: the answer (with throttle_time_ms) is
        // out; read nothing more until the throttle has passed, so that a client that
        // ignores it slows down all the same. The request's bytes are no longer in flight.
        let mute = std::mem::take(&mut session.muted_for);
        if !mute.is_zero() {
            drop(_inflight);
            tokio::select! {
                _ = tokio::time::sleep(mute) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }
}

/// Serves one request frame, counted in `felix_kafka_requests_total` by its API and
/// whether it was answered, and timed.
async fn handle(
    kafka: &Arc<Kafka>,
    session: &mut Session,
    frame: Bytes,
) -> anyhow::Result<Option<Bytes>> {
    let started = std::time::Instant::now();
    let api = api_label(session, &frame);
    let result = handle_frame(kafka, session, frame).await;
    kafka
        .broker
        .metrics()
        .kafka
        .request(&api, result.is_ok(), started.elapsed().as_secs_f64());
    result
}

/// The `api` label of a frame: its API's name, `unknown` for a key no API has.
fn api_label(session: &Session, frame: &[u8]) -> String {
    if sasl::expects_raw(&session.sasl) {
        return format!("{:?}", ApiKey::SaslAuthenticate);
    }
    api::prefix(frame)
        .ok()
        .and_then(|p| ApiKey::try_from(p.api_key).ok())
        .map_or_else(
            || crate::metrics::kafka::UNKNOWN_API.to_owned(),
            |k| format!("{k:?}"),
        )
}

/// Serves one request frame: the encoded answer, or `None` when none is due (`acks=0`).
async fn handle_frame(
    kafka: &Arc<Kafka>,
    session: &mut Session,
    frame: Bytes,
) -> anyhow::Result<Option<Bytes>> {
    if sasl::expects_raw(&session.sasl) {
        // After a v0 SaslHandshake: the frame is the bare SASL message, not a request.
        let answer = sasl::raw_authenticate(
            kafka,
            &mut session.sasl,
            &mut session.scope,
            &frame,
            &session.peer,
        )
        .await?;
        return Ok(Some(answer));
    }
    let prefix = api::prefix(&frame)?;
    let cid = prefix.correlation_id;
    let (api, version) = match api::route(&prefix)? {
        Route::Serve { api, version } => (api, version),
        Route::ApiVersionsTooNew => {
            let answer = api::api_versions(Some(ResponseError::UnsupportedVersion));
            return Ok(Some(api::encode_response(cid, 0, &answer)?));
        }
    };
    let mut buf = frame.clone();
    let result = serve_request(kafka, session, &mut buf, api, version, cid).await;
    if result.is_err() {
        let shown = &frame[..frame.len().min(256)];
        let hex: String = shown.iter().map(|b| format!("{b:02x}")).collect();
        debug!(peer = %session.peer, len = frame.len(), frame = hex, "refused request");
    }
    result
}

/// Decodes and serves a routed request.
async fn serve_request(
    kafka: &Arc<Kafka>,
    session: &mut Session,
    buf: &mut Bytes,
    api: ApiKey,
    version: i16,
    cid: i32,
) -> anyhow::Result<Option<Bytes>> {
    let header = api::decode_header(buf, api, version)?;
    if let Some(client_id) = &header.client_id
        && session.client_id.as_str() != client_id.as_str()
    {
        session.client_id = client_id.to_string();
    }
    macro_rules! serve {
        ($request:ty, |$r:ident| $answer:expr) => {{
            let $r: $request = api::decode_body(buf, api, version)?;
            let answer = $answer;
            Some(api::encode_response(cid, version, &answer)?)
        }};
    }
    gate(kafka, session, api)?;
    let advertised = session.advertised;
    let host = session.peer.ip().to_string();
    let caller = Caller {
        client_id: &session.client_id,
        host: &host,
    };
    let scope = &session.scope;
    let answer = match api {
        ApiKey::ApiVersions => serve!(ApiVersionsRequest, |_r| api::api_versions(None)),
        ApiKey::SaslHandshake => {
            let r: SaslHandshakeRequest = api::decode_body(buf, api, version)?;
            let (answer, go_on) = sasl::handshake(&mut session.sasl, &r, version);
            session.close = !go_on;
            Some(api::encode_response(cid, version, &answer)?)
        }
        ApiKey::SaslAuthenticate => {
            let r: SaslAuthenticateRequest = api::decode_body(buf, api, version)?;
            let (answer, go_on) = sasl::authenticate(
                kafka,
                &mut session.sasl,
                &mut session.scope,
                &r,
                &session.peer,
            )
            .await;
            session.close = !go_on;
            Some(api::encode_response(cid, version, &answer)?)
        }
        ApiKey::ConsumerGroupHeartbeat => serve!(ConsumerGroupHeartbeatRequest, |r| {
            unbuilt::consumer_group_heartbeat(r)
        }),
        ApiKey::ShareGroupHeartbeat => serve!(ShareGroupHeartbeatRequest, |r| {
            share::share_group_heartbeat(kafka, scope, r, caller).await
        }),
        ApiKey::ShareGroupDescribe => serve!(ShareGroupDescribeRequest, |r| {
            share::share_group_describe(kafka, scope, r).await
        }),
        ApiKey::ShareFetch => serve!(ShareFetchRequest, |r| share::share_fetch(kafka, scope, r)
            .await),
        ApiKey::ShareAcknowledge => serve!(ShareAcknowledgeRequest, |r| {
            share::share_acknowledge(kafka, scope, r).await
        }),
        ApiKey::DescribeShareGroupOffsets => serve!(DescribeShareGroupOffsetsRequest, |r| {
            share::describe_share_group_offsets(kafka, scope, r).await
        }),
        ApiKey::AlterShareGroupOffsets => serve!(AlterShareGroupOffsetsRequest, |r| {
            share::alter_share_group_offsets(kafka, scope, r).await
        }),
        ApiKey::DeleteShareGroupOffsets => serve!(DeleteShareGroupOffsetsRequest, |r| {
            share::delete_share_group_offsets(kafka, scope, r).await
        }),
        ApiKey::Metadata => serve!(MetadataRequest, |r| topics::metadata(
            kafka, scope, r, version, advertised
        )
        .await),
        ApiKey::DescribeProducers => serve!(DescribeProducersRequest, |r| {
            describe_producers::describe_producers(kafka, scope, r).await
        }),
        ApiKey::DescribeTopicPartitions => serve!(DescribeTopicPartitionsRequest, |r| {
            describe_partitions::describe_topic_partitions(kafka, scope, r, advertised).await
        }),
        ApiKey::Produce => {
            let r: ProduceRequest = api::decode_body(buf, api, version)?;
            let (answer, mute) = produce::produce(kafka, scope, r, version).await;
            session.muted_for = mute;
            match answer {
                Some(answer) => Some(api::encode_response(cid, version, &answer)?),
                None => None,
            }
        }
        ApiKey::Fetch => serve!(FetchRequest, |r| fetch::fetch(kafka, scope, r, version)
            .await),
        ApiKey::ListOffsets => serve!(ListOffsetsRequest, |r| list_offsets::list_offsets(
            kafka, scope, r
        )
        .await),
        ApiKey::CreateTopics => serve!(CreateTopicsRequest, |r| topics::create_topics(
            kafka, scope, r, version
        )
        .await),
        ApiKey::DeleteTopics => serve!(DeleteTopicsRequest, |r| topics::delete_topics(
            kafka, scope, r, version
        )
        .await),
        ApiKey::InitProducerId => serve!(InitProducerIdRequest, |r| produce::init_producer_id(
            kafka, scope, r
        )
        .await),
        ApiKey::FindCoordinator => serve!(FindCoordinatorRequest, |r| groups::find_coordinator(
            kafka, scope, r, version, advertised
        )),
        ApiKey::JoinGroup => serve!(JoinGroupRequest, |r| groups::join_group(
            kafka, scope, r, caller
        )
        .await),
        ApiKey::SyncGroup => serve!(SyncGroupRequest, |r| groups::sync_group(kafka, scope, r)
            .await),
        ApiKey::Heartbeat => serve!(HeartbeatRequest, |r| groups::heartbeat(kafka, scope, r)),
        ApiKey::LeaveGroup => serve!(LeaveGroupRequest, |r| groups::leave_group(
            kafka, scope, r, version
        )),
        ApiKey::OffsetCommit => serve!(OffsetCommitRequest, |r| groups::offset_commit(
            kafka, scope, r
        )
        .await),
        ApiKey::OffsetFetch => serve!(OffsetFetchRequest, |r| groups::offset_fetch(
            kafka, scope, r
        )
        .await),
        ApiKey::ListGroups => serve!(ListGroupsRequest, |r| groups::list_groups(kafka, scope, r)
            .await),
        ApiKey::DescribeGroups => {
            serve!(DescribeGroupsRequest, |r| groups::describe_groups(
                kafka, scope, r
            )
            .await)
        }
        ApiKey::DescribeConfigs => serve!(DescribeConfigsRequest, |r| configs::describe_configs(
            kafka, scope, r, version
        )
        .await),
        ApiKey::AlterConfigs => serve!(AlterConfigsRequest, |r| configs::alter_configs(
            kafka, scope, r
        )
        .await),
        ApiKey::IncrementalAlterConfigs => serve!(IncrementalAlterConfigsRequest, |r| {
            configs::incremental_alter_configs(kafka, scope, r).await
        }),
        ApiKey::CreatePartitions => serve!(CreatePartitionsRequest, |r| {
            partitions::create_partitions(kafka, scope, r).await
        }),
        ApiKey::DeleteRecords => serve!(DeleteRecordsRequest, |r| {
            delete_records::delete_records(kafka, scope, r).await
        }),
        ApiKey::DeleteGroups => serve!(DeleteGroupsRequest, |r| groups::delete_groups(
            kafka, scope, r
        )
        .await),
        // `route` admits only the APIs above.
        other => anyhow::bail!("{other:?} is not served"),
    };
    Ok(answer)
}

/// With auth on, what a request needs before it is even decoded: an authenticated
/// connection (but for ApiVersions and the SASL exchange itself) whose token is still live.
/// A refusal closes the connection: the client connects and authenticates again.
fn gate(kafka: &Kafka, session: &Session, api: ApiKey) -> anyhow::Result<()> {
    let access = kafka.broker.access();
    if !access.enabled()
        || matches!(
            api,
            ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
        )
    {
        return Ok(());
    }
    if !session.sasl.authenticated() {
        kafka.broker.metrics().auth_refused("missing_token");
        anyhow::bail!(
            "{api:?} before SASL authentication: auth is on, so this listener serves only \
             SASL clients (PLAIN or OAUTHBEARER with a Felix token)"
        );
    }
    if let Err(e) = access.still_live(session.scope.credential.as_deref()) {
        kafka.broker.metrics().auth_refused(&e.reason);
        anyhow::bail!(
            "{api:?} refused: {} ({}); the client must authenticate again",
            e.message,
            e.reason
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn length_prefixes_are_read_and_oversized_ones_refused() {
        let mut input: &[u8] = &[0, 0, 0, 3, 1, 2, 3, 0, 0, 0];
        let len = read_prefix(&mut input, 16)
            .await
            .expect("read")
            .expect("prefix");
        assert_eq!(len, 3);
        let mut rest: &[u8] = &input[3..];
        // A length cut short by the end of the stream is a closed connection, not a frame.
        assert!(read_prefix(&mut rest, 16).await.expect("eof").is_none());
        let mut big: &[u8] = &[0, 0, 1, 0];
        assert!(matches!(
            read_prefix(&mut big, 16).await,
            Err(FrameError::TooLarge { len: 256, .. })
        ));
        let mut negative: &[u8] = &[0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_prefix(&mut negative, 16).await,
            Err(FrameError::TooLarge { .. })
        ));
    }
}
