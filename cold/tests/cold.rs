//! felix-cold's integration tests, one binary; each area is a module under `tests/cold/`.

mod cold {
    mod object_damage;
    pub mod object_damage_case;
    mod segment;
    mod store;
    mod tiering;
}
