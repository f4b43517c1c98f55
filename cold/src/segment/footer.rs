//! Reading an object's footer: which shard and offsets it holds, where each row group lies
//! in offsets, time and bytes, and the content digest of each. Decides whether a Parquet
//! file is a Felix object this build reads. Invariant: a footer that parses describes row
//! groups that tile the object's offset range (no gap, no overlap, in order) within the
//! file's bytes, and a version 2 or 3 object without content digests is refused, so no reader
//! acts on a footer that contradicts itself.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::errors::ParquetError;
use parquet::file::metadata::{
    PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader, RowGroupMetaData,
};
use parquet::file::statistics::Statistics;

use super::digest::DigestKind;
use super::{
    EmptyBatch, FORMAT_VERSION, KEY_BASE, KEY_BATCHES, KEY_EMPTY_BATCHES, KEY_LAST, KEY_NAMESPACE,
    KEY_RECORDS, KEY_ROW_GROUP_DIGESTS, KEY_SHARD, KEY_STREAM, KEY_TENANT, KEY_VERSION,
    OLDEST_FORMAT_VERSION, ObjectInfo, SegmentError, SegmentSummary, arrow_schema, corrupt,
};

/// Where one row group lies, in offsets, time and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowGroupInfo {
    /// Base offset of its first batch (row groups tile the object: no gaps, no overlap).
    pub first_offset: u64,
    /// Last offset of its last batch.
    pub last_offset: u64,
    pub min_timestamp: i64,
    pub max_timestamp: i64,
    pub rows: u64,
    /// In the file: from the first column chunk's start to the last one's end.
    pub byte_range: Range<u64>,
    /// The row group's content digest (`felix.row_group_digests`, see `digest`), which
    /// [`decode_row_group`](super::decode_row_group) checks the rebuilt batches against.
    /// `None` in objects written before the digests existed: for those only the structure
    /// and offsets are checked.
    pub content_digest: Option<u32>,
}

/// The parsed footer of an object: everything needed to pick and fetch row groups.
#[derive(Debug, Clone)]
pub struct ObjectFooter {
    pub file_len: u64,
    pub info: ObjectInfo,
    pub summary: SegmentSummary,
    pub row_groups: Vec<RowGroupInfo>,
    pub(super) metadata: ArrowReaderMetadata,
    pub(super) empty_batches: Vec<EmptyBatch>,
    /// What the content digests cover (by the object's format version).
    pub(super) digest_kind: DigestKind,
}

impl ObjectFooter {
    /// Bytes to fetch from the end of the object to get the footer in one GET, usually.
    pub const SUFFIX_HINT: u64 = 64 * 1024;

    /// Parses the footer from the last `tail.len()` bytes of an object of `file_len` bytes.
    /// If the tail is too short, returns `Ok(Err(needed_suffix_len))` so the caller fetches
    /// that many bytes and retries. The page index is not loaded (row groups are fetched
    /// whole), so the suffix needed is the Parquet footer alone.
    pub fn parse(tail: &[u8], file_len: u64) -> Result<Result<ObjectFooter, u64>, SegmentError> {
        if tail.len() as u64 > file_len {
            return Err(SegmentError::InvalidArgument(format!(
                "a tail of {} bytes from an object of {file_len} bytes",
                tail.len()
            )));
        }
        let mut reader = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Skip);
        match reader.try_parse_sized(&Bytes::copy_from_slice(tail), file_len) {
            Ok(()) => {}
            Err(ParquetError::NeedMoreData(needed)) => return Ok(Err(needed as u64)),
            Err(e) => return Err(corrupt("parquet footer", e)),
        }
        let metadata = reader.finish().map_err(|e| corrupt("parquet footer", e))?;
        read_footer(metadata, file_len).map(Ok)
    }

    /// The row group holding `offset`, or the first one after it if `offset` falls in a gap
    /// (or before the object); `None` past the end.
    pub fn row_group_for(&self, offset: u64) -> Option<usize> {
        let i = self
            .row_groups
            .partition_point(|rg| rg.last_offset < offset);
        (i < self.row_groups.len()).then_some(i)
    }

    /// The first row group with a record at or after `timestamp_ms` (by max timestamp);
    /// `None` if none.
    pub fn row_group_for_time(&self, timestamp_ms: i64) -> Option<usize> {
        self.row_groups
            .iter()
            .position(|rg| rg.max_timestamp >= timestamp_ms)
    }

    /// The Parquet metadata (schema, row groups, column chunk statistics).
    pub fn parquet_metadata(&self) -> &Arc<ParquetMetaData> {
        self.metadata.metadata()
    }
}

