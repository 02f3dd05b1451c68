//! An allocator wrapper that makes "never an unbounded allocation" a
//! checkable property: while a limit is armed on the current thread, any
//! single allocation above it panics, which the fuzzer reports as a crash.
//! libFuzzer's own `-malloc_limit_mb` needs sanitizer hooks that the stable
//! (`-s none`) build does not have.
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
        check_size(layout.size());
        if plain_alignment_suffices(layout.align()) {
            // SAFETY: a nonzero size (GlobalAlloc's contract); the
            // alignment holds by the check above.
            return unsafe { mi::mi_malloc(layout.size()).cast() };
        }
        // SAFETY: forwarded unchanged to mimalloc.
        unsafe { MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check_size(layout.size());
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
        check_size(new_size);
        if plain_alignment_suffices(layout.align()) {
            // SAFETY: `ptr` came from mimalloc; the new block keeps the
            // alignment by the check above.
            return unsafe { mi::mi_realloc(ptr.cast(), new_size).cast() };
        }
        // SAFETY: forwarded unchanged to mimalloc.
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }
}

fn check_size(size: usize) {
    let limit = LIMIT_BYTES.try_with(Cell::get).unwrap_or(usize::MAX);
    if size > limit {
        // Disarm first: the panic machinery allocates too.
        let _ = LIMIT_BYTES.try_with(|l| l.set(usize::MAX));
        panic!("allocation of {size} bytes exceeds the armed limit of {limit} bytes");
    }
}

/// Runs `f` with single allocations limited to `limit_bytes` on this thread
/// (only enforced where `LimitedAlloc` is the global allocator).
pub fn with_limit<T>(limit_bytes: usize, f: impl FnOnce() -> T) -> T {
    struct Disarm(usize);
    impl Drop for Disarm {
        fn drop(&mut self) {
            LIMIT_BYTES.with(|l| l.set(self.0));
        }
    }
    let previous = LIMIT_BYTES.with(|l| l.replace(limit_bytes));
    let _disarm = Disarm(previous);
    f()
}

/// True when the running binary enforces limits (a self-test, so a replay
/// test cannot silently check nothing).
pub fn enforced() -> bool {
    std::panic::catch_unwind(|| with_limit(16, || std::hint::black_box(vec![0u8; 1024]).len()))
        .is_err()
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
}
