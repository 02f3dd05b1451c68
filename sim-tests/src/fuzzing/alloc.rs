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

use mimalloc::MiMalloc;
use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;

thread_local! {
    // Const-initialised and without a destructor, so reading it from inside
    // the allocator never allocates.
    static LIMIT_BYTES: Cell<usize> = const { Cell::new(usize::MAX) };
}

pub struct LimitedAlloc;

unsafe impl GlobalAlloc for LimitedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check_size(layout.size());
        // SAFETY: forwarded unchanged to mimalloc.
        unsafe { MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check_size(layout.size());
        // SAFETY: forwarded unchanged to mimalloc.
        unsafe { MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from mimalloc through this allocator.
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check_size(new_size);
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
