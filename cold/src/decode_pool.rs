//! The threads that decode cold row groups (zstd, Arrow, rebuilding record batches).
//!
//! Decoding is the one CPU-heavy step of a cold read, and a catch-up reader with read-ahead
//! asks for several row groups at once. On tokio's blocking pool those decodes would run as
//! many at a time as were asked for, at the same priority as the publish path, and a broker
//! with two cores would answer its publishers late while a consumer replays history (the
//! spec: cold reads must not slow the publish path). So decodes run here instead:
//!
//! * a fixed number of threads (`cold_decode_threads`), so concurrent cold readers queue
//!   for them rather than take every core; and
//! * at a lower scheduling priority (nice +10 on Linux), so when publishing and a replay
//!   compete for CPU the publishes win and the replay takes what is left. On an idle
//!   machine a lower priority costs nothing.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, mpsc};

/// How much lower than the broker's other threads the decode threads run (added to the
/// nice value; Linux only).
pub const DECODE_NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of low-priority threads that run decode jobs in arrival order. Dropping the
/// pool lets its threads finish the queued jobs and exit.
pub struct DecodePool {
    jobs: mpsc::Sender<Job>,
    threads: usize,
}

/// The pool's threads are gone (only if every one of them died), or the job panicked.
#[derive(Debug, thiserror::Error)]
#[error("cold decode job did not finish: {0}")]
pub struct DecodeFailed(&'static str);

impl DecodePool {
    /// Starts `threads` decode threads (at least one).
    pub fn new(threads: usize) -> std::io::Result<DecodePool> {
        let threads = threads.max(1);
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("felix-cold-decode-{i}"))
                .spawn(move || {
                    lower_priority();
                    loop {
                        // The lock is held only while waiting for the next job.
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        match job {
                            // A panicking job drops its reply; the caller sees DecodeFailed
                            // and this thread stays in the pool.
                            Ok(job) => drop(catch_unwind(AssertUnwindSafe(job))),
                            Err(_) => return,
                        }
                    }
                })?;
        }
        Ok(DecodePool { jobs: tx, threads })
    }

    /// Runs `f` on a decode thread and waits (asynchronously) for its result.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, DecodeFailed> {
        let (reply, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = reply.send(f());
        });
        self.jobs
            .send(job)
            .map_err(|_| DecodeFailed("no decode thread is running"))?;
        result
            .await
            .map_err(|_| DecodeFailed("the decode job panicked"))
    }
}

impl std::fmt::Debug for DecodePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodePool")
            .field("threads", &self.threads)
            .finish()
    }
}

/// Lowers the calling thread's priority by [`DECODE_NICE`]. Best effort: where it fails the
/// thread keeps the broker's priority, which is only slower for publishers, never wrong.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // On Linux the nice value belongs to each thread, and `who = 0` names the calling
        // thread, so this leaves the rest of the broker alone. Raising the nice value needs
        // no privilege.
        // SAFETY: plain syscalls on the calling thread, no pointers involved.
        unsafe {
            *libc::__errno_location() = 0;
            let current = libc::getpriority(libc::PRIO_PROCESS, 0);
            if current != -1 || *libc::__errno_location() == 0 {
                libc::setpriority(libc::PRIO_PROCESS, 0, current + DECODE_NICE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_and_survives_a_panicking_one() {
        let pool = DecodePool::new(2).unwrap();
        assert_eq!(pool.run(|| 6 * 7).await.unwrap(), 42);
        let err = pool.run(|| -> u8 { panic!("bad row group") }).await;
        assert!(err.is_err(), "a panicking job reports failure");
        // Both threads are still there to take work.
        let (a, b) = tokio::join!(pool.run(|| 1), pool.run(|| 2));
        assert_eq!((a.unwrap(), b.unwrap()), (1, 2));
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn decode_threads_run_at_a_lower_priority() {
        let pool = DecodePool::new(1).unwrap();
        // SAFETY: getpriority on the calling thread.
        let mine = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let theirs = pool
            .run(|| unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) })
            .await
            .unwrap();
        assert_eq!(theirs, (mine + DECODE_NICE).min(19));
    }
}
