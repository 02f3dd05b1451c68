//! An allocator wrapper that makes "never an unbounded allocation" a
//! checkable property: while a limit is armed on the current thread, the
//! allocator refuses (returns null for) any single request above it.
//! libFuzzer's own `-malloc_limit_mb` needs sanitizer hooks that the stable
//! (`-s none`) build does not have.
//!
//! A refusal never unwinds out of the allocator (that is undefined
//! behaviour; release builds abort with "panic in a function that cannot
//! unwind"). An infallible allocation (`Vec::with_capacity`, `vec![..]`)
//! that is refused makes std print "memory allocation of N bytes failed"
//! and abort the process, which libFuzzer records as a crash. A fallible
//! one (`try_reserve`) gets its error, and `with_limit` then panics, in
//! ordinary code, once the limited closure returns: asking is the bug,
//! even when the asker copes with the refusal.
//!
//! Underneath is mimalloc rather than the system allocator: the redb-heavy
//! targets allocate and free small pages and keys all the time, and glibc's
//! malloc/free were a tenth of an `apply_oplog` run.
//!
//! Binaries opt in with
//! `#[global_allocator] static ALLOC: LimitedAlloc = LimitedAlloc;`
//! (the fuzz targets and the corpus replay test do).

use libmimalloc_sys as mi;
use mimalloc::MiMalloc;
use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;

thread_local! {
    // Const-initialised and without a destructor, so reading it from inside
    // the allocator never allocates.
    static LIMIT_BYTES: Cell<usize> = const { Cell::new(usize::MAX) };
    // Size of the first request refused since the limit was armed; 0 for
    // none (a refused request is above a limit, so never 0 bytes).
    static REFUSED_BYTES: Cell<usize> = const { Cell::new(0) };
}

pub struct LimitedAlloc;

/// Alignment every mimalloc block has: blocks are whole machine words
/// (its size classes are word multiples) in word-aligned pages. Larger
/// alignments (16 would hold only for some sizes: a 24-byte class is
/// 8-aligned) keep the aligned entry points.
const MI_WORD_ALIGN: usize = std::mem::size_of::<usize>();

/// True when plain `mi_malloc` already gives `align`. `MiMalloc` always
/// calls the aligned entry points, a detour of ~25 instructions per
/// call, and a redb-heavy fuzz input allocates a few thousand times.
fn plain_alignment_suffices(align: usize) -> bool {
    align <= MI_WORD_ALIGN
}