/// The footer's key/value metadata.
struct FooterKv(HashMap<String, String>);

impl FooterKv {
    fn of(metadata: &ParquetMetaData) -> FooterKv {
        FooterKv(
            metadata
                .file_metadata()
                .key_value_metadata()
                .into_iter()
                .flatten()
                .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?)))
                .collect(),
        )
    }

    fn text(&self, key: &str) -> Result<String, SegmentError> {
        self.0
            .get(key)
            .cloned()
            .ok_or_else(|| bad(format!("no {key}")))
    }

    fn number<T: std::str::FromStr>(&self, key: &str) -> Result<T, SegmentError> {
        let text = self.text(key)?;
        text.parse()
            .map_err(|_| bad(format!("{key} is {text:?}, not a number")))
    }
}

/// Checks that a parsed Parquet footer is a Felix object this build reads, and extracts
/// what a reader needs from it.
fn read_footer(metadata: ParquetMetaData, file_len: u64) -> Result<ObjectFooter, SegmentError> {
    let kv = FooterKv::of(&metadata);
    let version =
        kv.0.get(KEY_VERSION)
            .ok_or_else(|| SegmentError::NotFelix(format!("no {KEY_VERSION} in the footer")))?;
    let version = match version.parse::<u32>() {
        Ok(v) if (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&v) => v,
        _ => {
            return Err(SegmentError::UnsupportedVersion {
                found: version.clone(),
            });
        }
    };
    let info = ObjectInfo {
        tenant: kv.text(KEY_TENANT)?,
        namespace: kv.text(KEY_NAMESPACE)?,
        stream: kv.text(KEY_STREAM)?,
        shard: kv.number(KEY_SHARD)?,
    };
    let base_offset: u64 = kv.number(KEY_BASE)?;
    let last_offset: u64 = kv.number(KEY_LAST)?;
    let records: u64 = kv.number(KEY_RECORDS)?;
    let batches: u64 = kv.number(KEY_BATCHES)?;
    if last_offset < base_offset {
        return Err(bad(format!(
            "last offset {last_offset} before base offset {base_offset}"
        )));
    }
    let empty_batches = empty_batches(&kv, base_offset, last_offset)?;

    let metadata = ArrowReaderMetadata::try_new(Arc::new(metadata), ArrowReaderOptions::new())
        .map_err(|e| bad(format!("schema: {e}")))?;
    if metadata.schema().fields() != arrow_schema().fields() {
        return Err(bad(format!(
            "schema {:?} is not Felix's",
            metadata.schema().fields()
        )));
    }
    let mut row_groups = row_group_infos(metadata.metadata(), base_offset, last_offset, file_len)?;
    match row_group_digests(&kv, row_groups.len())? {
        Some(digests) => {
            for (rg, digest) in row_groups.iter_mut().zip(digests) {
                rg.content_digest = Some(digest);
            }
        }
        None if version >= 2 => {
            return Err(SegmentError::Corrupt(format!(
                "a version {version} object without {KEY_ROW_GROUP_DIGESTS}"
            )));
        }
        None => {}
    }
    let rows: u64 = row_groups.iter().map(|rg| rg.rows).sum();
    if rows != records {
        return Err(bad(format!(
            "{KEY_RECORDS} says {records}, the row groups hold {rows}"
        )));
    }
    let summary = SegmentSummary {
        base_offset,
        last_offset,
        min_timestamp: row_groups
            .iter()
            .map(|r| r.min_timestamp)
            .min()
            .unwrap_or(0),
        max_timestamp: row_groups
            .iter()
            .map(|r| r.max_timestamp)
            .max()
            .unwrap_or(0),
        records,
        batches,
        row_groups: row_groups.len(),
    };
    Ok(ObjectFooter {
        file_len,
        info,
        summary,
        row_groups,
        metadata,
        empty_batches,
        digest_kind: DigestKind::of_version(version),
    })
}

