//! The shard log's promises, one test binary for the crate (modules under tests/hot/).

mod hot {
    mod append_read;
    pub mod common;
    mod crash;
    mod damage;
    pub mod damage_case;
    mod recovery;
    mod repair;
    mod shared_read;
}
