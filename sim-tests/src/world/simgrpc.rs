//! The engine's gRPC front (`arbor::grpc::Front`, tonic's generated
//! `TreeServiceServer`, the signature checks) served inside the simulator,
//! and a gateway's client of it: HTTP/2 by hyper over the simulated TCP
//! streams of `simnet`, its connection tasks on madsim. `GrpcTransport`
//! is the client of the scenario's gateways: the service's requests sent
//! as gRPC calls and the answers read back as the service's responses.
//!
//! The production server (`arbor::grpc::serve`) serves each connection
//! with hyper's HTTP/2 too, on tokio's executor and timer, which cannot
//! run under madsim; here the connection tasks are madsim's and there is
//! no keep-alive. What a call crosses is otherwise the same: HTTP/2 framing,
//! gRPC's length-prefixed messages, the message size limits, the signed
//! body, the front's translation and the service.

use super::simnet::{SimListener, SimNet};
use arbor::grpc::client::GrpcClient;
use arbor::grpc::pb::tree_service_client::TreeServiceClient;
use arbor::grpc::pb::tree_service_server::TreeServiceServer;
use arbor::grpc::{Front, Signer, VariableTimeSigner};
use arbor::net::{Listener, Net, Transport};
use arbor::proto::{Request, Response};
use arbor::runtime::BoxFuture;
use arbor::{Error, ReplicaId};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Code, Status};

/// Runs hyper's connection tasks as madsim tasks of the current machine.
/// A server's tasks end when its process does (`Stop`).
#[derive(Clone, Debug, Default)]
pub struct SimExecutor {
    stop: Option<watch::Receiver<()>>,
}

impl<F> hyper::rt::Executor<F> for SimExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        spawn_until(future, self.stop.clone());
    }
}

/// Spawns `future` on the current machine, dropped once `stop` says so.
fn spawn_until<F>(future: F, stop: Option<watch::Receiver<()>>)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let Some(mut stop) = stop else {
        drop(madsim::task::spawn(future));
        return;
    };
    drop(madsim::task::spawn(async move {
        let stopped = std::pin::pin!(stop.changed());
        let future = std::pin::pin!(future);
        drop(futures::future::select(future, stopped).await);
    }));
}

