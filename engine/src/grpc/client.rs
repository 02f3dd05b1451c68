//! A signing client of the gRPC front: every request it sends carries the
//! signature of its key over the request's body. Used by tests, the load
//! generator and the command line; gateways bring their own.

use super::pb::{self, tree_service_client::TreeServiceClient};
use super::sign::Signer;
use crate::error::{Error, Result};
use crate::types::*;
use futures::StreamExt;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::Status;

/// The body of a request that is sent signed.
pub trait SignedBody: Message + Sized {
    type Request;

    /// The request of this body with `signer`'s signature over its
    /// encoding.
    fn signed(self, signer: &Signer) -> Self::Request;
}

macro_rules! signed_requests {
    ($($request:ident => $body:ty),* $(,)?) => {$(
        impl SignedBody for $body {
            type Request = pb::$request;

            fn signed(self, signer: &Signer) -> pb::$request {
                let (key, sign) = signer.sign(&self.encode_to_vec());
                pb::$request {
                    body: Some(self),
                    signature: Some(pb::Signature { key, sign }),
                }
            }
        }
    )*};
}

signed_requests! {
    AddRequest => pb::add_request::Body,
    AddByPathRequest => pb::add_by_path_request::Body,
    RemoveRequest => pb::remove_request::Body,
    MoveRequest => pb::move_request::Body,
    GetNodeByPathRequest => pb::get_node_by_path_request::Body,
    GetSubTreeRequest => pb::get_sub_tree_request::Body,
    TreeListRequest => pb::tree_list_request::Body,
    ApplyRequest => pb::apply_request::Body,
    GetOpLogRequest => pb::get_op_log_request::Body,
}

/// Where and how to reach a front.
#[derive(Clone)]
pub struct Target {
    /// `host:port`.
    pub address: String,
    /// TLS with this client config (see `tls::grpc_client_config`);
    /// `None`: plaintext.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub connect_timeout: Duration,
    /// Largest message either way.
    pub max_message_bytes: usize,
}

