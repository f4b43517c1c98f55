//! The QUIC transport bounds both ends of the client protocol use: datagram size, flow
//! control windows and keep-alive. Invariant: the broker and the client read these from one
//! place, so the two ends cannot drift apart (each still builds its own quinn
//! configuration; this crate does no I/O).

use std::time::Duration;

/// The largest UDP payload the broker and the client send or accept. QUIC starts at 1200
/// bytes and MTU discovery probes up to this bound, so a path only ever carries what it has
/// been seen to deliver: ~1452 on a 1500-byte Ethernet path, the bound on a jumbo-frame
/// network or on loopback. Large datagrams matter because much of QUIC's cost is per packet
/// (building, header protection, loss tracking, acknowledging): at fanout 10 on loopback the
/// default bound of 1452 cost a third of the throughput (docs/architecture.md has the
/// figures).
///
/// Why no higher: quinn 0.11 hands the kernel up to 10 datagrams in one segmentation-offload
/// send, the kernel refuses a send over 65,507 bytes, and quinn then turns offload off for
/// the socket for good. 10 × 6,500 stays under it.
pub const MAX_UDP_PAYLOAD: u16 = 6_500;
const _: () = assert!(10 * MAX_UDP_PAYLOAD as usize <= 65_507);

/// How often an idle connection sends a keep-alive (well inside the idle timeout).
pub const KEEP_ALIVE: Duration = Duration::from_secs(2);
/// Receive window of one stream: a whole maximum frame (16 MiB) fits without a stall.
pub const STREAM_WINDOW: u32 = 16 * 1024 * 1024;
/// Receive (and send) window of a connection, across its streams.
pub const CONNECTION_WINDOW: u32 = 64 * 1024 * 1024;
