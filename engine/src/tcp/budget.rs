//! The bytes of partly received frames, over all inbound connections, are
//! bounded (`limits.partial_frames_bytes_max`). A body is read in chunks,
//! and each chunk's bytes are reserved before they are read, so memory
//! held by frames in transit never exceeds the bound, whatever many slow
//! senders claim. A frame that finds no room waits until its own deadline,
//! then gets `Overloaded`; the room comes back when a frame is decoded or
//! its connection ends.
//!
//! Frames of at most `SMALL_FRAME_BYTES` (health checks, reads, most
//! writes) are read without a reservation, so a flood of large partial
//! frames cannot make them wait: a connection reads one frame at a time,
//! so they add at most `max_connections` times that size to the bound.

use super::io_error;
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::runtime::{until, Clock};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes reserved (and read) at a time. A body grows by whole chunks, so
/// a frame of `n` chunks is copied `n - 1` times as it grows: most push
/// pages fit one chunk.
const CHUNK_BYTES: usize = 256 << 10;

/// Frames this small never wait for the budget.
pub const SMALL_FRAME_BYTES: usize = 4 << 10;

/// The shared bound and its counters.
pub struct FrameBudget {
    room: Arc<Semaphore>,
    max_bytes: usize,
    peak_bytes: AtomicUsize,
    refused: AtomicUsize,
}

/// Bytes a frame holds; given back when dropped.
pub(super) struct Reserved(Option<OwnedSemaphorePermit>);

impl FrameBudget {
    /// The largest bound a budget can count.
    pub const MAX_BYTES: usize = Semaphore::MAX_PERMITS;

    pub fn new(max_bytes: usize) -> Self {
        assert!((1..=Self::MAX_BYTES).contains(&max_bytes));
        Self {
            room: Arc::new(Semaphore::new(max_bytes)),
            max_bytes,
            peak_bytes: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
        }
    }

    /// Bytes of frames being received (or decoded) now.
    pub fn in_use_bytes(&self) -> usize {
        self.max_bytes - self.room.available_permits()
    }

    /// The most bytes ever in use at once.
    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes.load(Ordering::Relaxed)
    }

    /// Frames refused because they found no room by their deadline.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::Relaxed)
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    async fn reserve(
        &self,
        bytes: usize,
        clock: &dyn Clock,
        deadline: Duration,
    ) -> Result<OwnedSemaphorePermit> {
        let permits = u32::try_from(bytes).expect("a chunk fits u32");
        let acquire = self.room.clone().acquire_many_owned(permits);
        let permit = until(clock, deadline, acquire)
            .await
            .ok_or_else(|| {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Error::Overloaded(format!(
                    "frames in transit hold limits.partial_frames_bytes_max ({} bytes)",
                    self.max_bytes
                ))
            })?
            .expect("the budget is never closed");
        let in_use = self.in_use_bytes();
        assert!(in_use <= self.max_bytes, "frame budget over its bound");
        self.peak_bytes.fetch_max(in_use, Ordering::Relaxed);
        Ok(permit)
    }

    /// Reads a body of `length` bytes by `deadline`, reserving each chunk
    /// before reading it. The body holds its room until `Reserved` drops.
    pub(super) async fn read_body<R: AsyncRead + Unpin>(
        &self,
        reader: &mut R,
        length: usize,
        clock: &dyn Clock,
        deadline: Duration,
    ) -> Result<(Vec<u8>, Reserved)> {
        let mut body = Vec::new();
        let mut reserved = Reserved(None);
        if length <= SMALL_FRAME_BYTES {
            body.resize(length, 0);
            read_within(reader, &mut body, clock, deadline, length).await?;
            return Ok((body, reserved));
        }
        while body.len() < length {
            let want = (length - body.len()).min(CHUNK_BYTES);
            let permit = self.reserve(want, clock, deadline).await?;
            match &mut reserved.0 {
                Some(held) => held.merge(permit),
                None => reserved.0 = Some(permit),
            }
            // Memory is taken only for reserved bytes, exactly.
            let before = body.len();
            body.reserve_exact(want);
            body.resize(before + want, 0);
            let read = read_within(reader, &mut body[before..], clock, deadline, length).await;
            if let Err(error) = read {
                if canary::active(Canary::BrokenFrameKeepsBudget) {
                    std::mem::forget(reserved);
                }
                return Err(error);
            }
        }
        Ok((body, reserved))
    }
}

/// Fills `buffer` by `deadline` on `clock`; `length` is the whole frame's,
/// for errors.
async fn read_within<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut [u8],
    clock: &dyn Clock,
    deadline: Duration,
    length: usize,
) -> Result<()> {
    match until(clock, deadline, reader.read_exact(buffer)).await {
        None => Err(Error::Timeout),
        Some(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Error::Malformed(
            format!("truncated frame of {length} bytes"),
        )),
        Some(Err(e)) => Err(io_error(e)),
        Some(Ok(_)) => Ok(()),
    }
}
