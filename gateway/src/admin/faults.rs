//! Fault-injection switches added for the shard-move tests (`FELIX_FAULT_INJECTION=1`
//! only; see `felix_meta::faults`): each flips one switch for a `cluster.manage` caller.

use axum::extract::State;
use axum::http::HeaderMap;

use super::api::{AdminState, ApiError};
use super::fault_switch;

/// Holds this broker's answers to publishes after their write (`POST`), or lets them go
/// (`DELETE`).
pub(super) async fn hold_answers(
    state: State<AdminState>,
    headers: HeaderMap,
) -> Result<&'static str, ApiError> {
    fault_switch(
        state,
        &headers,
        felix_meta::faults::set_answers_held,
        true,
        "held",
    )
}

pub(super) async fn release_answers(
    state: State<AdminState>,
    headers: HeaderMap,
) -> Result<&'static str, ApiError> {
    fault_switch(
        state,
        &headers,
        felix_meta::faults::set_answers_held,
        false,
        "released",
    )
}

/// Holds this broker's shard hand-overs with their fence up (`POST`), or lets them go on
/// (`DELETE`).
pub(super) async fn hold_handovers(
    state: State<AdminState>,
    headers: HeaderMap,
) -> Result<&'static str, ApiError> {
    fault_switch(
        state,
        &headers,
        felix_meta::faults::set_handovers_held,
        true,
        "held",
    )
}

pub(super) async fn release_handovers(
    state: State<AdminState>,
    headers: HeaderMap,
) -> Result<&'static str, ApiError> {
    fault_switch(
        state,
        &headers,
        felix_meta::faults::set_handovers_held,
        false,
        "released",
    )
}