unsafe impl GlobalAlloc for LimitedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !admits(layout.size()) {
            return std::ptr::null_mut();
        }
        if plain_alignment_suffices(layout.align()) {
            // SAFETY: a nonzero size (GlobalAlloc's contract); the
            // alignment holds by the check above.
            return unsafe { mi::mi_malloc(layout.size()).cast() };
        }
        // SAFETY: forwarded unchanged to mimalloc.
        unsafe { MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !admits(layout.size()) {
            return std::ptr::null_mut();
        }
        if plain_alignment_suffices(layout.align()) {
            // SAFETY: as in `alloc`.
            return unsafe { mi::mi_zalloc(layout.size()).cast() };
        }
        // SAFETY: forwarded unchanged to mimalloc.
        unsafe { MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from mimalloc through this allocator (either
        // entry point; `mi_free` takes both).
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !admits(new_size) {
            // Null leaves the old block allocated and untouched.
            return std::ptr::null_mut();
        }
        if plain_alignment_suffices(layout.align()) {
            // SAFETY: `ptr` came from mimalloc; the new block keeps the
            // alignment by the check above.
            return unsafe { mi::mi_realloc(ptr.cast(), new_size).cast() };
        }
        // SAFETY: forwarded unchanged to mimalloc.
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

/// False for a request above the limit armed on this thread; the first
/// one is remembered for `try_with_limit`. Must neither allocate nor panic.
fn admits(size: usize) -> bool {
    let limit = LIMIT_BYTES.try_with(Cell::get).unwrap_or(usize::MAX);
    if size <= limit {
        return true;
    }
    // Disarmed after the first refusal, which alone decides the outcome:
    // std's allocation-failure report then has the memory to print the
    // backtrace of the oversized request (symbolising takes megabytes).
    let _ = LIMIT_BYTES.try_with(|l| l.set(usize::MAX));
    let _ = REFUSED_BYTES.try_with(|refused| refused.set(size));
    false
}

/// A single allocation request the limit refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub size_bytes: usize,
    pub limit_bytes: usize,
}

/// Runs `f` with single allocations limited to `limit_bytes` on this thread
/// (only enforced where `LimitedAlloc` is the global allocator), and
/// reports the first request the limit refused (one `f` survived: a
/// fallible allocation, or a refusal `f` did not notice).
pub fn try_with_limit<T>(limit_bytes: usize, f: impl FnOnce() -> T) -> Result<T, Refused> {
    struct Restore {
        limit_bytes: usize,
        refused_bytes: usize,
    }
    impl Drop for Restore {
        fn drop(&mut self) {
            LIMIT_BYTES.with(|l| l.set(self.limit_bytes));
            REFUSED_BYTES.with(|r| r.set(self.refused_bytes));
        }
    }
    // Nested limits each see only their own refusals, and leave the outer
    // one's record as it was.
    let _restore = Restore {
        limit_bytes: LIMIT_BYTES.with(|l| l.replace(limit_bytes)),
        refused_bytes: REFUSED_BYTES.with(|r| r.replace(0)),
    };
    let value = f();
    match REFUSED_BYTES.with(Cell::get) {
        0 => Ok(value),
        size_bytes => Err(Refused {
            size_bytes,
            limit_bytes,
        }),
    }
}

/// `try_with_limit`, panicking if the limit refused any request.
pub fn with_limit<T>(limit_bytes: usize, f: impl FnOnce() -> T) -> T {
    match try_with_limit(limit_bytes, f) {
        Ok(value) => value,
        Err(Refused {
            size_bytes,
            limit_bytes,
        }) => panic!(
            "allocation of {size_bytes} bytes exceeds the armed limit of {limit_bytes} bytes"
        ),
    }
}

/// True when the running binary enforces limits (a self-test, so a replay
/// test cannot silently check nothing). Asks fallibly, so a working limit
/// neither aborts nor unwinds.
pub fn enforced() -> bool {
    let outcome = try_with_limit(16, || {
        std::hint::black_box(Vec::<u8>::new())
            .try_reserve_exact(1024)
            .is_err()
    });
    outcome
        == Err(Refused {
            size_bytes: 1024,
            limit_bytes: 16,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both entry points (plain for word alignment, aligned above it)
    /// give the alignment asked for, and realloc keeps the contents.
    #[test]
    fn every_layout_gets_its_alignment_and_realloc_keeps_bytes() {
        for align in [1, 2, 4, 8, 16, 32, 64] {
            for size in (1..=300).chain([1024, 4096, 70_000]) {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: nonzero size; every block is freed below with
                // the layout it was (re)allocated with.
                unsafe {
                    let ptr = LimitedAlloc.alloc(layout);
                    assert!(!ptr.is_null());
                    assert_eq!(ptr as usize % align, 0, "size {size} align {align}");
                    for i in 0..size {
                        ptr.add(i).write(i as u8);
                    }
                    let grown = LimitedAlloc.realloc(ptr, layout, size * 3);
                    assert_eq!(grown as usize % align, 0, "realloc {size} align {align}");
                    for i in 0..size {
                        assert_eq!(grown.add(i).read(), i as u8);
                    }
                    let zeroed = LimitedAlloc.alloc_zeroed(layout);
                    assert_eq!(zeroed as usize % align, 0);
                    assert!((0..size).all(|i| zeroed.add(i).read() == 0));
                    LimitedAlloc.dealloc(zeroed, layout);
                    let grown_layout = Layout::from_size_align(size * 3, align).unwrap();
                    LimitedAlloc.dealloc(grown, grown_layout);
                }
            }
        }
    }

    /// Over the limit every entry point returns null (a realloc leaving the
    /// old block as it was) and the first refused size is reported; at the
    /// limit nothing is refused. Called directly: this test binary's global
    /// allocator is the system one.
    #[test]
    fn requests_over_the_limit_are_refused_and_reported() {
        let small = Layout::from_size_align(8, 8).unwrap();
        let big = Layout::from_size_align(100, 8).unwrap();
        let aligned_big = Layout::from_size_align(100, 64).unwrap();
        // SAFETY: nonzero sizes; the one block allocated is freed with its
        // layout.
        unsafe {
            let ptr = LimitedAlloc.alloc(small);
            ptr.write(42);
            let refused = |size_bytes| {
                Err(Refused {
                    size_bytes,
                    limit_bytes: 64,
                })
            };
            let outcome = try_with_limit(64, || assert!(LimitedAlloc.alloc(big).is_null()));
            assert_eq!(outcome, refused(100));
            let outcome = try_with_limit(64, || assert!(LimitedAlloc.alloc(aligned_big).is_null()));
            assert_eq!(outcome, refused(100));
            let outcome = try_with_limit(64, || assert!(LimitedAlloc.alloc_zeroed(big).is_null()));
            assert_eq!(outcome, refused(100));
            let outcome = try_with_limit(64, || {
                assert!(LimitedAlloc.realloc(ptr, small, 65).is_null())
            });
            assert_eq!(outcome, refused(65));
            assert_eq!(ptr.read(), 42);
            let at_limit = try_with_limit(64, || LimitedAlloc.realloc(ptr, small, 64));
            let grown = at_limit.expect("64 bytes are within a 64-byte limit");
            assert!(!grown.is_null());
            assert_eq!(grown.read(), 42);
            LimitedAlloc.dealloc(grown, Layout::from_size_align(64, 8).unwrap());
        }
        // Disarmed again: the same request is admitted.
        assert!(admits(100));
    }

    /// An inner limit reports only its own refusals and keeps the outer
    /// one's; `with_limit` turns a refusal into a panic outside the
    /// allocator.
    #[test]
    fn nested_limits_keep_their_own_refusals() {
        let outer = try_with_limit(1000, || {
            assert!(!admits(2000));
            // The first refusal disarmed the limit.
            assert!(admits(2000));
            let inner = try_with_limit(10, || admits(5));
            assert_eq!(inner, Ok(true));
            let inner = try_with_limit(10, || admits(20));
            assert_eq!(
                inner,
                Err(Refused {
                    size_bytes: 20,
                    limit_bytes: 10
                })
            );
        });
        assert_eq!(
            outer,
            Err(Refused {
                size_bytes: 2000,
                limit_bytes: 1000
            })
        );
        let panicked = std::panic::catch_unwind(|| with_limit(10, || admits(11)));
        let message = panicked.expect_err("a refusal makes with_limit panic");
        let message = message
            .downcast_ref::<String>()
            .expect("a formatted message");
        assert!(message.contains("11 bytes"), "{message}");
        // The limit is off again on this thread, and not enforced in a
        // binary without `LimitedAlloc` as its global allocator.
        assert!(!enforced());
    }
}
