//! Production Clock and Runtime: the system clock and tokio. The only place
//! (with `tcp` and the binary) where the engine touches real time and the
//! tokio executor; everything else sees them through `runtime::Env`.

use crate::runtime::{BoxFuture, Clock, Env, Runtime};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Monotonic wall time since the clock was made.
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// Tasks on a tokio runtime, blocking work on its blocking pool: the
/// ambient runtime (`default()`, must then be used from inside one) or the
/// one behind a handle (`on`, usable from any thread).
#[derive(Default)]
pub struct TokioRuntime {
    handle: Option<tokio::runtime::Handle>,
}

impl TokioRuntime {
    pub fn on(handle: tokio::runtime::Handle) -> Self {
        Self {
            handle: Some(handle),
        }
    }
}

impl Runtime for TokioRuntime {
    fn spawn(&self, name: &'static str, task: BoxFuture<'static, ()>) {
        tracing::trace!(task = name, "spawn");
        match &self.handle {
            Some(handle) => drop(handle.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
    }

    fn run_blocking(&self, work: Box<dyn FnOnce() + Send + 'static>) -> BoxFuture<'static, ()> {
        let handle = match &self.handle {
            Some(handle) => handle.spawn_blocking(work),
            None => tokio::task::spawn_blocking(work),
        };
        Box::pin(async move {
            // A panic in the work is surfaced by `runtime::blocking`, which
            // finds its result channel closed.
            let _ = handle.await;
        })
    }

    fn log_epoch_fresh(&self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        // std's hasher keys come from the OS's randomness; the wall clock
        // and the process id make a repeat across restarts even less likely.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        hasher.write_u128(wall.as_nanos());
        hasher.write_u32(std::process::id());
        hasher.finish()
    }
}

/// The production environment: system clock and the ambient tokio runtime.
pub fn system_env() -> Env {
    Env {
        clock: Arc::new(SystemClock::new()),
        runtime: Arc::new(TokioRuntime::default()),
    }
}

/// System clock and the tokio runtime behind `handle` (for callers outside
/// the runtime, such as the load generator's driver thread).
pub fn system_env_on(handle: tokio::runtime::Handle) -> Env {
    Env {
        clock: Arc::new(SystemClock::new()),
        runtime: Arc::new(TokioRuntime::on(handle)),
    }
}

/// Tokio's TCP sockets, with Nagle's algorithm off (frames are small and
/// answered one at a time).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioNet;

impl crate::net::Net for TokioNet {
    fn connect(
        &self,
        address: String,
    ) -> BoxFuture<'static, std::io::Result<Box<dyn crate::net::Stream>>> {
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect(address).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as Box<dyn crate::net::Stream>)
        })
    }
}

impl crate::net::Listener for tokio::net::TcpListener {
    fn accept(
        &self,
    ) -> BoxFuture<'_, std::io::Result<(Box<dyn crate::net::Stream>, std::net::SocketAddr)>> {
        Box::pin(async move {
            let (stream, remote) = tokio::net::TcpListener::accept(self).await?;
            let _ = stream.set_nodelay(true);
            Ok((Box::new(stream) as Box<dyn crate::net::Stream>, remote))
        })
    }

    fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        tokio::net::TcpListener::local_addr(self)
    }
}
