//! A cold object (Parquet) encoded from batches the input shapes, damaged as the input says
//! (flipped bytes, overwritten ranges, a cut), then its footer parsed and every row group
//! decoded: each must be refused or decode to exactly the records written at their offsets,
//! never panic. The case is `cold/tests/cold/object_damage_case.rs`, which the always-on
//! property test `cold::object_damage` runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../cold/tests/cold/object_damage_case.rs"]
mod object_damage_case;

fuzz_target!(|data: &[u8]| {
    let (shapes, row_group_bytes, damages) = object_damage_case::from_fuzz_input(data);
    object_damage_case::damaged_object_case(shapes, row_group_bytes, damages);
});
