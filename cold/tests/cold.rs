//! felix-cold's integration tests, one binary; each area is a module under `tests/cold/`.

mod cold {
    mod segment;
    mod store;
    mod tiering;
}
