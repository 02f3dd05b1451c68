//! The gRPC calls translated to the service's own requests, one call at a
//! time: what gateways send and expect on one side, `Service::handle` on
//! the other (docs/grpc.md says what is translated and why).
//!
//! Every call but `Healthcheck` must be signed: the key that signed it is
//! the caller whose rights `access:` decides, or a replica when it is one
//! of `node.peers[].public_key`. `Apply` and `GetOpLog` are served to
//! replicas only. Streams read one page at a time (`grpc.stream_page_nodes`)
//! and ask for the next only when the client has taken the last, so a
//! stream holds one page whatever it streams in all.

use super::meta;
use super::pb::{self, tree_service_server::TreeService};
use super::sign::{PublicKey, SignatureError, Verifier};
use crate::config::Config;
use crate::error::Error;
use crate::forest::{ListCursor, ListOrder};
use crate::identity::Caller;
use crate::proto::{Request, Response};
use crate::service::Service;
use crate::tcp::Handler;
use crate::types::*;
use futures::stream::{self, BoxStream, StreamExt};
use prost::Message;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use tonic::Status;

/// The `tree.TreeService` of one node.
pub struct Front {
    /// What answers the translated requests: the node's service, or
    /// something that watches it (the simulator's answer oracle).
    service: Arc<dyn Handler>,
    verifier: Verifier,
    /// Replicas by the key they sign gRPC calls with.
    peers_by_key: BTreeMap<String, ReplicaId>,
    page_nodes: usize,
}

impl Front {
    pub fn new(service: Arc<Service>) -> Self {
        let handler: Arc<dyn Handler> = service.clone();
        Self::through(service.config(), handler)
    }

    /// The front of a node configured by `config` whose requests
    /// `handler` answers.
    pub fn through(config: &Config, handler: Arc<dyn Handler>) -> Self {
        let peers_by_key = peer_keys(config);
        let page_nodes = config.grpc.stream_page_nodes;
        let verifier = Verifier::new(named_keys(config), config.grpc.key_tables_max);
        Self {
            service: handler,
            verifier,
            peers_by_key,
            page_nodes,
        }
    }

    /// The caller of a signed call: the replica the key belongs to, or the
    /// key itself.
    fn caller<B: Message>(
        &self,
        operation: &str,
        body: &B,
        signature: Option<&pb::Signature>,
    ) -> Result<Caller, Status> {
        let signed = body.encode_to_vec();
        let (key, sign) = signature.map_or((&[][..], &[][..]), |s| (&s.key, &s.sign));
        let key = (self.verifier)
            .verify(key, sign, &signed)
            .map_err(|e| signature_refused(operation, e))?;
        Ok(self.caller_of_key(key.hex()))
    }

    fn caller_of_key(&self, hex: String) -> Caller {
        match self.peers_by_key.get(&hex) {
            Some(&replica) => Caller::Peer(replica),
            None => Caller::Key(hex),
        }
    }

    /// Answers `request` as `caller`; an error answer becomes its status.
    async fn call(&self, caller: &Caller, request: Request) -> Result<Response, Status> {
        call(&*self.service, caller, request)
            .await
            .map_err(status_of)
    }
}

/// Every key the configuration names: replicas' first, then those of
/// `access:`, each once.
fn named_keys(config: &Config) -> Vec<PublicKey> {
    let peers = config
        .node
        .peers
        .iter()
        .filter_map(|p| p.public_key.clone());
    let access = &config.access;
    let grants = access.containers.iter().map(|c| &c.grants);
    let names = grants
        .chain([&access.default])
        .flat_map(|g| g.owners.iter().chain(&g.writers).chain(&g.readers))
        .filter(|name| super::looks_like_key(name))
        .cloned();
    let mut seen = std::collections::BTreeSet::new();
    peers
        .chain(names)
        .filter(|hex| seen.insert(hex.clone()))
        .filter_map(|hex| PublicKey::from_hex(&hex))
        .collect()
}

/// `node.peers[].public_key` as a lookup.
fn peer_keys(config: &Config) -> BTreeMap<String, ReplicaId> {
    let peers = config.node.peers.iter();
    peers
        .filter_map(|p| p.public_key.clone().map(|key| (key, p.replica_id)))
        .collect()
}

