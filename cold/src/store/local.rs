//! The `file://` store (a local directory, the embedded default): object_store's local file
//! system, with ranged GETs read into a buffer that is not zeroed first.
//!
//! object_store reads a local GET's bytes into a buffer it fills with zeros and then reads
//! over; in a cold replay from a `file://` store that memset was about 3% of the broker's CPU
//! (a perf profile of a 1 GiB cold-empty replay, release build). Here the body is read by
//! `pread` into the buffer's spare capacity, and handed on as a one-chunk stream, which
//! `GetResult::bytes` passes through without a copy. Everything else (HEADs, PUTs, lists,
//! deletes, the object metadata of a GET) is object_store's own.

use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

/// A local directory as an object store.
#[derive(Debug)]
pub(super) struct LocalDir {
    inner: LocalFileSystem,
}

impl LocalDir {
    pub(super) fn new(inner: LocalFileSystem) -> LocalDir {
        LocalDir { inner }
    }
}

impl fmt::Display for LocalDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

/// `range` of `file` (at `path`, for errors), all of it or an error: a file that ends
/// before the range does (truncated since its size was read) is an error, not short data.
fn read_exact_range(
    file: &File,
    path: &std::path::Path,
    range: Range<u64>,
) -> Result<Bytes, String> {
    let len = usize::try_from(range.end - range.start)
        .map_err(|_| format!("{}: range {range:?} is too large", path.display()))?;
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let filled = buf.len();
        let spare = buf.spare_capacity_mut();
        let at = libc::off_t::try_from(range.start + filled as u64)
            .map_err(|_| format!("{}: offset past what the OS can read", path.display()))?;
        // SAFETY: `spare` is the vector's allocated, unused capacity of `len - filled`
        // bytes; pread writes at most that many bytes into it and nothing else.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                len - filled,
                at,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("{}: read at {at}: {e}", path.display()));
        }
        if n == 0 {
            return Err(format!(
                "{}: the file ends at {} but the range {range:?} was asked for",
                path.display(),
                range.start + filled as u64
            ));
        }
        // SAFETY: pread initialised the next `n` bytes of the spare capacity.
        unsafe { buf.set_len(filled + n as usize) };
    }
    Ok(Bytes::from(buf))
}

#[async_trait]
impl ObjectStore for LocalDir {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        // A HEAD's payload is never read: leave it to object_store.
        let head = options.head;
        let mut result = self.inner.get_opts(location, options).await?;
        if head {
            return Ok(result);
        }
        let payload = std::mem::replace(
            &mut result.payload,
            GetResultPayload::Stream(stream::empty().boxed()),
        );
        let GetResultPayload::File(file, path) = payload else {
            result.payload = payload;
            return Ok(result);
        };
        let range = result.range.clone();
        let body = tokio::task::spawn_blocking(move || read_exact_range(&file, &path, range))
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "LocalFileSystem",
                source: e.into(),
            })?
            .map_err(|e| object_store::Error::Generic {
                store: "LocalFileSystem",
                source: e.into(),
            })?;
        result.payload = GetResultPayload::Stream(stream::once(async move { Ok(body) }).boxed());
        Ok(result)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    /// Ranged GETs answer exactly what object_store's local store answers over the same
    /// directory: the bytes asked for (whole object, middle, tail), a range running past the
    /// end cut at the end, one starting past it refused; a whole GET, a HEAD (which reads
    /// nothing) and an empty object too.
    #[tokio::test]
    async fn ranged_gets_answer_as_object_stores_own_local_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalDir::new(LocalFileSystem::new_with_prefix(dir.path()).expect("fs"));
        let plain = LocalFileSystem::new_with_prefix(dir.path()).expect("fs");
        let data = Bytes::from(
            (0..300_000u32)
                .map(|i| (i % 251) as u8)
                .collect::<Vec<u8>>(),
        );
        let key = Path::from("a/object");
        store.put(&key, data.clone().into()).await.expect("put");
        for range in [0..300_000u64, 1..2, 12_345..200_001, 299_999..300_000] {
            let got = store.get_range(&key, range.clone()).await.expect("get");
            assert_eq!(got, data.slice(range.start as usize..range.end as usize));
        }
        let cut = store.get_range(&key, 299_000..300_001).await.expect("get");
        assert_eq!(cut, data.slice(299_000..));
        assert_eq!(
            cut,
            plain.get_range(&key, 299_000..300_001).await.expect("get")
        );
        assert!(store.get_range(&key, 300_001..300_002).await.is_err());
        assert!(plain.get_range(&key, 300_001..300_002).await.is_err());
        let whole = store
            .get(&key)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("body");
        assert_eq!(whole, data);
        assert_eq!(store.head(&key).await.expect("head").size, 300_000);
        store
            .put(&Path::from("empty"), Bytes::new().into())
            .await
            .expect("put");
        let empty = store.get(&Path::from("empty")).await.expect("get");
        assert!(empty.bytes().await.expect("body").is_empty());
        assert!(store.get(&Path::from("missing")).await.is_err());
    }

    /// A file shorter than the range asked for (truncated after its size was read) is an
    /// error naming where it ended, never short data.
    #[test]
    fn a_truncated_file_is_an_error_not_short_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, vec![1u8; 1000]).expect("write");
        let file = File::open(&path).expect("open");
        assert_eq!(
            read_exact_range(&file, &path, 10..1000)
                .expect("read")
                .len(),
            990
        );
        let e = read_exact_range(&file, &path, 500..1500).expect_err("short");
        assert!(e.contains("ends at 1000"), "{e}");
    }
}
