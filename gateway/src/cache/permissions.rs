//! Which permission each cache request needs: `cache.read` to read (get, counter get,
//! watch), `cache.write` to change (put, delete, counter add), `cache.manage` to create and
//! drop. Checked at the broker a client reaches and again at the key's owner.

use felix_meta::auth::Action;
use felix_wire::cache::CacheRequest;

/// The action a cache request needs on its cache.
pub(crate) fn action_of(request: &CacheRequest) -> Action {
    match request {
        CacheRequest::Get { .. } | CacheRequest::CounterGet { .. } | CacheRequest::Watch { .. } => {
            Action::CacheRead
        }
        CacheRequest::Put { .. }
        | CacheRequest::Delete { .. }
        | CacheRequest::CounterAdd { .. } => Action::CacheWrite,
        _ => Action::CacheManage,
    }
}