async fn call(service: &dyn Handler, caller: &Caller, request: Request) -> Result<Response, Error> {
    match service.handle(caller, request).await {
        Response::Error(error) => Err(error),
        response => Ok(response),
    }
}

/// A request's body, or the empty body when it sent none (its fields then
/// read as zero values, as protobuf has it).
fn body_of<B: Default>(body: Option<B>) -> B {
    body.unwrap_or_default()
}

fn tree_key(container_id: &[u8], tree_id: &str) -> Result<TreeKey, Status> {
    let cid: [u8; 32] = container_id.try_into().map_err(|_| {
        Status::invalid_argument(format!(
            "container_id: expected 32 bytes, got {}",
            container_id.len()
        ))
    })?;
    Ok(TreeKey::new(ContainerId(cid), tree_id))
}

/// `path_attribute`: empty means `FileName`, as clients expect.
fn path_attribute(attr: String) -> String {
    if attr.is_empty() {
        ATTR_FILE_NAME.to_string()
    } else {
        attr
    }
}

fn items_of(meta: Vec<pb::KeyValue>) -> Vec<KeyValue> {
    super::client::native_meta(meta)
}

fn proto_items(items: Vec<KeyValue>) -> Vec<pb::KeyValue> {
    items
        .into_iter()
        .map(|kv| pb::KeyValue {
            key: kv.key,
            value: kv.value,
        })
        .collect()
}

/// The status of a refused or failed call. Gateways read the text:
/// "not found" means no such node (or tree, or container here), "is
/// denied by" a refusal of rights.
pub fn status_of(error: Error) -> Status {
    let text = error.to_string();
    match error {
        Error::NodeNotFound(_) | Error::TreeNotFound => Status::not_found(text),
        Error::NotReplica(cid) => Status::not_found(format!(
            "container {cid} not found: this node does not hold it"
        )),
        Error::ParentNotLive(parent) => Status::not_found(format!(
            "parent node {parent} not found: it is removed or not reachable from the root"
        )),
        Error::PermissionDenied { operation, caller } => Status::permission_denied(format!(
            "access to operation {operation} is denied by the access rules: {caller} holds no such right"
        )),
        // A stream whose next page could not continue where the last one
        // ended: the subtree moved under it; the client starts again.
        Error::CursorRefused(_) => Status::aborted(text),
        Error::UnsupportedAttribute(_)
        | Error::EmptyPath
        | Error::RootImmutable
        | Error::InvalidOp(_)
        | Error::Malformed(_) => Status::invalid_argument(text),
        Error::TooLarge { .. } => Status::resource_exhausted(text),
        Error::Timeout | Error::NotReplicated { .. } => Status::deadline_exceeded(text),
        Error::Overloaded(_)
        | Error::Storage(_)
        | Error::Network(_)
        | Error::ShuttingDown
        | Error::Rejoining => Status::unavailable(text),
        Error::CounterTooFar { .. } | Error::StampConflict(_) => {
            Status::failed_precondition(text)
        }
        Error::Config(_) | Error::IdentityRefused(_) | Error::WrongPeer { .. } => {
            Status::internal(text)
        }
    }
}

/// Refused signatures logged, over every gRPC front of the process.
static SIGNATURES_REFUSED: crate::metrics::WarnLimit =
    crate::metrics::WarnLimit::new(crate::metrics::REFUSALS_LOGGED_PER_MINUTE);

fn signature_refused(operation: &str, error: SignatureError) -> Status {
    if let Some(held_back) = SIGNATURES_REFUSED.admit() {
        tracing::warn!(operation, %error, held_back, "gRPC call refused: signature");
    }
    Status::unauthenticated(format!(
        "access to operation {operation} is denied by the signature check: {error}"
    ))
}

fn replicas_only(operation: &str, caller: &Caller) -> Result<(), Status> {
    match caller {
        Caller::Peer(_) => Ok(()),
        other => Err(Status::permission_denied(format!(
            "access to operation {operation} is denied by the access rules: {other} is no replica \
             (node.peers[].public_key)"
        ))),
    }
}

/// A response that is the wrong kind for its request is a bug of the
/// service, not of the caller.
fn unexpected(response: Response) -> Status {
    panic!("the service answered with the wrong kind of response: {response:?}")
}

