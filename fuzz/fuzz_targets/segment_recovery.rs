//! A shard log written, closed, damaged as the input says (flipped bytes, cut files,
//! overwritten ranges, changed base offsets, garbage appended, files removed), reopened and
//! read from its first offset: it must refuse or serve exactly the records written at their
//! offsets, never panic. The case is `hot/tests/hot/damage_case.rs`, which the always-on
//! property test `hot::damage` runs too.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../hot/tests/hot/common.rs"]
mod common;
#[path = "../../hot/tests/hot/damage_case.rs"]
mod damage_case;

fuzz_target!(|data: &[u8]| {
    let (batches, damages) = damage_case::from_fuzz_input(data);
    damage_case::damaged_log_case(batches, damages);
});