/// The content digest of each row group; `None` for an object written without them.
fn row_group_digests(kv: &FooterKv, row_groups: usize) -> Result<Option<Vec<u32>>, SegmentError> {
    let Some(text) = kv.0.get(KEY_ROW_GROUP_DIGESTS) else {
        return Ok(None);
    };
    let digests = text
        .split(',')
        .map(|d| {
            (d.len() == 8)
                .then(|| u32::from_str_radix(d, 16).ok())
                .flatten()
                .ok_or_else(|| {
                    SegmentError::Corrupt(format!("{KEY_ROW_GROUP_DIGESTS}: {d:?} is not a digest"))
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    if digests.len() != row_groups {
        return Err(SegmentError::Corrupt(format!(
            "{KEY_ROW_GROUP_DIGESTS} has {} digests for {row_groups} row groups",
            digests.len()
        )));
    }
    Ok(Some(digests))
}

fn empty_batches(kv: &FooterKv, base: u64, last: u64) -> Result<Vec<EmptyBatch>, SegmentError> {
    let Some(json) = kv.0.get(KEY_EMPTY_BATCHES) else {
        return Ok(Vec::new());
    };
    let empties: Vec<EmptyBatch> =
        serde_json::from_str(json).map_err(|e| bad(format!("{KEY_EMPTY_BATCHES}: {e}")))?;
    let mut next = base;
    for e in &empties {
        if e.base_offset < next || e.last_offset < e.base_offset || e.last_offset > last {
            return Err(bad(format!(
                "empty batch {}..={} out of order or outside the object",
                e.base_offset, e.last_offset
            )));
        }
        next = e.last_offset + 1;
    }
    Ok(empties)
}

/// Where each row group lies. Row groups tile `base..=last`: the first starts at `base`,
/// each other one at its smallest `batch_offset`, and each ends one before the next starts.
fn row_group_infos(
    parquet: &ParquetMetaData,
    base: u64,
    last: u64,
    file_len: u64,
) -> Result<Vec<RowGroupInfo>, SegmentError> {
    let leaf = |name: &str| {
        parquet
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .position(|c| c.path().string() == name)
            .ok_or_else(|| bad(format!("no column {name}")))
    };
    let (offset_col, ts_col, batch_col) =
        (leaf("offset")?, leaf("timestamp")?, leaf("batch_offset")?);
    let mut infos: Vec<RowGroupInfo> = Vec::with_capacity(parquet.num_row_groups());
    // The largest record offset of each row group, checked once its end is known.
    let mut max_offsets = Vec::with_capacity(parquet.num_row_groups());
    for (i, rg) in parquet.row_groups().iter().enumerate() {
        let what = |s: &str| bad(format!("row group {i}: {s}"));
        let rows = u64::try_from(rg.num_rows())
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| what("no rows"))?;
        let stats = |col: usize, name: &str| {
            int64_range(rg, col).ok_or_else(|| what(&format!("no {name} statistics")))
        };
        let (min_offset, max_offset) = stats(offset_col, "offset")?;
        let (min_timestamp, max_timestamp) = stats(ts_col, "timestamp")?;
        let (min_batch, _) = stats(batch_col, "batch_offset")?;
        let first_offset = match infos.last_mut() {
            None => base,
            Some(prev) => {
                let first = u64::try_from(min_batch)
                    .ok()
                    .filter(|&f| f > prev.first_offset)
                    .ok_or_else(|| what("row groups out of offset order"))?;
                prev.last_offset = first - 1;
                first
            }
        };
        if min_batch < first_offset as i64 || min_offset < min_batch || max_offset > last as i64 {
            return Err(what("offsets outside the object's range"));
        }
        max_offsets.push(max_offset as u64);
        infos.push(RowGroupInfo {
            first_offset,
            last_offset: last,
            min_timestamp,
            max_timestamp,
            rows,
            byte_range: byte_range(rg, file_len)
                .ok_or_else(|| what("column chunks outside the file"))?,
            content_digest: None,
        });
    }
    if infos.is_empty() {
        return Err(bad("no row groups".into()));
    }
    for (i, (info, max_offset)) in infos.iter().zip(max_offsets).enumerate() {
        if max_offset > info.last_offset {
            return Err(bad(format!(
                "row group {i}: records past the start of the next row group"
            )));
        }
    }
    Ok(infos)
}

fn bad(message: String) -> SegmentError {
    SegmentError::BadMetadata(message)
}

fn int64_range(rg: &RowGroupMetaData, column: usize) -> Option<(i64, i64)> {
    match rg.columns().get(column)?.statistics()? {
        Statistics::Int64(s) => Some((*s.min_opt()?, *s.max_opt()?)),
        _ => None,
    }
}

/// The bytes of a row group's column chunks. Computed here rather than with
/// `ColumnChunkMetaData::byte_range`, which panics on negative values from a corrupt footer.
fn byte_range(rg: &RowGroupMetaData, file_len: u64) -> Option<Range<u64>> {
    let mut range: Option<Range<u64>> = None;
    for c in rg.columns() {
        let start = c.dictionary_page_offset().unwrap_or(c.data_page_offset());
        let start = u64::try_from(start).ok()?;
        let end = start.checked_add(u64::try_from(c.compressed_size()).ok()?)?;
        if end > file_len {
            return None;
        }
        range = Some(match range {
            None => start..end,
            Some(r) => r.start.min(start)..r.end.max(end),
        });
    }
    range
}
