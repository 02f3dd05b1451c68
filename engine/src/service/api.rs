//! Requests: client writes and reads, replicated ops (Apply), the sync
//! reads peers ask of this node, and Drop (docs/design.md §4). Input is
//! checked by `validate` before it reaches the batcher or the forest.

use super::push::ITEM_OVERHEAD_BYTES;
use super::{Core, Service};
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::forest::{
    AnswerBounds, Forest, ListPage, PathAnswer, WriteOp, WriteOutcome, WriteRequest,
};
use crate::identity::Caller;
use crate::probe::{self, Probe};
use crate::proto::{Request, Response};
use crate::runtime::blocking;
use crate::types::*;
use crate::validate::{self, too_large};
use std::collections::BTreeSet;

/// Largest encoding of one `LogStamp` (three varint-encoded u64).
const LOG_STAMP_BYTES_MAX: usize = 30;

impl Service {
    /// Answers one request from `caller`, whose identity the transport
    /// established; errors are `Response::Error`. The caller's rights are
    /// checked before anything else (docs/design.md §9).
    pub async fn handle(&self, caller: &Caller, request: Request) -> Response {
        let kind = request.kind();
        let started = self.core.env.clock.now();
        let response = self.answer(caller, request).await;
        let took = self.core.env.clock.now().saturating_sub(started);
        self.core.request_latency.observe(kind, took);
        response
    }

    async fn answer(&self, caller: &Caller, request: Request) -> Response {
        if self.core.stopped() {
            return Response::Error(Error::ShuttingDown);
        }
        let checked = self
            .core
            .access
            .check(&self.core.membership, caller, &request);
        let result = match checked {
            Ok(()) => self.dispatch(caller, request).await,
            Err(denied) => Err(denied),
        };
        match result {
            Ok(response) => response,
            Err(error) => {
                self.core.note_error(&error);
                if let Error::PermissionDenied { operation, .. } = &error {
                    tracing::warn!(%caller, operation, "request refused: permission denied");
                    self.core.trust.note(&error);
                }
                Response::Error(error)
            }
        }
    }

    /// One arm per request kind and no catch-all: a new kind does not
    /// compile until it is routed. Reads run off the async workers.
    async fn dispatch(&self, caller: &Caller, request: Request) -> Result<Response> {
        let limits = self.core.config.limits.input();
        match request {
            // Open to everyone (see `access`): a connection says who it is
            // and the service checks the claim itself (service/hello.rs).
            Request::Hello {
                cluster_id,
                replica_id,
            } => Ok(self.hello(caller, &cluster_id, replica_id)),
            Request::Add {
                tree,
                parent,
                items,
            } => {
                validate::items(&items, limits)?;
                let op = WriteOp::Move {
                    parent,
                    child: None,
                    items,
                };
                match self.write(tree, op).await? {
                    WriteOutcome::Moved { node, .. } => Ok(Response::Added { node }),
                    other => Err(unexpected(other)),
                }
            }
            Request::AddByPath {
                tree,
                attr,
                path,
                items,
            } => self.add_by_path(tree, attr, path, items).await,
            Request::Move {
                tree,
                parent,
                node,
                items,
            } => {
                validate::movable(node)?;
                validate::items(&items, limits)?;
                let child = Some(node);
                let op = WriteOp::Move {
                    parent,
                    child,
                    items,
                };
                self.write(tree, op).await.map(|_| Response::Done)
            }
            Request::Remove { tree, node } => {
                validate::movable(node)?;
                let op = WriteOp::Remove { node };
                let removed = self.write(tree, op).await;
                if canary::active(Canary::RemoveMissingDone)
                    && matches!(removed, Err(Error::NodeNotFound(_)))
                {
                    return Ok(Response::Done); // planted bug
                }
                removed.map(|_| Response::Done)
            }
            Request::Apply { tree, ops } => self.apply(caller, tree, ops).await,
            Request::Drop { cid, tree } => self.drop_trees(cid, tree).await,
            Request::GetNodeByPath {
                tree,
                attr,
                path,
                attributes,
                latest_only,
                all_attributes,
            } => {
                self.read(move |core| {
                    let keep = |kv: &KeyValue| all_attributes || attributes.contains(&kv.key);
                    core.get_node_by_path(&tree, &attr, &path, latest_only, &keep)
                })
                .await
            }
            Request::GetMeta { tree, node } => {
                self.read(move |core| core.get_meta(&tree, node)).await
            }
            Request::GetSubTree { tree, root, depth } => {
                self.read(move |core| core.get_subtree(&tree, root, depth))
                    .await
            }
            Request::ListChildren {
                tree,
                parent,
                order,
                after,
                limit,
            } => {
                self.read(move |core| {
                    core.list_page(&tree, limit, |forest, bounds| {
                        forest.list_children_page(&tree, parent, order, after.as_ref(), bounds)
                    })
                })
                .await
            }
            Request::GetSubTreePage {
                tree,
                root,
                depth,
                order,
                after,
                limit,
            } => {
                self.read(move |core| {
                    core.list_page(&tree, limit, |forest, bounds| {
                        forest.get_subtree_page(&tree, root, depth, order, after.as_ref(), bounds)
                    })
                })
                .await
            }
            Request::TreeList { cid } => self.read(move |core| core.tree_list(&cid)).await,
            Request::GetOpLog {
                tree,
                from_height,
                limit,
            } => {
                self.read(move |core| core.op_log(&tree, from_height, limit))
                    .await
            }
            Request::GetOpLogStamps {
                tree,
                from_height,
                limit,
            } => {
                self.read(move |core| core.op_log_stamps(&tree, from_height, limit))
                    .await
            }
            Request::Healthcheck => self.read(|core| core.health()).await,
        }
    }

