//! Which part of a read-ahead request still needs advising to the kernel.
//!
//! A log read asks the kernel (`posix_fadvise(WILLNEED)`) to start loading the next
//! megabytes of its segment. Asked again for pages already asked for (or cached), the kernel
//! still looks up every page of the range: with many small reads (consumer-group polls of a
//! hundred records, 16 consumers on a stream) that was 9% of the broker's samples, each poll
//! re-advising 2 MiB that the previous poll had just advised. A segment remembers the window
//! it advised last, and a read inside it advises only what lies past its end.
//!
//! The window is two relaxed atomics: two readers racing can make one advise a range twice
//! or skip one, which is harmless (the advice is advisory; the read itself always reads).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// The last advised window `[from, to)` of one segment.
#[derive(Debug, Default)]
pub(crate) struct Advised {
    from: AtomicU64,
    to: AtomicU64,
}

impl Advised {
    /// The part of `want` to advise now, and records the window. A read that starts inside
    /// the last window (a sequential reader) advises only what lies past the window's end,
    /// and the window then starts at the read: a reader that falls behind it, or jumps
    /// elsewhere, advises its whole range again, as its pages may never have been loaded or
    /// been evicted since.
    pub fn take(&self, want: Range<u64>) -> Option<Range<u64>> {
        let (from, to) = (
            self.from.load(Ordering::Relaxed),
            self.to.load(Ordering::Relaxed),
        );
        let (advise, window_end) = next_advice(from..to, want.clone());
        self.from.store(want.start, Ordering::Relaxed);
        self.to.store(window_end, Ordering::Relaxed);
        advise
    }
}

/// With `last` advised, what of `want` to advise, and the new window's end.
fn next_advice(last: Range<u64>, want: Range<u64>) -> (Option<Range<u64>>, u64) {
    if want.is_empty() {
        return (None, last.end);
    }
    if last.start <= want.start && want.start <= last.end {
        let from = last.end.max(want.start);
        let advise = (from < want.end).then_some(from..want.end);
        (advise, last.end.max(want.end))
    } else {
        (Some(want.clone()), want.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A sequential reader of 100 KiB reads, each wanting the next 2 MiB advised, advises
    /// 2 MiB once and then only the 100 KiB it moved on; a reader far behind, or a jump,
    /// advises its whole range; an empty range advises nothing.
    #[test]
    fn sequential_reads_advise_only_what_they_move_on() {
        let a = Advised::default();
        let step = 100 * 1024;
        assert_eq!(a.take(step..step + 2 * MIB), Some(step..step + 2 * MIB));
        let mut advised = 2 * MIB;
        for i in 2..50u64 {
            let at = i * step;
            let got = a.take(at..at + 2 * MIB).expect("advises what is new");
            assert_eq!(got, (at - step + 2 * MIB)..(at + 2 * MIB));
            advised += got.end - got.start;
        }
        // 49 reads of 100 KiB: 2 MiB plus 48 steps advised, not 49 × 2 MiB.
        assert_eq!(advised, 2 * MIB + 48 * step);
        // Inside the window and wanting nothing past it: nothing to advise.
        assert_eq!(a.take(49 * step..49 * step + MIB), None);
        // Behind the window (another reader, far back): its whole range.
        assert_eq!(a.take(0..2 * MIB), Some(0..2 * MIB));
        // A jump past the window's end: its whole range.
        assert_eq!(a.take(64 * MIB..66 * MIB), Some(64 * MIB..66 * MIB));
        assert_eq!(a.take(70 * MIB..70 * MIB), None);
    }
}
