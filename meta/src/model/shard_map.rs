//! (De)serializes a map keyed by [`ShardKey`] as a list of `[key, value]` pairs: JSON map
//! keys must be strings, and a shard key is a struct. Also reads a JSON object, the form
//! such a map took while it was always empty (a non-empty one could not be written).
//!
//! Decides how shard-keyed maps look in snapshots and dumps; the invariant is that every
//! form ever written still reads back.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

use super::names::ShardKey;

pub fn serialize<S: Serializer, V: Serialize>(
    map: &BTreeMap<ShardKey, V>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut seq = serializer.serialize_seq(Some(map.len()))?;
    for pair in map {
        seq.serialize_element(&pair)?;
    }
    seq.end()
}

pub fn deserialize<'de, D: Deserializer<'de>, V: Deserialize<'de>>(
    deserializer: D,
) -> Result<BTreeMap<ShardKey, V>, D::Error> {
    struct Pairs<V>(PhantomData<V>);
    impl<'de, V: Deserialize<'de>> Visitor<'de> for Pairs<V> {
        type Value = BTreeMap<ShardKey, V>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of [shard, value] pairs")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut map = BTreeMap::new();
            while let Some((k, v)) = seq.next_element::<(ShardKey, V)>()? {
                map.insert(k, v);
            }
            Ok(map)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut map = BTreeMap::new();
            while let Some((k, v)) = m.next_entry::<ShardKey, V>()? {
                map.insert(k, v);
            }
            Ok(map)
        }
    }
    deserializer.deserialize_any(Pairs(PhantomData))
}