    /// Runs a read on the blocking pool: a read may walk a large subtree
    /// or a page of the log, and redb's reads block.
    async fn read<F>(&self, read: F) -> Result<Response>
    where
        F: FnOnce(&Core) -> Result<Response> + Send + 'static,
    {
        let core = self.core.clone();
        blocking(&*self.core.env.runtime, move || read(&core)).await
    }

    /// A local write, answered once committed here and, with
    /// `tree.ack_replicas` above 1, once that many replicas hold it.
    async fn add_by_path(
        &self,
        tree: TreeKey,
        attr: String,
        path: Vec<String>,
        items: Vec<KeyValue>,
    ) -> Result<Response> {
        let limits = self.core.config.limits.input();
        if let Err(error) = validate::path(&attr, &path, limits) {
            if canary::active(Canary::DefiniteFailureApplied) {
                // Planted bug: the refused write is queued anyway.
                let attr = ATTR_FILE_NAME.to_string();
                let op = WriteOp::AddByPath { attr, path, items };
                let _ = self.write(tree, op).await;
            }
            return Err(error);
        }
        validate::items(&items, limits)?;
        let op = WriteOp::AddByPath { attr, path, items };
        match self.write(tree, op).await? {
            WriteOutcome::AddedByPath {
                leaf,
                created,
                parent,
                ..
            } => Ok(Response::AddedByPath {
                leaf,
                created,
                parent,
            }),
            other => Err(unexpected(other)),
        }
    }

    async fn write(&self, tree: TreeKey, op: WriteOp) -> Result<WriteOutcome> {
        self.core.check_tree_key(&tree)?;
        self.core.rejoin.check_writable()?;
        if self.core.config.tree.ack_replicas <= 1 {
            return self.core.batcher.submit(WriteRequest { tree, op }).await;
        }
        let watch = self.core.acks.watch(&tree)?;
        let request = WriteRequest {
            tree: tree.clone(),
            op,
        };
        let outcome = self.core.batcher.submit(request).await?;
        if canary::active(Canary::AckBeforeReplicas) {
            // Planted bug: answered before any peer holds the write.
            return Ok(outcome);
        }
        let ts = match &outcome {
            WriteOutcome::Moved { ts, .. } | WriteOutcome::AddedByPath { ts, .. } => *ts,
            other => return Err(unexpected(other.clone())),
        };
        self.core.await_replicas(&watch, &tree, ts).await?;
        Ok(outcome)
    }

