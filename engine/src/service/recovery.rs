//! Storage recovery: redb refuses every write after an I/O error until the
//! database is reopened, so every local storage error wakes a task that
//! reopens it.

use super::backoff::backoff;
use super::push::window::PushWindows;
use super::Core;
use crate::runtime::blocking;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(super) struct Recovery {
    core: Arc<Core>,
    /// Emptied on every reopen: a commit that reported failure may have
    /// been stored after all.
    windows: Arc<PushWindows>,
    pub reopens: AtomicU64,
}

impl Recovery {
    /// Starts the recovery task when the forest can be reopened.
    pub fn start(core: Arc<Core>, windows: Arc<PushWindows>) -> Arc<Self> {
        let recovery = Arc::new(Self {
            core,
            windows,
            reopens: AtomicU64::new(0),
        });
        if recovery.core.forest.reopenable() {
            let task = recovery.clone().run();
            recovery.core.spawn("storage-recovery", task);
        }
        recovery
    }

    /// Reopens the database after each storage error. The callers of the
    /// failed batch already got the error; ops committed before it are kept
    /// by the reopen (redb's recovery), and writes fail with a storage
    /// error meanwhile.
    async fn run(self: Arc<Self>) {
        let mut shutdown = self.core.shutdown.subscribe();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.wait_for(|stop| *stop) => return,
                () = self.core.storage_failed.notified() => {}
            }
            if !self.reopen_with_retries().await {
                return;
            }
        }
    }

    /// Up to `reopen_attempts_max` tries with doubling waits; false when the
    /// node stopped meanwhile.
    async fn reopen_with_retries(&self) -> bool {
        let attempts = self.core.config.pilorama.reopen_attempts_max;
        let wait_max = self.core.config.pilorama.reopen_backoff_max;
        assert!(attempts >= 1, "validated config");
        for attempt in 1..=attempts {
            let forest = self.core.forest.clone();
            match blocking(&*self.core.env.runtime, move || forest.reopen()).await {
                Ok(()) => {
                    self.windows.clear();
                    self.reopens.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(attempt, "database reopened after a storage error");
                    return true;
                }
                Err(error) => {
                    tracing::warn!(%error, attempt, "reopening the database failed");
                }
            }
            let wait = backoff(attempt, wait_max);
            if attempt < attempts && self.core.sleep_or_stop(wait).await {
                return false;
            }
        }
        tracing::error!(
            attempts,
            "database still failing; waiting for the next error"
        );
        true
    }
}
