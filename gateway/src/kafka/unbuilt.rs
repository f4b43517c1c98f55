//! A group protocol Felix does not serve, refused so the client says so.
//!
//! A client that finds an API missing from ApiVersions may wait for ever without telling
//! its application: librdkafka's KIP-848 consumer (`group.protocol=consumer`) polls nothing
//! and only logs "not supported by broker". So its heartbeat is advertised and every one is
//! answered with `UNSUPPORTED_VERSION` and a message naming what to use instead, which
//! librdkafka treats as fatal and hands to the application. Nothing is kept for it.
//! (Share groups are served: see `share`.)

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};
use kafka_protocol::protocol::StrBytes;

const CONSUMER_PROTOCOL: &str = "Felix serves the classic consumer-group protocol only: \
    set group.protocol=classic (the consumer protocol of KIP-848 is not supported)";

/// ConsumerGroupHeartbeat (KIP-848): refused.
pub fn consumer_group_heartbeat(
    _request: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    ConsumerGroupHeartbeatResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_error_message(Some(StrBytes::from_static_str(CONSUMER_PROTOCOL)))
}
