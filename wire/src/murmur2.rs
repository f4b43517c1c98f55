//! Which shard a key belongs to: murmur2 of the key bytes, made positive, modulo the shard
//! count — exactly the Kafka Java client's default partitioner, so a Felix producer and a
//! Kafka producer that use it send a key to the same shard.

/// Kafka's murmur2 (seed 0x9747b28c) of `data`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= (tail[2] as u32) << 16;
            h ^= (tail[1] as u32) << 8;
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        2 => {
            h ^= (tail[1] as u32) << 8;
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        1 => {
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The shard of `key` among `shards` (Kafka: `toPositive(murmur2(key)) % numPartitions`).
pub fn shard_for_key(key: &[u8], shards: u32) -> u32 {
    let positive = (murmur2(key) & 0x7fff_ffff) as u32;
    positive % shards.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_kafka_reference_values() {
        // Values from Kafka's own UtilsTest (murmur2 of these strings).
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58897971
        );
        assert_eq!(murmur2(b"abc"), 479470107);
    }

    #[test]
    fn a_key_always_maps_to_the_same_shard_within_range() {
        for shards in 1..20 {
            let s = shard_for_key(b"order-42", shards);
            assert!(s < shards);
            assert_eq!(s, shard_for_key(b"order-42", shards));
        }
    }
}
