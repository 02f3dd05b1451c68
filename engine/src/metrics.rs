//! What a node tells an operator: the Prometheus endpoint
//! (`node.metrics_listen`, docs/service.md "Metrics") and warnings that
//! cannot flood a log.
//!
//! The endpoint serves `GET /metrics` in the OpenMetrics text format:
//! every counter and size of `ServiceStats`, of the TCP server's
//! `ServerStats` and of the gRPC server, read at each scrape; the latency
//! of commits and of requests by kind (histograms kept as they happen);
//! and the seconds left before the node's own certificates expire. It is
//! plaintext HTTP, so it listens on loopback unless
//! `node.insecure_plaintext`, serves at most `METRICS_CONNECTIONS_MAX`
//! connections at once, one request each, each within
//! `limits.handshake_timeout`.

use crate::config::{Config, METRICS_CONNECTIONS_MAX};
use crate::error::{Error, Result};
use crate::grpc::GrpcHandle;
use crate::service::{Service, ServiceStats};
use crate::tcp::{ServerHandle, ServerStats};
use crate::tls::CertDates;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
pub use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The label set of a request-latency series: the request's kind.
pub type KindLabel = [(&'static str, &'static str); 1];

/// Bucket bounds of the latency histograms, in seconds: 100 µs to ~13 s,
/// doubling.
fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 18)
}

/// A latency histogram with the node's buckets.
pub fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// Latency of requests by kind, as the service answered them (both the
/// TCP and the gRPC front call it).
#[derive(Clone)]
pub struct RequestLatency {
    family: Family<KindLabel, Histogram, fn() -> Histogram>,
}

impl Default for RequestLatency {
    fn default() -> Self {
        Self {
            family: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl fmt::Debug for RequestLatency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RequestLatency")
    }
}

impl RequestLatency {
    pub fn observe(&self, kind: &'static str, took: Duration) {
        self.family
            .get_or_create(&[("kind", kind)])
            .observe(took.as_secs_f64());
    }
}

/// Everything the endpoint reads at a scrape.
pub struct Sources {
    pub service: Arc<Service>,
    pub tcp: ServerHandle,
    pub grpc: Option<GrpcHandle>,
    /// The node's own certificates, by the key that names their file.
    pub certificates: Vec<(&'static str, CertDates)>,
}

impl fmt::Debug for Sources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Sources")
    }
}

/// The registry of a node: the collector of `sources` and the latency
/// histograms.
pub fn registry(sources: Sources) -> Registry {
    let mut registry = Registry::default();
    registry.register(
        "arbor_commit_seconds",
        "Duration of group-commit transactions (failed ones too)",
        sources.service.commit_latency(),
    );
    registry.register(
        "arbor_checkpoint_seconds",
        "Duration of the commits that were checkpoints (durable, with a write-ahead log)",
        sources.service.checkpoint_latency(),
    );
    registry.register(
        "arbor_request_seconds",
        "Time from a request's arrival at the service to its answer, by kind",
        sources.service.request_latency().family.clone(),
    );
    registry.register_collector(Box::new(sources));
    registry
}

/// The registry's current text (OpenMetrics).
pub fn render(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)
        .expect("writing to a String cannot fail");
    text
}

struct Out<'a, 'b> {
    encoder: &'a mut DescriptorEncoder<'b>,
}

impl Out<'_, '_> {
    fn counter(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let counter = ConstCounter::new(value);
        let metric = self
            .encoder
            .encode_descriptor(name, help, None, counter.metric_type())?;
        counter.encode(metric)
    }

    fn gauge(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
        let metric = self
            .encoder
            .encode_descriptor(name, help, None, gauge.metric_type())?;
        gauge.encode(metric)
    }
}

impl Collector for Sources {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let mut out = Out {
            encoder: &mut encoder,
        };
        service_stats(&mut out, self.service.stats())?;
        server_stats(&mut out, self.tcp.stats())?;
        if let Some(grpc) = &self.grpc {
            out.counter(
                "arbor_grpc_connections_accepted",
                "gRPC connections accepted",
                grpc.accepted(),
            )?;
            out.counter(
                "arbor_grpc_handshakes_failed",
                "gRPC TLS handshakes that failed or timed out",
                grpc.handshakes_failed(),
            )?;
        }
        if !self.certificates.is_empty() {
            let gauge = ConstGauge::new(0i64);
            let mut family = encoder.encode_descriptor(
                "arbor_tls_certificate_expiry_seconds",
                "Seconds until the node's own certificate expires (negative: expired)",
                None,
                gauge.metric_type(),
            )?;
            let now = SystemTime::now();
            for (file, dates) in &self.certificates {
                let labels = [("file", *file)];
                let metric = family.encode_family(&labels)?;
                ConstGauge::new(dates.seconds_left(now)).encode(metric)?;
            }
        }
        Ok(())
    }
}

