//! Random damage to a closed log's files — flipped bytes, cut files, overwritten ranges,
//! changed base offsets, garbage appended, files removed — never makes the log panic or
//! serve a record that was not written at that offset (see `damage_case.rs`, which the
//! cargo-fuzz target `segment_recovery` shares).

use proptest::prelude::*;

use super::damage_case::{Damage, damaged_log_case, from_fuzz_input};

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        4 => (0.0..1.0f64, 1u8..=255).prop_map(|(at, mask)| Damage::Flip { at, mask }),
        2 => (0.0..1.0f64).prop_map(|at| Damage::Truncate { at }),
        2 => (0.0..1.0f64, proptest::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(at, bytes)| Damage::Overwrite { at, bytes }),
        1 => proptest::collection::vec(any::<u8>(), 1..256).prop_map(|bytes| Damage::Append { bytes }),
        2 => (0.0..1.0f64, prop_oneof![-3i64..=-1, 1i64..=3])
            .prop_map(|(at, delta)| Damage::Rebase { at, delta }),
        1 => Just(Damage::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn damaged_log_files_are_refused_or_serve_only_what_was_written(
        batches in proptest::collection::vec((1usize..4, 1usize..80), 4..20),
        damages in proptest::collection::vec((any::<usize>(), damage()), 1..4),
    ) {
        damaged_log_case(batches, damages);
    }

    /// The fuzz target's reading of raw bytes into a case, over random bytes: it must make
    /// cases (never refuse or panic) that hold the same promise.
    #[test]
    fn fuzz_inputs_of_any_bytes_make_cases_that_hold_the_same_promise(
        data in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let (batches, damages) = from_fuzz_input(&data);
        damaged_log_case(batches, damages);
    }
}
