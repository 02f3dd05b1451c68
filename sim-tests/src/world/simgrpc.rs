//! The engine's gRPC front (`arbor::grpc::Front`, tonic's generated
//! `TreeServiceServer`, the signature checks) served inside the simulator,
//! and a gateway's client of it: HTTP/2 by hyper over the simulated TCP
//! streams of `simnet`, its connection tasks on madsim.
//!
//! The production server (`arbor::grpc::serve`) runs tonic's own
//! transport, which spawns on tokio's runtime and cannot run under madsim;
//! here each accepted stream is served by hyper's HTTP/2 connection
//! directly. What a call crosses is otherwise the same: HTTP/2 framing,
//! gRPC's length-prefixed messages, the message size limits, the signed
//! body, the front's translation and the service.

use super::simnet::{SimListener, SimNet};
use arbor::grpc::client::GrpcClient;
use arbor::grpc::pb::tree_service_client::TreeServiceClient;
use arbor::grpc::pb::tree_service_server::TreeServiceServer;
use arbor::grpc::{Front, Signer};
use arbor::net::{Listener, Net};
use arbor::runtime::BoxFuture;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::task::{Context, Poll};

/// Runs hyper's connection tasks as madsim tasks of the current machine.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimExecutor;

impl<F> hyper::rt::Executor<F> for SimExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        drop(madsim::task::spawn(future));
    }
}

/// Serves `front` on `listener` until the machine stops: one HTTP/2
/// connection per accepted stream, at most `max_concurrent_streams` calls
/// on each, messages up to `max_message_bytes`.
pub async fn serve(
    listener: SimListener,
    front: Front,
    max_message_bytes: usize,
    max_concurrent_streams: u32,
) {
    let service = TreeServiceServer::new(front)
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes);
    loop {
        let Ok((stream, _remote)) = listener.accept().await else {
            return;
        };
        let service = TowerToHyperService::new(service.clone());
        let connection = hyper::server::conn::http2::Builder::new(SimExecutor)
            .max_concurrent_streams(max_concurrent_streams)
            .serve_connection(TokioIo::new(stream), service);
        drop(madsim::task::spawn(async move {
            let _ = connection.await;
        }));
    }
}

/// One HTTP/2 connection of a client, as the service tonic's generated
/// client calls through.
#[derive(Clone)]
pub struct H2Channel(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl tower::Service<http::Request<tonic::body::Body>> for H2Channel {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(request))
    }
}

/// A signing gRPC client of the front at `address`, over one HTTP/2
/// connection opened through `net` from the current machine.
pub async fn connect(
    net: &SimNet,
    address: &str,
    signer: Signer,
    max_message_bytes: usize,
) -> std::io::Result<GrpcClient<H2Channel>> {
    let stream = net.connect(address.to_string()).await?;
    let (send, connection) =
        hyper::client::conn::http2::handshake(SimExecutor, TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
    drop(madsim::task::spawn(async move {
        let _ = connection.await;
    }));
    let origin = format!("http://{address}")
        .parse()
        .map_err(std::io::Error::other)?;
    let inner = TreeServiceClient::with_origin(H2Channel(send), origin);
    Ok(GrpcClient::on(inner, signer, max_message_bytes))
}