impl Target {
    /// Plaintext, 2 s to connect, 4 MiB messages.
    pub fn plaintext(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            tls: None,
            connect_timeout: Duration::from_secs(2),
            max_message_bytes: 4 << 20,
        }
    }

    /// A channel to the front (HTTP/2; many calls share it).
    pub async fn connect(&self) -> Result<Channel> {
        let network = |e: tonic::transport::Error| Error::Network(format!("{}: {e}", self.address));
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{}", self.address))
            .map_err(network)?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        let Some(tls) = self.tls.clone() else {
            return endpoint.connect().await.map_err(network);
        };
        let connector = tower::service_fn(move |uri: Uri| {
            let tls = tls.clone();
            async move {
                let authority = uri
                    .authority()
                    .ok_or_else(|| std::io::Error::other("no address in the URI"))?
                    .to_string();
                let tcp = tokio::net::TcpStream::connect(authority).await?;
                tcp.set_nodelay(true)?;
                let connector = tokio_rustls::TlsConnector::from(tls);
                let stream = connector.connect(crate::tls::server_name(), tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        });
        endpoint
            .connect_with_connector(connector)
            .await
            .map_err(network)
    }
}

/// A client that signs every request with one key, over tonic's
/// `Channel` or any other HTTP/2 service `T` (the simulator's).
#[derive(Clone)]
pub struct GrpcClient<T = Channel> {
    inner: TreeServiceClient<T>,
    signer: Signer,
}

impl GrpcClient {
    pub async fn connect(target: &Target, signer: Signer) -> Result<Self> {
        let channel = target.connect().await?;
        Ok(Self::over(channel, signer, target.max_message_bytes))
    }

    /// A client on an open channel (channels are cheap to share).
    pub fn over(channel: Channel, signer: Signer, max_message_bytes: usize) -> Self {
        Self::on(TreeServiceClient::new(channel), signer, max_message_bytes)
    }
}

impl<T> GrpcClient<T>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    /// A client through `inner` (`TreeServiceClient::with_origin` over a
    /// connection of one's own).
    pub fn on(inner: TreeServiceClient<T>, signer: Signer, max_message_bytes: usize) -> Self {
        let inner = inner
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes);
        Self { inner, signer }
    }

    /// The generated client, for requests built by hand.
    pub fn raw(&mut self) -> &mut TreeServiceClient<T> {
        &mut self.inner
    }

    pub fn signer(&self) -> &Signer {
        &self.signer
    }

    /// `body` signed with this client's key.
    pub fn sign<B: SignedBody>(&self, body: B) -> B::Request {
        body.signed(&self.signer)
    }

    pub async fn add(
        &mut self,
        tree: &TreeKey,
        parent: NodeId,
        meta: &[KeyValue],
    ) -> Result<NodeId, Status> {
        let request = self.sign(pb::add_request::Body {
            container_id: tree.cid.0.to_vec(),
            tree_id: tree.tree.clone(),
            parent_id: parent,
            meta: proto_meta(meta),
            bearer_token: Vec::new(),
        });
        let body = self.inner.add(request).await?.into_inner().body;
        Ok(body.unwrap_or_default().node_id)
    }

    /// The leaf, the directories created, and the leaf's parent.
    pub async fn add_by_path(
        &mut self,
        tree: &TreeKey,
        path: &[&str],
        meta: &[KeyValue],
    ) -> Result<(Vec<NodeId>, NodeId), Status> {
        let request = self.sign(pb::add_by_path_request::Body {
            container_id: tree.cid.0.to_vec(),
            tree_id: tree.tree.clone(),
            path_attribute: ATTR_FILE_NAME.into(),
            path: path.iter().map(|c| c.to_string()).collect(),
            meta: proto_meta(meta),
            bearer_token: Vec::new(),
        });
        let body = self.inner.add_by_path(request).await?.into_inner().body;
        let body = body.unwrap_or_default();
        Ok((body.nodes, body.parent_id))
    }

    pub async fn remove(&mut self, tree: &TreeKey, node: NodeId) -> Result<(), Status> {
        let request = self.sign(pb::remove_request::Body {
            container_id: tree.cid.0.to_vec(),
            tree_id: tree.tree.clone(),
            node_id: node,
            bearer_token: Vec::new(),
        });
        self.inner.remove(request).await?;
        Ok(())
    }

    pub async fn move_node(
        &mut self,
        tree: &TreeKey,
        parent: NodeId,
        node: NodeId,
        meta: &[KeyValue],
    ) -> Result<(), Status> {
        let request = self.sign(pb::move_request::Body {
            container_id: tree.cid.0.to_vec(),
            tree_id: tree.tree.clone(),
            parent_id: parent,
            node_id: node,
            meta: proto_meta(meta),
            bearer_token: Vec::new(),
        });
        self.inner.r#move(request).await?;
        Ok(())
    }

    /// Nodes at `path` with every attribute.
    pub async fn get_node_by_path(
        &mut self,
        tree: &TreeKey,
        path: &[&str],
        latest_only: bool,
    ) -> Result<Vec<NodeInfo>, Status> {
        let request = self.sign(pb::get_node_by_path_request::Body {
            container_id: tree.cid.0.to_vec(),
            tree_id: tree.tree.clone(),
            path_attribute: ATTR_FILE_NAME.into(),
            path: path.iter().map(|c| c.to_string()).collect(),
            attributes: Vec::new(),
            latest_only,
            all_attributes: true,
            bearer_token: Vec::new(),
        });
        let body = self
            .inner
            .get_node_by_path(request)
            .await?
            .into_inner()
            .body;
        Ok(body
            .unwrap_or_default()
            .nodes
            .into_iter()
            .map(|info| NodeInfo {
                id: info.node_id,
                parent: info.parent_id,
                meta: Meta {
                    time: info.timestamp,
                    items: native_meta(info.meta),
                },
            })
            .collect())
    }

    /// The whole stream of one GetSubTree, collected.
    pub async fn get_subtree(
        &mut self,
        tree: &TreeKey,
        root: NodeId,
        depth: u32,
        by_name: bool,
    ) -> Result<Vec<NodeInfo>, Status> {
        use pb::get_sub_tree_request::body::{order::Direction, Order};
        let order_by = by_name.then_some(Order {
            direction: Direction::Asc as i32,
        });
        let request = self.sign(pb::get_sub_tree_request::Body {
            container_id: tree.cid.0.to_vec(),
            tree_id: tree.tree.clone(),
            root_id: vec![root],
            depth,
            bearer_token: Vec::new(),
            order_by,
        });
        let mut stream = self.inner.get_sub_tree(request).await?.into_inner();
        let mut nodes = Vec::new();
        while let Some(item) = stream.next().await {
            let body = item?.body.unwrap_or_default();
            nodes.push(NodeInfo {
                id: body.node_id,
                parent: body.parent_id,
                meta: Meta {
                    time: body.timestamp,
                    items: native_meta(body.meta),
                },
            });
        }
        Ok(nodes)
    }

    pub async fn tree_list(&mut self, cid: &ContainerId) -> Result<Vec<String>, Status> {
        let request = self.sign(pb::tree_list_request::Body {
            container_id: cid.0.to_vec(),
        });
        let body = self.inner.tree_list(request).await?.into_inner().body;
        Ok(body.unwrap_or_default().ids)
    }

    pub async fn healthcheck(&mut self) -> Result<(), Status> {
        let request = pb::HealthcheckRequest {
            body: Some(pb::healthcheck_request::Body {}),
            signature: None,
        };
        self.inner.healthcheck(request).await?;
        Ok(())
    }
}

pub fn proto_meta(meta: &[KeyValue]) -> Vec<pb::KeyValue> {
    meta.iter()
        .map(|kv| pb::KeyValue {
            key: kv.key.clone(),
            value: kv.value.clone(),
        })
        .collect()
}

pub fn native_meta(meta: Vec<pb::KeyValue>) -> Vec<KeyValue> {
    meta.into_iter()
        .map(|kv| KeyValue {
            key: kv.key,
            value: kv.value,
        })
        .collect()
}