/// Every field of `ServiceStats`: the destructuring names each one, so a
/// field added there does not compile until it is exported here.
fn service_stats(out: &mut Out<'_, '_>, stats: ServiceStats) -> fmt::Result {
    let ServiceStats {
        writes_committed,
        batches_committed,
        batches_failed,
        writes_rejected_overload,
        ops_pushed,
        ops_pulled,
        sync_pages_pulled,
        sync_rounds,
        pending_writes,
        commit_us,
        wal,
        wal_bytes_since_checkpoint,
        push_failures,
        push_passes,
        sync_peer_errors,
        sync_names_deferred,
        hints_dropped,
        reopens,
        push_trees_tracked,
        push_trees_settled,
        push_pairs_queued,
        push_pairs_backlog,
        push_pairs_delayed,
        push_pairs_parked,
        push_workers,
        push_windows,
        pull_cursors,
        hellos_refused,
        peers_refused,
        requests_refused,
        ops_refused_too_far,
        ops_refused_foreign,
        stamp_conflicts,
        peer_identity_mismatches,
        pull_cursors_reset,
        rejoining,
        writes_awaiting_replicas,
    } = stats;
    let counters = [
        ("arbor_writes_committed", "Writes in committed batches", writes_committed),
        ("arbor_batches_committed", "Committed batches", batches_committed),
        ("arbor_batches_failed", "Batches whose transaction failed", batches_failed),
        ("arbor_writes_rejected_overload", "Writes refused with Overloaded (write queue full)", writes_rejected_overload),
        ("arbor_commit_microseconds", "Time the batcher spent in commit transactions and checkpoints, in microseconds", commit_us),
        ("arbor_ops_pushed", "Ops acknowledged by peers", ops_pushed),
        ("arbor_push_passes", "Passes of pushers over the local log", push_passes),
        ("arbor_push_failures", "Push calls that failed (retried later)", push_failures),
        ("arbor_hints_dropped", "Trees whose commit found the push queue full (their pairs waited in the backlog)", hints_dropped),
        ("arbor_ops_pulled", "Ops new here fetched by sync", ops_pulled),
        ("arbor_sync_pages_pulled", "GetOpLog pages a sync applied", sync_pages_pulled),
        ("arbor_sync_rounds", "Sync rounds", sync_rounds),
        ("arbor_sync_peer_errors", "Failed peer calls during sync", sync_peer_errors),
        ("arbor_sync_names_deferred", "Tree names left for later sync rounds (limits.max_tracked_trees)", sync_names_deferred),
        ("arbor_reopens", "Reopens of the database after a storage error", reopens),
        ("arbor_hellos_refused", "Hellos this node refused", hellos_refused),
        ("arbor_peers_refused", "Outbound connections refused: not the replica dialled, or it refused this node's Hello", peers_refused),
        ("arbor_requests_refused", "Requests refused with PermissionDenied", requests_refused),
        ("arbor_ops_refused_too_far", "Replicated ops refused as CounterTooFar", ops_refused_too_far),
        ("arbor_ops_refused_foreign", "Pulled ops stamped by a replica that does not hold their container", ops_refused_foreign),
        ("arbor_stamp_conflicts", "Timestamps held here with another op than a peer holds (a fault)", stamp_conflicts),
        ("arbor_peer_identity_mismatches", "Sync passes skipped: the peer answered as another replica", peer_identity_mismatches),
        ("arbor_pull_cursors_reset", "Pull cursors started again because a peer's log was rebuilt", pull_cursors_reset),
        ("arbor_wal_records", "Records appended to the write-ahead log", wal.records),
        ("arbor_wal_bytes", "Bytes appended to the write-ahead log, headers included", wal.bytes),
        ("arbor_wal_syncs", "Syncs of write-ahead log segments and of their directory", wal.syncs),
        ("arbor_wal_records_replayed", "Log records replayed into the database when it was opened", wal.replayed),
        ("arbor_checkpoints", "Durable database commits that let covered log segments go", wal.checkpoints),
        ("arbor_wal_segments_created", "Write-ahead log segments made anew, written whole with zeros", wal.segments_created),
        ("arbor_wal_segments_reused", "Write-ahead log rolls into a spare segment (no zeros written)", wal.segments_reused),
        ("arbor_wal_segments_retired", "Covered write-ahead log segments kept as spares", wal.segments_retired),
        ("arbor_wal_segments_removed", "Write-ahead log segments and spares removed", wal.segments_removed),
    ];
    for (name, help, value) in counters {
        out.counter(name, help, value)?;
    }
    let gauges = [
        (
            "arbor_pending_writes",
            "Writes admitted by the batcher and not answered yet",
            pending_writes,
        ),
        (
            "arbor_push_trees_tracked",
            "Trees in the push book",
            push_trees_tracked,
        ),
        (
            "arbor_push_trees_settled",
            "Trees in the push book last found with nothing to push",
            push_trees_settled,
        ),
        (
            "arbor_push_pairs_queued",
            "(tree, peer) pairs waiting for a push worker",
            push_pairs_queued,
        ),
        (
            "arbor_push_pairs_backlog",
            "(tree, peer) pairs waiting in the backlog",
            push_pairs_backlog,
        ),
        (
            "arbor_push_pairs_delayed",
            "(tree, peer) pairs backing off after a failure",
            push_pairs_delayed,
        ),
        (
            "arbor_push_pairs_parked",
            "(tree, peer) pairs parked after repeated stamp conflicts (a fault)",
            push_pairs_parked,
        ),
        ("arbor_push_workers", "Push workers running", push_workers),
        ("arbor_push_windows", "Push windows held", push_windows),
        (
            "arbor_pull_cursors",
            "Pull cursors held in memory",
            pull_cursors,
        ),
        (
            "arbor_rejoining",
            "1 while a replaced node refuses local writes (node.rejoin)",
            u64::from(rejoining),
        ),
        (
            "arbor_writes_awaiting_replicas",
            "Local writes waiting for tree.ack_replicas replicas",
            writes_awaiting_replicas,
        ),
        (
            "arbor_wal_bytes_since_checkpoint",
            "Log bytes no checkpoint covers yet: at most what a reopen after a crash replays",
            wal_bytes_since_checkpoint,
        ),
    ];
    for (name, help, value) in gauges {
        out.gauge(name, help, value)?;
    }
    Ok(())
}

