//! Group protocols Felix does not serve yet, refused so the client says so.
//!
//! A client that finds an API missing from ApiVersions may wait for ever without telling
//! its application: librdkafka's KIP-848 consumer (`group.protocol=consumer`) and its share
//! consumer poll nothing and only log "not supported by broker". So these heartbeats are
//! advertised and every one is answered with `UNSUPPORTED_VERSION` and a message naming
//! what to use instead, which librdkafka treats as fatal and hands to the application.
//! Nothing is kept for them. (Share groups are planned; KIP-848 groups are not.)

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse,
};
use kafka_protocol::protocol::StrBytes;

const CONSUMER_PROTOCOL: &str = "Felix serves the classic consumer-group protocol only: \
    set group.protocol=classic (the consumer protocol of KIP-848 is not supported)";
const SHARE_GROUPS: &str = "Felix does not serve share groups yet: use a classic consumer \
    group (group.protocol=classic)";

/// ConsumerGroupHeartbeat (KIP-848): refused.
pub fn consumer_group_heartbeat(
    _request: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    ConsumerGroupHeartbeatResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_error_message(Some(StrBytes::from_static_str(CONSUMER_PROTOCOL)))
}

/// ShareGroupHeartbeat (KIP-932): refused until share groups exist.
pub fn share_group_heartbeat(_request: ShareGroupHeartbeatRequest) -> ShareGroupHeartbeatResponse {
    ShareGroupHeartbeatResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_error_message(Some(StrBytes::from_static_str(SHARE_GROUPS)))
}
