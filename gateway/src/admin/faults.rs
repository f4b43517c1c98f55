//! The fault-injection switches of the admin API (`FELIX_FAULT_INJECTION=1` only; see
//! `felix_meta::faults`), for the cluster and shard-move tests. Each route is one switch:
//! `POST` turns it on, `DELETE` off, for a `cluster.manage` caller; on a broker without
//! fault injection every one answers 404 and changes nothing.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{MethodRouter, post};
use felix_meta::auth::{Action, Resource};

use super::{AdminState, ApiError, fault_injection_enabled};

/// One switch: its route, its setter, and the answers to `POST` (on) and `DELETE` (off).
struct Switch {
    path: &'static str,
    set: fn(bool),
    on: &'static str,
    off: &'static str,
}

const SWITCHES: &[Switch] = &[
    // Cuts this node off the internal network, or heals the cut.
    Switch {
        path: "/v1/faults/isolate",
        set: felix_meta::faults::set_isolated,
        on: "isolated",
        off: "healed",
    },
    // Holds this node's leader log writes after they were accepted, or lets them go on.
    Switch {
        path: "/v1/faults/stall_writes",
        set: felix_meta::faults::set_writes_stalled,
        on: "stalled",
        off: "resumed",
    },
    // Holds this broker's answers to publishes after their write, or lets them go.
    Switch {
        path: "/v1/faults/hold_answers",
        set: felix_meta::faults::set_answers_held,
        on: "held",
        off: "released",
    },
    // Holds this broker's shard hand-overs with their fence up, or lets them go on.
    Switch {
        path: "/v1/faults/hold_handovers",
        set: felix_meta::faults::set_handovers_held,
        on: "held",
        off: "released",
    },
    // Refuses requests to promote a joining broker to a voter, or lets them through.
    Switch {
        path: "/v1/faults/hold_promotions",
        set: felix_meta::faults::set_promotions_held,
        on: "held",
        off: "released",
    },
    // Holds this broker's cache compactions between floor record and snapshot.
    Switch {
        path: "/v1/faults/hold_compactions",
        set: felix_meta::faults::set_compactions_held,
        on: "held",
        off: "released",
    },
];

/// `router` with a route for every switch.
pub(super) fn routes(mut router: axum::Router<AdminState>) -> axum::Router<AdminState> {
    for s in SWITCHES {
        router = router.route(s.path, switch(s.set, s.on, s.off));
    }
    router
}

/// One switch's route: `POST` sets it and answers `on`, `DELETE` clears it and answers `off`.
fn switch(set: fn(bool), on: &'static str, off: &'static str) -> MethodRouter<AdminState> {
    post(
        move |state: State<AdminState>, headers: HeaderMap| async move {
            flip(state, &headers, set, true, on)
        },
    )
    .delete(
        move |state: State<AdminState>, headers: HeaderMap| async move {
            flip(state, &headers, set, false, off)
        },
    )
}

/// Flips one fault switch for a `cluster.manage` caller, only with fault injection on.
fn flip(
    State(state): State<AdminState>,
    headers: &HeaderMap,
    set: fn(bool),
    on: bool,
    answer: &'static str,
) -> Result<&'static str, ApiError> {
    fault_injection_enabled()?;
    state.require(headers, Action::ClusterManage, &Resource::Cluster)?;
    set(on);
    Ok(answer)
}