fn reply<T>(message: T) -> Result<tonic::Response<T>, Status> {
    Ok(tonic::Response::new(message))
}

#[tonic::async_trait]
impl TreeService for Front {
    async fn add(
        &self,
        request: tonic::Request<pb::AddRequest>,
    ) -> Result<tonic::Response<pb::AddResponse>, Status> {
        let request = request.into_inner();
        let body = body_of(request.body);
        let caller = self.caller("Add", &body, request.signature.as_ref())?;
        let tree = tree_key(&body.container_id, &body.tree_id)?;
        let add = Request::Add {
            tree,
            parent: body.parent_id,
            items: items_of(body.meta),
        };
        match self.call(&caller, add).await? {
            Response::Added { node } => reply(pb::AddResponse {
                body: Some(pb::add_response::Body { node_id: node }),
                signature: None,
            }),
            other => Err(unexpected(other)),
        }
    }

    async fn add_by_path(
        &self,
        request: tonic::Request<pb::AddByPathRequest>,
    ) -> Result<tonic::Response<pb::AddByPathResponse>, Status> {
        let request = request.into_inner();
        let body = body_of(request.body);
        let caller = self.caller("AddByPath", &body, request.signature.as_ref())?;
        let tree = tree_key(&body.container_id, &body.tree_id)?;
        let attr = path_attribute(body.path_attribute);
        let items = items_of(body.meta);
        // An empty path puts the leaf under the root: every object at the
        // top of a bucket is added so.
        let call = if body.path.is_empty() && attr == ATTR_FILE_NAME {
            Request::Add {
                tree,
                parent: ROOT,
                items,
            }
        } else {
            Request::AddByPath {
                tree,
                attr,
                path: body.path,
                items,
            }
        };
        let (nodes, parent_id) = match self.call(&caller, call).await? {
            Response::Added { node } => (vec![node], ROOT),
            Response::AddedByPath {
                leaf,
                created,
                parent,
            } => (std::iter::once(leaf).chain(created).collect(), parent),
            other => return Err(unexpected(other)),
        };
        reply(pb::AddByPathResponse {
            body: Some(pb::add_by_path_response::Body { nodes, parent_id }),
            signature: None,
        })
    }

    async fn remove(
        &self,
        request: tonic::Request<pb::RemoveRequest>,
    ) -> Result<tonic::Response<pb::RemoveResponse>, Status> {
        let request = request.into_inner();
        let body = body_of(request.body);
        let caller = self.caller("Remove", &body, request.signature.as_ref())?;
        let tree = tree_key(&body.container_id, &body.tree_id)?;
        let node = body.node_id;
        // Removing what is not there succeeds: the caller's wish holds.
        match call(&*self.service, &caller, Request::Remove { tree, node }).await {
            Ok(Response::Done) | Err(Error::NodeNotFound(_) | Error::TreeNotFound) => {}
            Err(error) => return Err(status_of(error)),
            Ok(other) => return Err(unexpected(other)),
        }
        reply(pb::RemoveResponse {
            body: Some(pb::remove_response::Body {}),
            signature: None,
        })
    }

