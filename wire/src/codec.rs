//! The compression codecs a Kafka client may put on a batch's records (gzip, snappy, lz4,
//! zstd): which attribute bits name which codec, and how a records block is compressed and
//! decompressed. Invariant: no decompression produces more than its caller's limit, so a
//! small compressed block that expands without bound costs at most `limit` bytes of work.

use std::io::{Read, Write};

use crate::error::WireError;

/// The compression codec of a batch (attribute bits 0..=2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    /// The codec for attribute bits 0..=2.
    pub fn from_attribute(bits: u8) -> Result<Compression, WireError> {
        Ok(match bits {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            other => return Err(WireError::UnknownCodec(other)),
        })
    }
    /// The attribute bits of this codec.
    pub fn attribute(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }
    /// The codec's name as Kafka and Felix configuration spell it.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Compression::None),
            "gzip" => Ok(Compression::Gzip),
            "snappy" => Ok(Compression::Snappy),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            other => Err(format!(
                "unknown codec {other:?} (expected none, gzip, snappy, lz4 or zstd)"
            )),
        }
    }
}

/// The framing Kafka's Java client (via xerial snappy-java) puts around snappy blocks.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_BLOCK: usize = 32 * 1024;

pub(crate) fn compress(codec: Compression, input: &[u8]) -> Result<Vec<u8>, WireError> {
    let err = |reason: std::io::Error| WireError::Compression {
        codec: codec.name(),
        reason: reason.to_string(),
    };
    match codec {
        Compression::None => Ok(input.to_vec()),
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(input).map_err(err)?;
            enc.finish().map_err(err)
        }
        Compression::Snappy => {
            // xerial framing, as the Java producer writes it; every Kafka client reads it.
            let mut out = Vec::with_capacity(input.len() / 2 + 32);
            out.extend_from_slice(&XERIAL_MAGIC);
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            let mut enc = snap::raw::Encoder::new();
            for chunk in input.chunks(XERIAL_BLOCK) {
                let block = enc
                    .compress_vec(chunk)
                    .map_err(|e| WireError::Compression {
                        codec: "snappy",
                        reason: e.to_string(),
                    })?;
                out.extend_from_slice(&(block.len() as i32).to_be_bytes());
                out.extend_from_slice(&block);
            }
            Ok(out)
        }
        Compression::Lz4 => {
            let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
            enc.write_all(input).map_err(err)?;
            enc.finish().map_err(|e| WireError::Compression {
                codec: "lz4",
                reason: e.to_string(),
            })
        }
        Compression::Zstd => zstd::bulk::compress(input, 3).map_err(err),
    }
}

/// Copies a whole decompressing stream into `out`, refusing to produce more than `limit`
/// bytes; returns how many it produced.
fn copy_limited(
    reader: impl Read,
    codec: &'static str,
    limit: usize,
    out: &mut impl Write,
) -> Result<usize, WireError> {
    let cap = (limit as u64).saturating_add(1);
    let n = std::io::copy(&mut reader.take(cap), out).map_err(|e| WireError::Decompression {
        codec,
        reason: e.to_string(),
    })?;
    if n > limit as u64 {
        return Err(WireError::DecompressedTooLarge { limit });
    }
    Ok(n as usize)
}

/// A framed codec's streaming decoder and the codec's name.
type StreamDecoder<'a> = (Box<dyn Read + 'a>, &'static str);

/// The streaming decoder of a framed codec (gzip, lz4, zstd) over `input`; `None` for the
/// codecs that are not streamed (none, snappy).
fn stream_decoder(
    codec: Compression,
    input: &[u8],
) -> Result<Option<StreamDecoder<'_>>, WireError> {
    Ok(Some(match codec {
        Compression::None | Compression::Snappy => return Ok(None),
        Compression::Gzip => (Box::new(flate2::read::MultiGzDecoder::new(input)), "gzip"),
        Compression::Lz4 => (Box::new(lz4_flex::frame::FrameDecoder::new(input)), "lz4"),
        Compression::Zstd => {
            let dec = zstd::stream::read::Decoder::with_buffer(input).map_err(|e| {
                WireError::Decompression {
                    codec: "zstd",
                    reason: e.to_string(),
                }
            })?;
            (Box::new(dec), "zstd")
        }
    }))
}

/// How many bytes `input` decompresses to under `codec`, refusing with
/// [`WireError::DecompressedTooLarge`] as soon as that passes `limit` (the framed codecs are
/// streamed into a sink, so this holds no more than the decoder's own buffers).
pub(crate) fn decompressed_len(
    codec: Compression,
    input: &[u8],
    limit: usize,
) -> Result<usize, WireError> {
    let len = match stream_decoder(codec, input)? {
        Some((reader, name)) => copy_limited(reader, name, limit, &mut std::io::sink())?,
        None if codec == Compression::Snappy => snappy_decompress(input, limit)?.len(),
        None => input.len(),
    };
    if len > limit {
        return Err(WireError::DecompressedTooLarge { limit });
    }
    Ok(len)
}

pub(crate) fn decompress(
    codec: Compression,
    input: &[u8],
    limit: usize,
) -> Result<Vec<u8>, WireError> {
    match stream_decoder(codec, input)? {
        Some((reader, name)) => {
            let mut out = Vec::new();
            copy_limited(reader, name, limit, &mut out)?;
            Ok(out)
        }
        None if codec == Compression::Snappy => snappy_decompress(input, limit),
        None => Ok(input.to_vec()),
    }
}

fn snappy_decompress(input: &[u8], limit: usize) -> Result<Vec<u8>, WireError> {
    let fail = |reason: String| WireError::Decompression {
        codec: "snappy",
        reason,
    };
    let mut dec = snap::raw::Decoder::new();
    let mut raw_block = |block: &[u8], out: &mut Vec<u8>| -> Result<(), WireError> {
        let len = snap::raw::decompress_len(block).map_err(|e| fail(e.to_string()))?;
        if out.len().saturating_add(len) > limit {
            return Err(WireError::DecompressedTooLarge { limit });
        }
        let start = out.len();
        out.resize(start + len, 0);
        dec.decompress(block, &mut out[start..])
            .map_err(|e| fail(e.to_string()))?;
        Ok(())
    };
    let mut out = Vec::new();
    if !input.starts_with(&XERIAL_MAGIC) {
        // librdkafka and others may send a bare snappy block.
        raw_block(input, &mut out)?;
        return Ok(out);
    }
    let mut pos = XERIAL_MAGIC.len() + 8; // magic, version, compatible version
    if input.len() < pos {
        return Err(fail("xerial header cut short".into()));
    }
    while pos < input.len() {
        // snappy-java reads concatenated xerial streams (a new header where a block length
        // would be); its magic read as a length is negative, so this is never a real block.
        if input[pos..].starts_with(&XERIAL_MAGIC) {
            pos = pos
                .checked_add(XERIAL_MAGIC.len() + 8)
                .filter(|&p| p <= input.len())
                .ok_or_else(|| fail("xerial header cut short".into()))?;
            continue;
        }
        let len_bytes: [u8; 4] = input
            .get(pos..pos + 4)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| fail("xerial block length cut short".into()))?;
        let len = i32::from_be_bytes(len_bytes);
        pos += 4;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| pos.checked_add(l))
            .filter(|&e| e <= input.len())
            .ok_or_else(|| fail("xerial block longer than the input".into()))?;
        raw_block(&input[pos..end], &mut out)?;
        pos = end;
    }
    Ok(out)
}
