//! One Kafka connection: length-prefixed request frames, read one at a time and answered in
//! order, as Kafka does (a client pipelines requests and matches answers by order and
//! correlation id).
//!
//! Decides what ends a connection: end of stream, a frame over `max_frame_bytes`, a request
//! this listener does not serve or cannot decode (never a panic: see [`super::api`]), a
//! response that cannot be written within [`WRITE_TIMEOUT`], [`super::IDLE_TIMEOUT`]
//! without a request, or the broker stopping. Each is logged with the peer's address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::api::{self, Route};
use super::groups::{self, Caller};
use super::{IDLE_TIMEOUT, Kafka, configs, fetch, list_offsets, produce, topics};

/// How long writing one response may take before the client is considered gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
enum FrameError {
    #[error("request of {len} bytes exceeds the limit of {max} (max_frame_bytes)")]
    TooLarge { len: i64, max: usize },
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one length-prefixed frame; `None` at a clean end of stream.
async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> Result<Option<Bytes>, FrameError> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = i32::from_be_bytes(len);
    if len < 0 || len as usize > max {
        return Err(FrameError::TooLarge {
            len: i64::from(len),
            max,
        });
    }
    let mut buf = BytesMut::zeroed(len as usize);
    reader.read_exact(&mut buf).await?;
    Ok(Some(buf.freeze()))
}

/// What a connection knows about its client.
struct Session {
    peer: SocketAddr,
    /// The address the client reached us on: what Metadata and FindCoordinator advertise.
    advertised: SocketAddr,
    client_id: String,
}

/// Serves one connection until it ends.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    kafka: Arc<Kafka>,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let advertised = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => {
            debug!(%peer, error = %e, "Kafka connection without a local address");
            return;
        }
    };
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::with_capacity(64 << 10, reader);
    let mut session = Session {
        peer,
        advertised,
        client_id: String::new(),
    };
    let max = kafka.settings.max_request_bytes;
    loop {
        let frame = tokio::select! {
            read = tokio::time::timeout(IDLE_TIMEOUT, read_frame(&mut reader, max)) => read,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let frame = match frame {
            Ok(Ok(Some(frame))) => frame,
            Ok(Ok(None)) => {
                debug!(%peer, "Kafka client closed the connection");
                return;
            }
            Ok(Err(FrameError::Io(e))) => {
                debug!(%peer, error = %e, "Kafka connection failed");
                return;
            }
            Ok(Err(e)) => {
                warn!(%peer, client = session.client_id, error = %e, "closing a Kafka connection");
                return;
            }
            Err(_) => {
                debug!(%peer, "closing an idle Kafka connection");
                return;
            }
        };
        let answer = tokio::select! {
            answer = handle(&kafka, &mut session, frame) => answer,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        match answer {
            Ok(Some(bytes)) => {
                match tokio::time::timeout(WRITE_TIMEOUT, writer.write_all(&bytes)).await {
                    Ok(Ok(())) => {}
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
    }
}

/// Serves one request frame: the encoded answer, or `None` when none is due (`acks=0`).
async fn handle(
    kafka: &Arc<Kafka>,
    session: &mut Session,
    frame: Bytes,
) -> anyhow::Result<Option<Bytes>> {
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
    let advertised = session.advertised;
    let host = session.peer.ip().to_string();
    let caller = Caller {
        client_id: &session.client_id,
        host: &host,
    };
    let answer = match api {
        ApiKey::ApiVersions => serve!(ApiVersionsRequest, |_r| api::api_versions(None)),
        ApiKey::Metadata => serve!(MetadataRequest, |r| topics::metadata(
            kafka, r, version, advertised
        )
        .await),
        ApiKey::Produce => {
            let r: ProduceRequest = api::decode_body(buf, api, version)?;
            match produce::produce(kafka, r, version).await {
                Some(answer) => Some(api::encode_response(cid, version, &answer)?),
                None => None,
            }
        }
        ApiKey::Fetch => serve!(FetchRequest, |r| fetch::fetch(kafka, r, version).await),
        ApiKey::ListOffsets => serve!(ListOffsetsRequest, |r| list_offsets::list_offsets(kafka, r)
            .await),
        ApiKey::CreateTopics => serve!(CreateTopicsRequest, |r| topics::create_topics(
            kafka, r, version
        )
        .await),
        ApiKey::DeleteTopics => serve!(DeleteTopicsRequest, |r| topics::delete_topics(
            kafka, r, version
        )
        .await),
        ApiKey::InitProducerId => serve!(InitProducerIdRequest, |r| produce::init_producer_id(
            kafka, r
        )
        .await),
        ApiKey::FindCoordinator => serve!(FindCoordinatorRequest, |r| groups::find_coordinator(
            kafka, r, version, advertised
        )),
        ApiKey::JoinGroup => serve!(JoinGroupRequest, |r| groups::join_group(kafka, r, caller)
            .await),
        ApiKey::SyncGroup => serve!(SyncGroupRequest, |r| groups::sync_group(kafka, r).await),
        ApiKey::Heartbeat => serve!(HeartbeatRequest, |r| groups::heartbeat(kafka, r)),
        ApiKey::LeaveGroup => serve!(LeaveGroupRequest, |r| groups::leave_group(
            kafka, r, version
        )),
        ApiKey::OffsetCommit => serve!(OffsetCommitRequest, |r| groups::offset_commit(kafka, r)
            .await),
        ApiKey::OffsetFetch => serve!(OffsetFetchRequest, |r| groups::offset_fetch(kafka, r).await),
        ApiKey::ListGroups => serve!(ListGroupsRequest, |r| groups::list_groups(kafka, r).await),
        ApiKey::DescribeGroups => {
            serve!(DescribeGroupsRequest, |r| groups::describe_groups(kafka, r)
                .await)
        }
        ApiKey::DescribeConfigs => serve!(DescribeConfigsRequest, |r| configs::describe_configs(
            kafka, r, version
        )
        .await),
        ApiKey::AlterConfigs => serve!(AlterConfigsRequest, |r| configs::alter_configs(kafka, r)
            .await),
        ApiKey::IncrementalAlterConfigs => serve!(IncrementalAlterConfigsRequest, |r| {
            configs::incremental_alter_configs(kafka, r).await
        }),
        // `route` admits only the APIs above.
        other => anyhow::bail!("{other:?} is not served"),
    };
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_are_read_whole_and_oversized_ones_refused() {
        let mut input: &[u8] = &[0, 0, 0, 3, 1, 2, 3, 0, 0, 0];
        let frame = read_frame(&mut input, 16)
            .await
            .expect("read")
            .expect("frame");
        assert_eq!(&frame[..], &[1, 2, 3]);
        // A length cut short by the end of the stream is a closed connection, not a frame.
        assert!(read_frame(&mut input, 16).await.expect("eof").is_none());
        let mut big: &[u8] = &[0, 0, 1, 0];
        assert!(matches!(
            read_frame(&mut big, 16).await,
            Err(FrameError::TooLarge { len: 256, .. })
        ));
        let mut negative: &[u8] = &[0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame(&mut negative, 16).await,
            Err(FrameError::TooLarge { .. })
        ));
    }
}