    async fn r#move(
        &self,
        request: tonic::Request<pb::MoveRequest>,
    ) -> Result<tonic::Response<pb::MoveResponse>, Status> {
        let request = request.into_inner();
        let body = body_of(request.body);
        let caller = self.caller("Move", &body, request.signature.as_ref())?;
        let tree = tree_key(&body.container_id, &body.tree_id)?;
        let moved = Request::Move {
            tree,
            parent: body.parent_id,
            node: body.node_id,
            items: items_of(body.meta),
        };
        match self.call(&caller, moved).await? {
            Response::Done => reply(pb::MoveResponse {
                body: Some(pb::move_response::Body {}),
                signature: None,
            }),
            other => Err(unexpected(other)),
        }
    }

    async fn get_node_by_path(
        &self,
        request: tonic::Request<pb::GetNodeByPathRequest>,
    ) -> Result<tonic::Response<pb::GetNodeByPathResponse>, Status> {
        let request = request.into_inner();
        let body = body_of(request.body);
        let caller = self.caller("GetNodeByPath", &body, request.signature.as_ref())?;
        let tree = tree_key(&body.container_id, &body.tree_id)?;
        let lookup = Request::GetNodeByPath {
            tree,
            attr: path_attribute(body.path_attribute),
            path: body.path,
            attributes: body.attributes,
            latest_only: body.latest_only,
            all_attributes: body.all_attributes,
        };
        let nodes = match call(&*self.service, &caller, lookup).await {
            Ok(Response::Nodes(nodes)) => nodes,
            // An empty path names nothing: an empty answer (the rights
            // were checked before the path was).
            Err(Error::EmptyPath) => Vec::new(),
            Err(error) => return Err(status_of(error)),
            Ok(other) => return Err(unexpected(other)),
        };
        let nodes = nodes
            .into_iter()
            .map(|node| pb::get_node_by_path_response::Info {
                node_id: node.id,
                timestamp: node.meta.time,
                meta: proto_items(node.meta.items),
                parent_id: node.parent,
            })
            .collect();
        reply(pb::GetNodeByPathResponse {
            body: Some(pb::get_node_by_path_response::Body { nodes }),
            signature: None,
        })
    }

    type GetSubTreeStream = BoxStream<'static, Result<pb::GetSubTreeResponse, Status>>;

    async fn get_sub_tree(
        &self,
        request: tonic::Request<pb::GetSubTreeRequest>,
    ) -> Result<tonic::Response<Self::GetSubTreeStream>, Status> {
        let request = request.into_inner();
        let body = body_of(request.body);
        let caller = subtree_caller(self, &body, request.signature.as_ref())?;
        let tree = tree_key(&body.container_id, &body.tree_id)?;
        let order = match body.order_by.map(|o| o.direction()) {
            Some(pb::get_sub_tree_request::body::order::Direction::Asc) => ListOrder::Name,
            _ => ListOrder::Id,
        };
        let roots = if body.root_id.is_empty() {
            vec![ROOT]
        } else {
            body.root_id
        };
        let walk = SubtreeWalk {
            service: self.service.clone(),
            caller,
            tree,
            depth: body.depth,
            order,
            page_nodes: self.page_nodes,
        };
        // The first page is read before the stream is answered, so that a
        // refusal (rights, an unknown tree) is the call's status.
        let first = walk.first_page(roots[0]).await?;
        let mut roots = VecDeque::from(roots);
        roots.pop_front();
        Ok(tonic::Response::new(walk.stream(first, roots)))
    }

    async fn tree_list(
        &self,
        request: tonic::Request<pb::TreeListRequest>,
    ) -> Result<tonic::Response<pb::TreeListResponse>, Status> {
        let request = request.into_inner();
        let body = body_of(request.body);
        let caller = self.caller("TreeList", &body, request.signature.as_ref())?;
        let cid = tree_key(&body.container_id, "")?.cid;
        match self.call(&caller, Request::TreeList { cid }).await? {
            Response::Trees(mut ids) => {
                ids.sort();
                reply(pb::TreeListResponse {
                    body: Some(pb::tree_list_response::Body { ids }),
                    signature: None,
                })
            }
            other => Err(unexpected(other)),
        }
    }

    async fn apply(
        &self,
        request: tonic::Request<pb::ApplyRequest>,
    ) -> Result<tonic::Response<pb::ApplyResponse>, Status> {
        let request = request.into_inner();
        let body = body_of(request.body);
        let caller = self.caller("Apply", &body, request.signature.as_ref())?;
        replicas_only("Apply", &caller)?;
        let tree = tree_key(&body.container_id, &body.tree_id)?;
        let operation = body
            .operation
            .ok_or_else(|| Status::invalid_argument("operation: missing"))?;
        let op = Move {
            parent: operation.parent_id,
            child: operation.child_id,
            meta: meta::decode(&operation.meta).map_err(status_of)?,
        };
        let apply = Request::Apply {
            tree,
            ops: vec![op],
        };
        match self.call(&caller, apply).await? {
            Response::Applied { .. } => reply(pb::ApplyResponse {
                body: Some(pb::apply_response::Body {}),
                signature: None,
            }),
            other => Err(unexpected(other)),
        }
    }

    type GetOpLogStream = BoxStream<'static, Result<pb::GetOpLogResponse, Status>>;

    async fn get_op_log(
        &self,
        request: tonic::Request<pb::GetOpLogRequest>,
    ) -> Result<tonic::Response<Self::GetOpLogStream>, Status> {
        let request = request.into_inner();
        let body = body_of(request.body);
        let caller = self.caller("GetOpLog", &body, request.signature.as_ref())?;
        replicas_only("GetOpLog", &caller)?;
        let tree = tree_key(&body.container_id, &body.tree_id)?;
        let log = LogWalk {
            service: self.service.clone(),
            caller,
            tree,
            next_height: body.height,
            left: match body.count {
                0 => u64::MAX,
                count => count,
            },
            page_ops: self.page_nodes,
        };
        let (first, log) = log.page().await?;
        Ok(tonic::Response::new(log.stream(first)))
    }

    async fn healthcheck(
        &self,
        _request: tonic::Request<pb::HealthcheckRequest>,
    ) -> Result<tonic::Response<pb::HealthcheckResponse>, Status> {
        match self.call(&Caller::Anonymous, Request::Healthcheck).await? {
            Response::Health { .. } => reply(pb::HealthcheckResponse {
                body: Some(pb::healthcheck_response::Body {}),
                signature: None,
            }),
            other => Err(unexpected(other)),
        }
    }
}

