//! Requests: client writes and reads, replicated ops (Apply), the sync
//! reads peers ask of this node, and Drop (docs/design.md §4). Input is
//! checked by `validate` before it reaches the batcher or the forest.

use super::push::ITEM_OVERHEAD_BYTES;
use super::Service;
use crate::error::{Error, Result};
use crate::forest::{WriteOp, WriteOutcome, WriteRequest};
use crate::identity::Caller;
use crate::proto::{Request, Response};
use crate::runtime::blocking;
use crate::types::*;
use crate::validate::{self, too_large};
use std::collections::BTreeSet;

/// Largest encoding of one `LogStamp` (two varint-encoded u64).
const LOG_STAMP_BYTES_MAX: usize = 20;

impl Service {
    /// Answers one request from `caller`, whose identity the transport
    /// established; errors are `Response::Error`.
    pub async fn handle(&self, caller: &Caller, request: Request) -> Response {
        // Authorization is not decided yet: every identity may call everything.
        let _ = caller;
        if self.core.stopped() {
            return Response::Error(Error::ShuttingDown);
        }
        if let Request::Hello {
            cluster_id,
            replica_id,
        } = &request
        {
            return self.hello(caller, cluster_id, *replica_id);
        }
        match self.dispatch(request).await {
            Ok(response) => response,
            Err(error) => {
                self.core.note_error(&error);
                Response::Error(error)
            }
        }
    }