/// Every field of the TCP server's `ServerStats`.
fn server_stats(out: &mut Out<'_, '_>, stats: ServerStats) -> fmt::Result {
    let ServerStats {
        connections_open,
        connections_accepted,
        connections_refused,
        idle_closed,
        idle_evicted,
        handshakes_failed,
        identities_refused,
        partial_frame_bytes,
        partial_frame_bytes_peak,
        partial_frames_refused,
        answers_timed_out,
    } = stats;
    let counters = [
        (
            "arbor_tcp_connections_accepted",
            "TCP connections accepted",
            connections_accepted,
        ),
        (
            "arbor_tcp_connections_refused",
            "TCP connections refused at limits.max_connections",
            connections_refused,
        ),
        (
            "arbor_tcp_idle_closed",
            "TCP connections closed after limits.idle_connection_timeout",
            idle_closed,
        ),
        (
            "arbor_tcp_idle_evicted",
            "Idle TCP connections closed to make room",
            idle_evicted,
        ),
        (
            "arbor_tcp_handshakes_failed",
            "TLS handshakes that failed or timed out",
            handshakes_failed,
        ),
        (
            "arbor_tcp_identities_refused",
            "Client certificates that named no acceptable caller",
            identities_refused,
        ),
        (
            "arbor_tcp_partial_frames_refused",
            "Frames refused for finding no room in limits.partial_frames_bytes_max",
            partial_frames_refused,
        ),
        (
            "arbor_tcp_answers_timed_out",
            "Answers a client did not take within tree.replication_timeout; each closed its connection",
            answers_timed_out,
        ),
    ];
    for (name, help, value) in counters {
        out.counter(name, help, value)?;
    }
    let gauges = [
        (
            "arbor_tcp_connections_open",
            "TCP connections open",
            connections_open,
        ),
        (
            "arbor_tcp_partial_frame_bytes",
            "Bytes of frames being received",
            partial_frame_bytes,
        ),
        (
            "arbor_tcp_partial_frame_bytes_peak",
            "Most bytes of frames received at once",
            partial_frame_bytes_peak,
        ),
    ];
    for (name, help, value) in gauges {
        out.gauge(name, help, value)?;
    }
    Ok(())
}