/// GetSubTree bodies are signed as their client encoded them. A client
/// that knows one root sends it as a plain integer, one that knows a
/// list as a packed list; both decode into the list, which encodes back
/// packed. So a single root is checked in both forms.
fn subtree_caller(
    front: &Front,
    body: &pb::get_sub_tree_request::Body,
    signature: Option<&pb::Signature>,
) -> Result<Caller, Status> {
    match front.caller("GetSubTree", body, signature) {
        Ok(caller) => Ok(caller),
        Err(refused) if body.root_id.len() == 1 => {
            let single = SingleRootBody::from(body);
            front
                .caller("GetSubTree", &single, signature)
                .map_err(|_| refused)
        }
        Err(refused) => Err(refused),
    }
}

/// A GetSubTree body with `root_id` as one plain integer: the encoding
/// of clients that know a single root.
#[derive(Clone, PartialEq, Message)]
struct SingleRootBody {
    #[prost(bytes = "vec", tag = "1")]
    container_id: Vec<u8>,
    #[prost(string, tag = "2")]
    tree_id: String,
    #[prost(uint64, tag = "3")]
    root_id: u64,
    #[prost(uint32, tag = "4")]
    depth: u32,
    #[prost(bytes = "vec", tag = "5")]
    bearer_token: Vec<u8>,
    #[prost(message, optional, tag = "6")]
    order_by: Option<pb::get_sub_tree_request::body::Order>,
}

impl From<&pb::get_sub_tree_request::Body> for SingleRootBody {
    fn from(body: &pb::get_sub_tree_request::Body) -> Self {
        Self {
            container_id: body.container_id.clone(),
            tree_id: body.tree_id.clone(),
            root_id: body.root_id[0],
            depth: body.depth,
            bearer_token: body.bearer_token.clone(),
            order_by: body.order_by,
        }
    }
}

/// One GetSubTree stream: pre-order walks of one root after another, a
/// page at a time.
struct SubtreeWalk {
    service: Arc<dyn Handler>,
    caller: Caller,
    tree: TreeKey,
    depth: u32,
    order: ListOrder,
    page_nodes: usize,
}

/// Where a subtree walk stands between pages.
struct SubtreeState {
    walk: Arc<SubtreeWalk>,
    buffered: VecDeque<NodeInfo>,
    /// The root being walked and where its next page starts; `None` once
    /// it is done.
    resume: Option<(NodeId, ListCursor)>,
    roots: VecDeque<NodeId>,
    failed: bool,
}

/// A page of one root's walk and where the next one starts.
type SubtreePageOf = (Vec<NodeInfo>, Option<ListCursor>);

impl SubtreeWalk {
    async fn page(&self, root: NodeId, after: Option<ListCursor>) -> Result<SubtreePageOf, Status> {
        let first = after.is_none();
        let request = Request::GetSubTreePage {
            tree: self.tree.clone(),
            root,
            depth: self.depth,
            order: self.order,
            after,
            limit: self.page_nodes as u32,
        };
        match call(&*self.service, &self.caller, request).await {
            Ok(Response::Page { nodes, next }) => Ok((nodes, next)),
            // A root that is not there is reported as one node with an
            // empty meta, as clients expect; a missing tree stays an error.
            Err(Error::NodeNotFound(missing)) if missing == root && first => Ok((
                vec![NodeInfo {
                    id: root,
                    parent: ROOT,
                    meta: Meta::default(),
                }],
                None,
            )),
            Err(error) => Err(status_of(error)),
            Ok(other) => Err(unexpected(other)),
        }
    }