/// Ends a front's tasks when dropped. madsim drops a killed machine's task
/// when something wakes it; an HTTP/2 task waits on its connection or on
/// the other streams of it, which a kill need not wake, and holds the
/// front, the service and its database. The world drops this with the
/// process's incarnation, so each of them is woken and dropped then.
pub struct Stop(#[allow(dead_code)] watch::Sender<()>);

/// Serves `front` on `listener` until the machine stops: one HTTP/2
/// connection per accepted stream, at most `max_concurrent_streams` calls
/// on each, messages up to `max_message_bytes`. Every task of the front
/// ends when the returned `Stop` is dropped.
pub fn serve(
    listener: SimListener,
    front: Front,
    max_message_bytes: usize,
    max_concurrent_streams: u32,
) -> Stop {
    let (stop, stopped) = watch::channel(());
    let service = TreeServiceServer::new(front)
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes);
    let executor = SimExecutor {
        stop: Some(stopped.clone()),
    };
    let accept = async move {
        loop {
            let Ok((stream, _remote)) = listener.accept().await else {
                return;
            };
            let service = TowerToHyperService::new(service.clone());
            let connection = hyper::server::conn::http2::Builder::new(executor.clone())
                .max_concurrent_streams(max_concurrent_streams)
                .serve_connection(TokioIo::new(stream), service);
            spawn_until(connection, executor.stop.clone());
        }
    };
    spawn_until(accept, Some(stopped));
    Stop(stop)
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
        hyper::client::conn::http2::handshake(SimExecutor::default(), TokioIo::new(stream))
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

/// A gateway's transport: every request the gRPC API has goes to the
/// replica's front as its signed `tree.TreeService` call
/// (`crate::grpc_calls`), over one HTTP/2 connection per replica, opened
/// at the first call and again after a call that did not get the front's
/// answer. A request the API lacks is refused here, unsent.
pub struct GrpcTransport {
    routes: Arc<Routes>,
}

struct Routes {
    net: SimNet,
    /// Each replica's front (`grpc.listen`).
    fronts: BTreeMap<ReplicaId, String>,
    signer: VariableTimeSigner,
    max_message_bytes: usize,
    connections: Mutex<BTreeMap<ReplicaId, TreeServiceClient<H2Channel>>>,
}

impl GrpcTransport {
    pub fn new(
        net: SimNet,
        fronts: BTreeMap<ReplicaId, String>,
        signer: &Signer,
        max_message_bytes: usize,
    ) -> Self {
        let routes = Routes {
            net,
            fronts,
            signer: signer.variable_time(),
            max_message_bytes,
            connections: Mutex::default(),
        };
        Self {
            routes: Arc::new(routes),
        }
    }
}

impl Transport for GrpcTransport {
    fn call(
        &self,
        peer: ReplicaId,
        request: Request,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<Response, Error>> {
        let routes = self.routes.clone();
        Box::pin(async move {
            match madsim::time::timeout(timeout, routes.exchange(peer, request)).await {
                Ok(result) => result,
                Err(_) => {
                    routes.forget(peer);
                    Err(Error::Timeout)
                }
            }
        })
    }
}

impl Routes {
    async fn exchange(&self, peer: ReplicaId, request: Request) -> Result<Response, Error> {
        // Refused before a connection is opened for it.
        if let Some(answer) = crate::grpc_calls::without_call(&request) {
            return Ok(answer);
        }
        let client = self.connection(peer).await?;
        match crate::grpc_calls::send(client, &self.signer, request).await {
            Ok(response) => Ok(response),
            Err(status) => {
                let answer = answer_of(&status);
                if answer.is_err() {
                    self.forget(peer);
                }
                answer
            }
        }
    }

    /// The replica's connection, opened if there is none.
    async fn connection(&self, peer: ReplicaId) -> Result<TreeServiceClient<H2Channel>, Error> {
        if let Some(client) = self.connections.lock().unwrap().get(&peer) {
            return Ok(client.clone());
        }
        let address = (self.fronts.get(&peer))
            .ok_or_else(|| Error::Network(format!("replica-{peer} has no gRPC front")))?;
        let stream = (self.net.connect(address.clone()).await)
            .map_err(|e| Error::Network(format!("connect to {address}: {e}")))?;
        let (send, connection) =
            hyper::client::conn::http2::handshake(SimExecutor::default(), TokioIo::new(stream))
                .await
                .map_err(|e| Error::Network(format!("HTTP/2 handshake with {address}: {e}")))?;
        drop(madsim::task::spawn(async move {
            let _ = connection.await;
        }));
        let origin = format!("http://{address}")
            .parse()
            .expect("an ip:port makes an origin");
        let client = TreeServiceClient::with_origin(H2Channel(send), origin)
            .max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes);
        self.connections
            .lock()
            .unwrap()
            .insert(peer, client.clone());
        Ok(client)
    }

    fn forget(&self, peer: ReplicaId) {
        self.connections.lock().unwrap().remove(&peer);
    }
}

/// A failed call as the caller may know it: the front's answer (a status
/// it sent, which `grpc_calls::error_of` reads back as the service's
/// error), or a failure of the connection under the call (a status tonic
/// made from a transport error, or a code only a broken stream gives),
/// whose outcome is unknown.
pub fn answer_of(status: &Status) -> Result<Response, Error> {
    use std::error::Error as _;
    let broken = status.source().is_some()
        || matches!(
            status.code(),
            Code::Unknown | Code::Cancelled | Code::Internal | Code::DataLoss
        );
    if broken {
        return Err(Error::Network(format!(
            "gRPC {:?}: {}",
            status.code(),
            status.message()
        )));
    }
    Ok(Response::Error(crate::grpc_calls::error_of(status)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status the front sent is its answer, read back as the service's
    /// error; one tonic made from a failed connection, or a code only a
    /// broken stream gives, leaves the outcome unknown.
    #[test]
    fn statuses_the_front_sent_are_answers_and_broken_streams_are_not() {
        let sent = |error: Error| answer_of(&arbor::grpc::status_of(error));
        assert_eq!(
            sent(Error::Overloaded("queue full".into())),
            Ok(Response::Error(Error::Overloaded("queue full".into())))
        );
        assert_eq!(sent(Error::Timeout), Ok(Response::Error(Error::Timeout)));
        assert!(matches!(
            sent(Error::NodeNotFound(7)),
            Ok(Response::Error(Error::InvalidOp(_)))
        ));
        let refused = Error::PermissionDenied {
            operation: "Add".into(),
            caller: "k".into(),
        };
        assert!(matches!(
            sent(refused),
            Ok(Response::Error(Error::PermissionDenied { .. }))
        ));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let broken = Status::from_error(Box::new(io));
        assert!(matches!(answer_of(&broken), Err(Error::Network(_))));
        for code in [
            Code::Unknown,
            Code::Cancelled,
            Code::Internal,
            Code::DataLoss,
        ] {
            let status = Status::new(code, "h2 protocol error");
            assert!(
                matches!(answer_of(&status), Err(Error::Network(_))),
                "{code:?}"
            );
        }
    }
}
