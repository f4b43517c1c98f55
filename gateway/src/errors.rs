//! How a failure inside the broker reaches a client: the one mapping from control-plane,
//! log and object-store errors to the protocol's typed errors.
//!
//! Invariant: every refusal a client sees carries a stable code and a reason naming the
//! remedy; the retryable ones (no leader yet, fenced, store unreachable) carry
//! `retry_after_ms`, and corruption names the tier and the object or segment.

use felix_cold::ColdError;
use felix_hot::LogError;
use felix_meta::MetaError;
use felix_meta::model::CommandError;
use felix_wire::protocol::{ErrorBody, codes};

use crate::corruption;

pub(crate) fn err(code: u16, reason: &str, message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(code, reason, message)
}

/// Maps a control-plane refusal to a protocol error.
pub fn command_error(e: &CommandError) -> ErrorBody {
    match e {
        CommandError::AlreadyExists { .. } => {
            err(codes::ALREADY_EXISTS, "already_exists", e.to_string())
        }
        CommandError::NotFound { kind, .. } => match kind.as_str() {
            "tenant" => err(codes::UNKNOWN_TENANT, "unknown_tenant", e.to_string()),
            "namespace" => err(codes::UNKNOWN_NAMESPACE, "unknown_namespace", e.to_string()),
            "stream" => err(codes::UNKNOWN_STREAM, "unknown_stream", e.to_string()),
            "shard" => err(codes::UNKNOWN_SHARD, "unknown_shard", e.to_string()),
            "group" => err(codes::UNKNOWN_GROUP, "unknown_group", e.to_string()),
            "role" => err(codes::INVALID_ARGUMENT, "unknown_role", e.to_string()),
            "binding" => err(codes::INVALID_ARGUMENT, "unknown_binding", e.to_string()),
            _ => err(codes::INVALID_ARGUMENT, "not_found", e.to_string()),
        },
        CommandError::VersionConflict { .. } => {
            err(codes::VERSION_CONFLICT, "version_conflict", e.to_string())
        }
        CommandError::NotEmpty { .. } => err(codes::NOT_EMPTY, "not_empty", e.to_string()),
        CommandError::Invalid(_) => err(codes::INVALID_ARGUMENT, "invalid_argument", e.to_string()),
        CommandError::StaleGeneration { .. } => {
            err(codes::SHARD_UNAVAILABLE, "fenced", e.to_string()).retry_after(200)
        }
        CommandError::MoveInProgress { .. } => {
            err(codes::MOVE_IN_PROGRESS, "move_in_progress", e.to_string()).retry_after(1000)
        }
        // The name frees itself once the old objects are gone (object_deletes.rs).
        CommandError::BeingDeleted { .. } => {
            err(codes::ALREADY_EXISTS, "stream_being_deleted", e.to_string()).retry_after(1000)
        }
    }
}

pub(crate) fn meta_error(e: MetaError) -> ErrorBody {
    match e {
        MetaError::Rejected(c) => command_error(&c),
        other => err(
            codes::METADATA_UNAVAILABLE,
            "metadata_unavailable",
            other.to_string(),
        )
        .retry_after(500),
    }
}
pub(crate) fn cold_error(e: &ColdError) -> ErrorBody {
    match e {
        ColdError::TooOld {
            requested,
            earliest,
        } => {
            let mut body = err(
                codes::OFFSET_TOO_OLD,
                "offset_too_old",
                format!(
                    "offset {requested} was removed by retention; the earliest offset is {earliest}"
                ),
            );
            body.earliest_offset = Some(*earliest);
            body
        }
        ColdError::Log(e) => log_error(e),
        ColdError::Segment { key, source } => corruption::detected(
            corruption::Tier::Cold,
            key,
            &format!("object {key}: {source}"),
        ),
        ColdError::Store(_) | ColdError::Fetch { .. } => err(
            codes::SHARD_UNAVAILABLE,
            "cold_tier_unavailable",
            format!("the object store holding this history cannot be read: {e}"),
        )
        .retry_after(1000),
        other => err(codes::INTERNAL, "cold_tier_error", other.to_string()),
    }
}

pub(crate) fn log_error(e: &LogError) -> ErrorBody {
    match e {
        LogError::InvalidBatch(w) => err(codes::BAD_REQUEST, "invalid_batch", w.to_string()),
        LogError::TrailingBytes { .. } => err(codes::BAD_REQUEST, "invalid_batch", e.to_string()),
        LogError::BatchTooLarge { .. } | LogError::DecompressesTooLarge { .. } => {
            err(codes::RECORD_TOO_LARGE, "record_too_large", e.to_string())
        }
        LogError::OffsetOutOfRange { .. } => err(
            codes::OFFSET_OUT_OF_RANGE,
            "offset_out_of_range",
            e.to_string(),
        ),
        LogError::Corrupt { segment, .. } => corruption::detected(
            corruption::Tier::Hot,
            &segment.display().to_string(),
            &e.to_string(),
        ),
        LogError::WriteRefused { .. } => err(
            codes::SHARD_UNAVAILABLE,
            "fenced",
            format!("{e}: this broker's lease lapsed before the write, so nothing was written"),
        )
        .retry_after(500),
        _ => err(codes::SHARD_UNAVAILABLE, "shard_unavailable", e.to_string()).retry_after(1000),
    }
}