    /// Replicated ops: validated, then applied in one batch. Any failure is
    /// reported so the sender keeps them and retries.
    async fn apply(&self, caller: &Caller, tree: TreeKey, ops: Vec<Move>) -> Result<Response> {
        self.core.check_tree_key(&tree)?;
        let page = self.core.config.limits.sync_page_size;
        if ops.len() > page {
            return Err(too_large("apply ops", ops.len(), page));
        }
        let limits = self.core.config.limits.input();
        for op in &ops {
            validate::replicated(op, limits)?;
        }
        // The caller may replicate the container (checked in `handle`);
        // whose ops it may carry needs their (valid) stamps.
        let members = &self.core.membership;
        (self.core.access).check_apply_origin(members, caller, &tree.cid, &ops)?;
        let requests = ops
            .into_iter()
            .map(|op| WriteRequest {
                tree: tree.clone(),
                op: WriteOp::Apply { op },
            })
            .collect();
        let mut fresh = 0u32;
        let mut first_error = None;
        for result in self.core.batcher.submit_all(requests).await? {
            match result {
                Ok(WriteOutcome::Applied { fresh: true }) => fresh += 1,
                Ok(_) => {}
                Err(error) => {
                    self.note_refused_op(caller, &tree, &error);
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            None => Ok(Response::Applied { fresh }),
            Some(error) => Err(error),
        }
    }

    /// Counts and reports an op a peer pushed that was refused for what
    /// it carries (docs/design.md §9).
    fn note_refused_op(&self, caller: &Caller, tree: &TreeKey, error: &Error) {
        self.core.trust.note(error);
        match error {
            Error::StampConflict(ts) => {
                tracing::error!(%caller, ts, ?tree, "two different ops under one timestamp")
            }
            Error::CounterTooFar { .. } => {
                tracing::debug!(%caller, %error, ?tree, "pushed op ahead of the tree")
            }
            _ => {}
        }
    }

    /// Deletes trees, and every trace of them in the push and pull state:
    /// a tree created again under the same name starts its heights anew.
    async fn drop_trees(&self, cid: ContainerId, tree: Option<String>) -> Result<Response> {
        self.core.membership.check_replica(&cid)?;
        // A whole container's trees are listed under the locks: a pass
        // that ran meanwhile could otherwise create a tree the listing
        // missed, which the drop then takes without stopping the pass.
        let (trees, _no_pass) = match &tree {
            Some(name) => {
                let trees = vec![TreeKey::new(cid, name.clone())];
                let guards = self.core.locks.drop_all(&trees).await;
                (trees, guards)
            }
            None => {
                let guards = self.core.locks.drop_every_tree().await;
                let names = self
                    .core
                    .storage(move |forest| forest.tree_list(&cid))
                    .await?;
                let trees: Vec<TreeKey> = names.into_iter().map(|t| TreeKey::new(cid, t)).collect();
                (trees, guards)
            }
        };
        let forest = self.core.forest.clone();
        let listed = trees.clone();
        let outcome = blocking(&*self.core.env.runtime, move || match tree {
            Some(name) => forest.tree_drop(&cid, Some(&name)),
            None => forest.trees_drop(&listed),
        })
        .await;
        tracing::debug!(?cid, trees = trees.len(), ok = outcome.is_ok(), "drop ran");
        // Forgotten whatever the outcome: a commit that reported a storage
        // error may still have reached the disk, and a pull cursor kept
        // for a tree that is gone would skip the peer's ops below it for
        // good. Forgetting costs at most a re-pull from the durable cursor;
        // the pusher tracks again a tree that a write created meanwhile.
        let dropped: BTreeSet<TreeKey> = trees.into_iter().collect();
        self.pusher.forget(&dropped).await;
        if !canary::active(Canary::DropKeepsPullCursors) {
            self.puller.forget(&dropped);
        }
        outcome?;
        Ok(Response::Done)
    }
}

/// The reads: they run off the async workers (`Service::read`), and need
/// nothing but what every part of the service shares.
impl Core {
    fn get_node_by_path(
        &self,
        tree: &TreeKey,
        attr: &str,
        path: &[String],
        latest_only: bool,
        keep: &dyn Fn(&KeyValue) -> bool,
    ) -> Result<Response> {
        validate::path(attr, path, self.config.limits.input())?;
        self.check_tree_key(tree)?;
        let answer = PathAnswer {
            keep,
            bounds: self.answer_bounds(),
        };
        let nodes = (self.forest).get_by_path_bounded(tree, attr, path, latest_only, answer)?;
        Ok(Response::Nodes(nodes))
    }

    fn get_meta(&self, tree: &TreeKey, node: NodeId) -> Result<Response> {
        self.check_tree_key(tree)?;
        let found = self.forest.get_node(tree, node)?;
        Ok(Response::Nodes(vec![
            found.ok_or(Error::NodeNotFound(node))?
        ]))
    }

    fn get_subtree(&self, tree: &TreeKey, root: NodeId, depth: u32) -> Result<Response> {
        self.check_tree_key(tree)?;
        let bounds = AnswerBounds {
            nodes_max: self.config.limits.max_subtree_nodes,
            ..self.answer_bounds()
        };
        let nodes = (self.forest).get_subtree_bounded(tree, root, depth, bounds)?;
        Ok(Response::Nodes(nodes))
    }

    fn tree_list(&self, cid: &ContainerId) -> Result<Response> {
        self.membership.check_replica(cid)?;
        Ok(Response::Trees(self.forest.tree_list(cid)?))
    }

    fn health(&self) -> Result<Response> {
        Ok(Response::Health {
            replica_id: self.membership.own(),
            log_epoch: self.log_epoch()?,
        })
    }

    fn op_log(&self, tree: &TreeKey, from_height: u64, limit: u32) -> Result<Response> {
        self.check_tree_key(tree)?;
        let limit = (limit as usize).min(self.config.limits.sync_page_size);
        let mut entries = self.forest.get_op_log(tree, from_height, limit)?;
        let budget = self.answer_budget_bytes();
        let mut used = 0;
        let keep = entries
            .iter()
            .take_while(|e| {
                used += e.op.meta.size_bytes() + ITEM_OVERHEAD_BYTES;
                used <= budget
            })
            .count()
            .max(1);
        if keep < entries.len() {
            probe::hit(Probe::OpLogCutByBytes);
        }
        entries.truncate(keep);
        let next_height = entries.last().map_or(from_height, |e| e.height + 1);
        Ok(Response::OpLog {
            entries,
            next_height,
        })
    }

    fn op_log_stamps(&self, tree: &TreeKey, from_height: u64, limit: u32) -> Result<Response> {
        self.check_tree_key(tree)?;
        let fits = self.answer_budget_bytes() / LOG_STAMP_BYTES_MAX;
        let asked = (limit as usize).min(self.config.limits.sync_stamp_page_size);
        if fits < asked {
            probe::hit(Probe::StampsCutByBytes);
        }
        let limit = asked.min(fits).max(1);
        let page = self.forest.get_op_log_stamps(tree, from_height, limit)?;
        Ok(Response::OpLogStamps {
            stamps: page.stamps,
            next_height: page.next_height,
            first_height: page.first_height,
        })
    }

    /// A tree this node holds, with an id that fits a message. A read needs
    /// no existence check of its own: every forest read answers
    /// `TreeNotFound` for a missing tree, inside the one read transaction
    /// it opens anyway.
    fn check_tree_key(&self, tree: &TreeKey) -> Result<()> {
        self.membership.check_replica(&tree.cid)?;
        validate::tree_id(tree)
    }

    /// One page of a listing of `tree`, read by `page` within what one
    /// page may hold: `limit` nodes (0 or beyond it:
    /// `limits.max_list_page_nodes`) that fit in one message.
    fn list_page(
        &self,
        tree: &TreeKey,
        limit: u32,
        page: impl FnOnce(&Forest, AnswerBounds) -> Result<ListPage>,
    ) -> Result<Response> {
        self.check_tree_key(tree)?;
        let max = self.config.limits.max_list_page_nodes;
        let nodes_max = match limit as usize {
            0 => max,
            asked => asked.min(max),
        };
        let bounds = AnswerBounds {
            nodes_max,
            ..self.answer_bounds()
        };
        let ListPage { nodes, next } = page(&self.forest, bounds)?;
        Ok(Response::Page { nodes, next })
    }

    /// What a node read may answer: as many nodes as fit in one message.
    fn answer_bounds(&self) -> AnswerBounds {
        AnswerBounds {
            nodes_max: usize::MAX,
            bytes_max: self.answer_budget_bytes(),
            node_overhead_bytes: ITEM_OVERHEAD_BYTES,
        }
    }
}

fn unexpected(outcome: WriteOutcome) -> Error {
    // The forest answers each op kind with its own outcome kind.
    panic!("forest answered with the wrong outcome kind: {outcome:?}")
}
