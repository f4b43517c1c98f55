//! Whether rebuilt row groups are checked against their content digests: always, except in
//! a benchmark that measures what the check costs (`cold_skip_content_digests`, accepted
//! only with `FELIX_FAULT_INJECTION=1`). One switch for the process, set once at start.
//! Everything else a cold read checks (offsets against the footer and the manifest, batch
//! CRCs of cached row groups) stays on either way.

use std::sync::atomic::{AtomicBool, Ordering};

static SKIP: AtomicBool = AtomicBool::new(false);

/// Turns the content-digest check of rebuilt row groups off (`true`) or on. For
/// benchmarks only: with it off, bytes that rotted in a way Parquet still decodes are
/// served.
pub fn skip_content_digests(skip: bool) {
    SKIP.store(skip, Ordering::Relaxed);
}

pub(super) fn content_digests_checked() -> bool {
    !SKIP.load(Ordering::Relaxed)
}
