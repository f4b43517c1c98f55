//! Damaged object bytes — flipped, overwritten, cut — never make the Parquet decoder panic
//! or return a record that was not written at that offset (see `object_damage_case.rs`,
//! which the cargo-fuzz target `object_decode` shares).

use proptest::prelude::*;

use super::object_damage_case::{BatchShape, ObjectDamage, damaged_object_case, from_fuzz_input};

fn shape() -> impl Strategy<Value = BatchShape> {
    (
        0u8..5,
        proptest::collection::vec((0usize..24, 0usize..200), 1..6),
    )
        .prop_map(|(codec, records)| BatchShape { codec, records })
}

fn damage() -> impl Strategy<Value = ObjectDamage> {
    prop_oneof![
        4 => (0.0..1.0f64, 1u8..=255).prop_map(|(at, mask)| ObjectDamage::Flip { at, mask }),
        2 => (0.0..1.0f64, proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| ObjectDamage::Overwrite { at, bytes }),
        1 => (0.0..1.0f64).prop_map(|at| ObjectDamage::Truncate { at }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn a_damaged_object_is_refused_or_decodes_to_exactly_what_was_written(
        shapes in proptest::collection::vec(shape(), 1..12),
        row_group_bytes in 256usize..4096,
        damages in proptest::collection::vec(damage(), 1..3),
    ) {
        damaged_object_case(shapes, row_group_bytes, damages);
    }

    /// The fuzz target's reading of raw bytes into a case, over random bytes: it must make
    /// cases (never refuse or panic) that hold the same promise.
    #[test]
    fn fuzz_inputs_of_any_bytes_make_object_cases_that_hold_the_same_promise(
        data in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let (shapes, row_group_bytes, damages) = from_fuzz_input(&data);
        damaged_object_case(shapes, row_group_bytes, damages);
    }
}