    async fn dispatch(&self, request: Request) -> Result<Response> {
        let limits = self.core.config.limits.input();
        match request {
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
            } => {
                validate::path(&attr, &path, limits)?;
                validate::items(&items, limits)?;
                let op = WriteOp::AddByPath { attr, path, items };
                match self.write(tree, op).await? {
                    WriteOutcome::AddedByPath { leaf, created, .. } => {
                        Ok(Response::AddedByPath { leaf, created })
                    }
                    other => Err(unexpected(other)),
                }
            }
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
                self.write(tree, op).await.map(|_| Response::Done)
            }
            Request::Apply { tree, ops } => self.apply(tree, ops).await,
            Request::Drop { cid, tree } => self.drop_trees(cid, tree).await,
            read => self.read(read),
        }
    }

    fn read(&self, request: Request) -> Result<Response> {
        match request {
            Request::GetNodeByPath {
                tree,
                attr,
                path,
                attributes,
                latest_only,
                all_attributes,
            } => {
                validate::path(&attr, &path, self.core.config.limits.input())?;
                self.check_tree_key(&tree)?;
                let forest = &self.core.forest;
                let mut nodes = forest.get_by_path(&tree, &attr, &path, latest_only)?;
                if !all_attributes {
                    for node in &mut nodes {
                        node.meta.items.retain(|kv| attributes.contains(&kv.key));
                    }
                }
                self.check_answer_size("nodes", &nodes)?;
                Ok(Response::Nodes(nodes))
            }
            Request::GetMeta { tree, node } => {
                self.check_tree_key(&tree)?;
                let found = self.core.forest.get_node(&tree, node)?;
                Ok(Response::Nodes(vec![
                    found.ok_or(Error::NodeNotFound(node))?
                ]))
            }
            Request::GetSubTree { tree, root, depth } => {
                self.check_tree_key(&tree)?;
                let limit = self.core.config.limits.max_subtree_nodes;
                let nodes = self.core.forest.get_subtree(&tree, root, depth, limit)?;
                self.check_answer_size("subtree", &nodes)?;
                Ok(Response::Nodes(nodes))
            }
            sync => self.sync_read(sync),
        }
    }

    /// The reads of sync and the node-level ones.
    fn sync_read(&self, request: Request) -> Result<Response> {
        match request {
            Request::TreeList { cid } => {
                self.core.membership.check_replica(&cid)?;
                Ok(Response::Trees(self.core.forest.tree_list(&cid)?))
            }
            Request::GetOpLog {
                tree,
                from_height,
                limit,
            } => self.op_log(&tree, from_height, limit),
            Request::GetOpLogStamps {
                tree,
                from_height,
                limit,
            } => self.op_log_stamps(&tree, from_height, limit),
            Request::Healthcheck => Ok(Response::Health {
                replica_id: self.core.membership.own(),
            }),
            write => unreachable!("write request {write:?} routed to read"),
        }
    }

    async fn write(&self, tree: TreeKey, op: WriteOp) -> Result<WriteOutcome> {
        self.check_tree_key(&tree)?;
        self.core.batcher.submit(WriteRequest { tree, op }).await
    }

    /// Replicated ops: validated, then applied in one batch. Any failure is
    /// reported so the sender keeps them and retries.
    async fn apply(&self, tree: TreeKey, ops: Vec<Move>) -> Result<Response> {
        self.check_tree_key(&tree)?;
        let page = self.core.config.limits.sync_page_size;
        if ops.len() > page {
            return Err(too_large("apply ops", ops.len(), page));
        }
        let limits = self.core.config.limits.input();
        for op in &ops {
            validate::replicated(op, limits)?;
        }
        let requests = ops
            .into_iter()
            .map(|op| WriteRequest {
                tree: tree.clone(),
                op: WriteOp::Apply { op },
            })
            .collect();
        let mut fresh = 0u32;
        for result in self.core.batcher.submit_all(requests).await? {
            if let WriteOutcome::Applied { fresh: true } = result? {
                fresh += 1;
            }
        }
        Ok(Response::Applied { fresh })
    }

    fn op_log(&self, tree: &TreeKey, from_height: u64, limit: u32) -> Result<Response> {
        self.check_tree_key(tree)?;
        let limit = (limit as usize).min(self.core.config.limits.sync_page_size);
        let mut entries = self.core.forest.get_op_log(tree, from_height, limit)?;
        let budget = self.core.answer_budget_bytes();
        let mut used = 0;
        let keep = entries
            .iter()
            .take_while(|e| {
                used += e.op.meta.size_bytes() + ITEM_OVERHEAD_BYTES;
                used <= budget
            })
            .count()
            .max(1);
        entries.truncate(keep);
        let next_height = entries.last().map_or(from_height, |e| e.height + 1);
        Ok(Response::OpLog {
            entries,
            next_height,
        })
    }

    fn op_log_stamps(&self, tree: &TreeKey, from_height: u64, limit: u32) -> Result<Response> {
        self.check_tree_key(tree)?;
        let fits = self.core.answer_budget_bytes() / LOG_STAMP_BYTES_MAX;
        let limit = (limit as usize)
            .min(self.core.config.limits.sync_stamp_page_size)
            .min(fits)
            .max(1);
        let page = self
            .core
            .forest
            .get_op_log_stamps(tree, from_height, limit)?;
        Ok(Response::OpLogStamps {
            stamps: page.stamps,
            next_height: page.next_height,
        })
    }

    /// Deletes trees, and every trace of them in the push and pull state:
    /// a tree created again under the same name starts its heights anew.
    async fn drop_trees(&self, cid: ContainerId, tree: Option<String>) -> Result<Response> {
        self.core.membership.check_replica(&cid)?;
        let trees: Vec<TreeKey> = match &tree {
            Some(name) => vec![TreeKey::new(cid, name.clone())],
            None => self
                .core
                .forest
                .tree_list(&cid)?
                .into_iter()
                .map(|t| TreeKey::new(cid, t))
                .collect(),
        };
        let _no_pass = self.core.locks.drop_all(&trees).await;
        let forest = self.core.forest.clone();
        blocking(&*self.core.env.runtime, move || {
            forest.tree_drop(&cid, tree.as_deref())
        })
        .await?;
        let dropped: BTreeSet<TreeKey> = trees.into_iter().collect();
        self.pusher.forget(&dropped);
        self.puller.forget(&dropped);
        Ok(Response::Done)
    }

    /// A tree this node holds, with an id that fits a message. A read needs
    /// no existence check of its own: every forest read answers
    /// `TreeNotFound` for a missing tree, inside the one read transaction
    /// it opens anyway.
    fn check_tree_key(&self, tree: &TreeKey) -> Result<()> {
        self.core.membership.check_replica(&tree.cid)?;
        validate::tree_id(tree)
    }

    fn check_answer_size(&self, what: &str, nodes: &[NodeInfo]) -> Result<()> {
        let size: usize = nodes
            .iter()
            .map(|n| n.meta.size_bytes() + ITEM_OVERHEAD_BYTES)
            .sum();
        let budget = self.core.answer_budget_bytes();
        if size > budget {
            return Err(too_large(what, size, budget));
        }
        Ok(())
    }
}

fn unexpected(outcome: WriteOutcome) -> Error {
    // The forest answers each op kind with its own outcome kind.
    panic!("forest answered with the wrong outcome kind: {outcome:?}")
}