    async fn first_page(&self, root: NodeId) -> Result<(NodeId, SubtreePageOf), Status> {
        Ok((root, self.page(root, None).await?))
    }

    fn stream(
        self,
        (root, (nodes, next)): (NodeId, SubtreePageOf),
        roots: VecDeque<NodeId>,
    ) -> BoxStream<'static, Result<pb::GetSubTreeResponse, Status>> {
        let state = SubtreeState {
            walk: Arc::new(self),
            buffered: nodes.into(),
            resume: next.map(|cursor| (root, cursor)),
            roots,
            failed: false,
        };
        stream::unfold(state, |mut state| async move {
            loop {
                if let Some(node) = state.buffered.pop_front() {
                    return Some((Ok(subtree_item(node)), state));
                }
                if state.failed {
                    return None;
                }
                let (root, after) = match state.resume.take() {
                    Some((root, cursor)) => (root, Some(cursor)),
                    None => (state.roots.pop_front()?, None),
                };
                match state.walk.page(root, after).await {
                    Ok((nodes, next)) => {
                        state.buffered = nodes.into();
                        if crate::canary::active(crate::canary::Canary::StreamSkipsPageStart) {
                            state.buffered.pop_front();
                        }
                        state.resume = next.map(|cursor| (root, cursor));
                    }
                    Err(status) => {
                        state.failed = true;
                        return Some((Err(status), state));
                    }
                }
            }
        })
        .boxed()
    }
}

fn subtree_item(node: NodeInfo) -> pb::GetSubTreeResponse {
    pb::GetSubTreeResponse {
        body: Some(pb::get_sub_tree_response::Body {
            node_id: node.id,
            parent_id: node.parent,
            timestamp: node.meta.time,
            meta: proto_items(node.meta.items),
        }),
        signature: None,
    }
}

/// One GetOpLog stream: the log from a height on, a page at a time.
struct LogWalk {
    service: Arc<dyn Handler>,
    caller: Caller,
    tree: TreeKey,
    next_height: u64,
    /// Ops the caller still wants.
    left: u64,
    page_ops: usize,
}

impl LogWalk {
    /// The next page; an empty one ends the stream.
    async fn page(mut self) -> Result<(Vec<LogEntry>, Self), Status> {
        if self.left == 0 {
            return Ok((Vec::new(), self));
        }
        let limit = (self.page_ops as u64).min(self.left) as u32;
        let request = Request::GetOpLog {
            tree: self.tree.clone(),
            from_height: self.next_height,
            limit,
        };
        match call(&*self.service, &self.caller, request)
            .await
            .map_err(status_of)?
        {
            Response::OpLog {
                entries,
                next_height,
            } => {
                self.next_height = next_height;
                self.left -= (entries.len() as u64).min(self.left);
                Ok((entries, self))
            }
            other => Err(unexpected(other)),
        }
    }

    fn stream(
        self,
        first: Vec<LogEntry>,
    ) -> BoxStream<'static, Result<pb::GetOpLogResponse, Status>> {
        let state = (VecDeque::from(first), Some(self));
        stream::unfold(state, |(mut buffered, mut walk)| async move {
            loop {
                if let Some(entry) = buffered.pop_front() {
                    return Some((Ok(log_item(entry.op)), (buffered, walk)));
                }
                let more = walk.take()?;
                match more.page().await {
                    Ok((entries, _)) if entries.is_empty() => return None,
                    Ok((entries, more)) => {
                        buffered = entries.into();
                        walk = Some(more);
                    }
                    Err(status) => return Some((Err(status), (buffered, None))),
                }
            }
        })
        .boxed()
    }
}

fn log_item(op: Move) -> pb::GetOpLogResponse {
    pb::GetOpLogResponse {
        body: Some(pb::get_op_log_response::Body {
            operation: Some(pb::LogMove {
                parent_id: op.parent,
                meta: meta::encode(&op.meta),
                child_id: op.child,
            }),
        }),
        signature: None,
    }
}