/// Binds `node.metrics_listen`; `None` when not configured. The endpoint
/// is plaintext: loopback only unless `node.insecure_plaintext`.
pub async fn listen(config: &Config) -> Result<Option<TcpListener>> {
    let Some(listen) = &config.node.metrics_listen else {
        return Ok(None);
    };
    let bad = |why: String| Error::Config(format!("node.metrics_listen: {listen}: {why}"));
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host(listen.as_str())
        .await
        .map_err(|e| bad(e.to_string()))?
        .collect();
    if !config.node.insecure_plaintext {
        if let Some(open) = addresses.iter().find(|a| !a.ip().is_loopback()) {
            return Err(bad(format!(
                "{open} is not a loopback address; the metrics endpoint is plaintext HTTP, \
                 set node.insecure_plaintext: true to serve it there"
            )));
        }
    }
    let listener = TcpListener::bind(addresses.as_slice())
        .await
        .map_err(|e| bad(e.to_string()))?;
    Ok(Some(listener))
}

/// Serves `registry` on `listener` until the task is dropped: at most
/// `METRICS_CONNECTIONS_MAX` connections at once, one request each, each
/// connection within `timeout`.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>, timeout: Duration) {
    let slots = Arc::new(Semaphore::new(METRICS_CONNECTIONS_MAX));
    loop {
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request| {
                let registry = registry.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&registry, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .max_buf_size(16 << 10)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(timeout, connection).await;
        });
    }
}

type Body = http_body_util::Full<bytes::Bytes>;

fn answer<B>(registry: &Registry, request: &hyper::Request<B>) -> hyper::Response<Body> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&hyper::Method::GET, "/metrics") => (
            hyper::StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            render(registry),
        ),
        (&hyper::Method::GET, _) => (
            hyper::StatusCode::NOT_FOUND,
            "text/plain",
            "the metrics are at /metrics\n".into(),
        ),
        _ => (
            hyper::StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET /metrics\n".into(),
        ),
    };
    let mut response = hyper::Response::new(Body::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// A warning that may repeat at a stranger's pace (refused handshakes,
/// refused identities): at most `per_minute` lines a minute; the lines
/// held back are counted and told with the next line let through.
pub struct WarnLimit {
    per_minute: u32,
    state: Mutex<WarnWindow>,
}

struct WarnWindow {
    started: Option<tokio::time::Instant>,
    logged: u32,
    held_back: u64,
}

impl WarnLimit {
    pub const fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            state: Mutex::new(WarnWindow {
                started: None,
                logged: 0,
                held_back: 0,
            }),
        }
    }

    /// `Some(n)` when a line may be logged now (`n` lines were held back
    /// since the last one); `None` when it is held back.
    pub fn admit(&self) -> Option<u64> {
        let now = tokio::time::Instant::now();
        let mut window = self.state.lock().expect("warn window");
        let fresh = window
            .started
            .is_none_or(|started| now.duration_since(started) >= Duration::from_secs(60));
        if fresh {
            window.started = Some(now);
            window.logged = 0;
        }
        if window.logged >= self.per_minute {
            window.held_back += 1;
            return None;
        }
        window.logged += 1;
        Some(std::mem::take(&mut window.held_back))
    }
}

/// Refused TLS handshakes and identities logged per minute, per port.
pub const REFUSALS_LOGGED_PER_MINUTE: u32 = 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn warnings_are_limited_per_minute_and_tell_what_they_held_back() {
        let limit = WarnLimit::new(2);
        assert_eq!(limit.admit(), Some(0));
        assert_eq!(limit.admit(), Some(0));
        assert_eq!(limit.admit(), None);
        assert_eq!(limit.admit(), None);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(limit.admit(), Some(2));
        assert_eq!(limit.admit(), Some(0));
        assert_eq!(limit.admit(), None);
    }
}
