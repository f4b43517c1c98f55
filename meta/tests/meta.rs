//! felix-meta's integration tests, one binary; each area is a module under `tests/meta/`.

mod meta {
    mod cluster;
    mod failover;
    mod force;
    mod moves;
    mod placement;
    mod storage;
    mod zones;
}
