//! Every `ObjectStore` call routed through the [`Guard`]: what [`super::TierStore`] hands to
//! Parquet and `BufWriter`, so their calls are bounded like the facade's own. Decides how
//! each kind of call fits the guard: a GET of up to [`BUFFERED_GET_LIMIT`] bytes is read
//! whole inside its attempt, a larger one streams with `op_timeout` per chunk; a listing is
//! retried until its first item; a multipart part gets a permit and the timeout but no retry;
//! bulk deletes go [`DELETE_BATCH`] paths per request, a missing object counting as deleted.
//! Invariant: each call holds a permit for as long as it uses the store (a streaming GET
//! until its stream ends or is dropped).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, UploadPart,
};

use super::guard::{Guard, is_transient};
use super::{BUFFERED_GET_LIMIT, bump};

/// Paths deleted per bulk request.
const DELETE_BATCH: usize = 1000;

/// The inner store with the [`Guard`] applied to every call.
#[derive(Debug)]
pub(super) struct GuardedStore {
    pub(super) inner: Arc<dyn ObjectStore>,
    pub(super) guard: Guard,
}

impl fmt::Display for GuardedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TierStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for GuardedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let len = payload.content_length() as u64;
        let counters = &self.guard.counters;
        let result = self
            .guard
            .call("put", location, || {
                bump(&counters.puts, 1);
                self.inner.put_opts(location, payload.clone(), opts.clone())
            })
            .await?;
        bump(&counters.put_bytes, len);
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let counters = &self.guard.counters;
        let upload = self
            .guard
            .call("put_multipart", location, || {
                bump(&counters.puts, 1);
                self.inner.put_multipart_opts(location, opts.clone())
            })
            .await?;
        Ok(Box::new(GuardedUpload {
            inner: upload,
            guard: self.guard.clone(),
            location: location.clone(),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let counters = &self.guard.counters;
        if options.head {
            return self
                .guard
                .call("head", location, || {
                    bump(&counters.heads, 1);
                    self.inner.get_opts(location, options.clone())
                })
                .await;
        }
        self.guard
            .call_owned("get", location, |permit| {
                let options = options.clone();
                async move {
                    bump(&counters.gets, 1);
                    let result = self.inner.get_opts(location, options).await?;
                    let len = result.range.end.saturating_sub(result.range.start);
                    match result.payload {
                        GetResultPayload::Stream(body) if len <= BUFFERED_GET_LIMIT => {
                            let bytes = object_store::collect_bytes(body, Some(len)).await?;
                            bump(&counters.get_bytes, bytes.len() as u64);
                            Ok(GetResult {
                                payload: GetResultPayload::Stream(
                                    stream::once(async move { Ok(bytes) }).boxed(),
                                ),
                                ..result
                            })
                        }
                        GetResultPayload::Stream(body) => {
                            let counters = self.guard.counters.clone();
                            let body = body.inspect_ok(move |chunk| {
                                bump(&counters.get_bytes, chunk.len() as u64)
                            });
                            let body = self.guard.bounded_stream(
                                "get",
                                location.clone(),
                                body.boxed(),
                                permit,
                            );
                            Ok(GetResult {
                                payload: GetResultPayload::Stream(body),
                                ..result
                            })
                        }
                        // A local file is read later, by the caller.
                        payload @ GetResultPayload::File(..) => {
                            bump(&counters.get_bytes, len);
                            Ok(GetResult { payload, ..result })
                        }
                    }
                }
            })
            .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let inner = self.inner.clone();
        let guard = self.guard.clone();
        locations
            .ready_chunks(DELETE_BATCH)
            .then(move |batch| {
                let inner = inner.clone();
                let guard = guard.clone();
                async move { delete_batch(&inner, &guard, batch).await }
            })
            .flat_map(stream::iter)
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        let start_prefix = prefix.clone();
        self.guard
            .list_stream(prefix, move || inner.list(start_prefix.as_ref()))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        let start_prefix = prefix.clone();
        let offset = offset.clone();
        self.guard.list_stream(prefix, move || {
            inner.list_with_offset(start_prefix.as_ref(), &offset)
        })
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let location = prefix.cloned().unwrap_or_default();
        let counters = &self.guard.counters;
        self.guard
            .call("list", &location, || {
                bump(&counters.lists, 1);
                self.inner.list_with_delimiter(prefix)
            })
            .await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.guard
            .call("copy", from, || {
                self.inner.copy_opts(from, to, options.clone())
            })
            .await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.guard
            .call("rename", from, || {
                self.inner.rename_opts(from, to, options.clone())
            })
            .await
    }
}

/// Deletes one batch (one bulk request on S3), retrying it whole while it fails
/// transiently (deleting is idempotent). A missing object counts as deleted. A batch that
/// still fails after the retries yields its error once.
async fn delete_batch(
    inner: &Arc<dyn ObjectStore>,
    guard: &Guard,
    batch: Vec<object_store::Result<Path>>,
) -> Vec<object_store::Result<Path>> {
    let mut out = Vec::with_capacity(batch.len());
    let mut paths = Vec::with_capacity(batch.len());
    for item in batch {
        match item {
            Ok(path) => paths.push(path),
            Err(e) => out.push(Err(e)),
        }
    }
    let Some(first) = paths.first().cloned() else {
        return out;
    };
    let attempt = guard
        .call("delete", &first, || {
            bump(&guard.counters.deletes, paths.len() as u64);
            let request = stream::iter(paths.clone().into_iter().map(Ok)).boxed();
            let results = inner.delete_stream(request);
            async move {
                let results: Vec<object_store::Result<Path>> = results.collect().await;
                let mut done = Vec::with_capacity(results.len());
                for result in results {
                    match result {
                        Ok(path) => done.push(Ok(path)),
                        Err(object_store::Error::NotFound { path, .. }) => {
                            done.push(Ok(Path::from(path)))
                        }
                        // Retry the whole batch (the attempt fails) on a transient error.
                        Err(e) if is_transient(&e) => return Err(e),
                        Err(e) => done.push(Err(e)),
                    }
                }
                Ok(done)
            }
        })
        .await;
    match attempt {
        Ok(done) => out.extend(done),
        Err(e) => out.push(Err(e)),
    }
    out
}

/// A multipart upload whose parts, completion and abort each get a permit and the timeout.
#[derive(Debug)]
struct GuardedUpload {
    inner: Box<dyn MultipartUpload>,
    guard: Guard,
    location: Path,
}

#[async_trait]
impl MultipartUpload for GuardedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let len = data.content_length() as u64;
        let part = self.inner.put_part(data);
        let guard = self.guard.clone();
        let location = self.location.clone();
        Box::pin(async move {
            bump(&guard.counters.puts, 1);
            guard.once("put_part", &location, part).await?;
            bump(&guard.counters.put_bytes, len);
            Ok(())
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let location = self.location.clone();
        self.guard
            .once("complete_multipart", &location, self.inner.complete())
            .await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        let location = self.location.clone();
        self.guard
            .once("abort_multipart", &location, self.inner.abort())
            .await
    }
}
