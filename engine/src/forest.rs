//! The forest: every tree of a node, stored in one redb database, updated by
//! the undo/do/redo algorithm of the move CRDT (Kleppmann et al., TPDS 2021).
//!
//! SKELETON: the public API below is the contract the service, the simulator,
//! the fuzzers and the load evaluator build on. Bodies are filled in by the
//! engine work (issue 2).

use crate::error::{Error, Result};
use crate::types::*;
use serde::{Deserialize, Serialize};

/// Limits and identity of one forest.
#[derive(Clone, Debug)]
pub struct ForestOptions {
    /// This replica's stable id; the low 16 bits of every local timestamp.
    pub replica_id: ReplicaId,
    /// Largest accepted meta (see `Meta::size_bytes`).
    pub max_meta_bytes: usize,
    /// Largest accepted path (components).
    pub max_path_len: usize,
    /// Durable commits (`Durability::Immediate`); false = operator's `no_sync`.
    pub durable: bool,
}

impl Default for ForestOptions {
    fn default() -> Self {
        Self {
            replica_id: 1,
            max_meta_bytes: 64 * 1024,
            max_path_len: 256,
            durable: true,
        }
    }
}

/// One write of a batch. Local ops get their timestamp inside the batch's
/// write transaction (newer than everything the tree has seen); `Apply`
/// carries a replicated op at its own timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOp {
    /// Local move. `child: None` creates a fresh node whose id is the op's
    /// timestamp. Moving ROOT is an error.
    Move {
        parent: NodeId,
        child: Option<NodeId>,
        items: Vec<KeyValue>,
    },
    /// Walks `path` from ROOT through internal nodes, creating missing ones,
    /// then adds a leaf with `items`. `attr` must be `FileName`.
    AddByPath {
        attr: String,
        path: Vec<String>,
        items: Vec<KeyValue>,
    },
    /// Local remove: a move under TRASH keeping the node's meta. Removing ROOT
    /// is an error.
    Remove { node: NodeId },
    /// A replicated op applied at its own timestamp; idempotent.
    Apply { op: Move },
}

/// A write addressed to one tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRequest {
    pub tree: TreeKey,
    pub op: WriteOp,
}

/// The result of one write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteOutcome {
    /// Move/Remove (and Add, a Move with a fresh child): the node and the
    /// op's timestamp.
    Moved { node: NodeId, ts: Timestamp },
    /// AddByPath: the leaf and the directories it created, parents first.
    AddedByPath {
        leaf: NodeId,
        created: Vec<NodeId>,
        ts: Timestamp,
    },
    /// Apply: `fresh` is false when the op was already in the log.
    Applied { fresh: bool },
}

/// Which per-peer cursor: what we pulled from a peer (sync) or what a peer
/// has acknowledged of our pushes (replication).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CursorKind {
    Pull = 0,
    Push = 1,
}

/// The full observable state of one tree, for convergence checks: nodes
/// sorted by id and the log sorted by timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeDump {
    pub nodes: Vec<NodeInfo>,
    pub log: Vec<Move>,
}

/// The forest of one node.
pub struct Forest {
    _private: (),
}

impl Forest {
    /// Opens (or creates) a forest in a file.
    pub fn open(_path: &std::path::Path, _options: ForestOptions) -> Result<Self> {
        todo!()
    }

    /// Opens (or creates) a forest on any redb storage backend (the
    /// simulator's disk, an in-memory backend).
    pub fn open_with_backend(
        _backend: impl redb::StorageBackend,
        _options: ForestOptions,
    ) -> Result<Self> {
        todo!()
    }

    /// A fresh in-memory forest (tests, fuzzing).
    pub fn in_memory(_options: ForestOptions) -> Result<Self> {
        todo!()
    }

    pub fn options(&self) -> &ForestOptions {
        todo!()
    }

    /// Applies a batch in one write transaction. The outer error means the
    /// transaction failed and nothing of the batch is stored; otherwise each
    /// request has its own result, in request order.
    pub fn write_batch(&self, _requests: &[WriteRequest]) -> Result<Vec<Result<WriteOutcome>>> {
        todo!()
    }

    /// Nodes reached by `path` (see DESIGN §4); empty when nothing matches.
    pub fn get_by_path(
        &self,
        _tree: &TreeKey,
        _attr: &str,
        _path: &[String],
        _latest_only: bool,
    ) -> Result<Vec<NodeInfo>> {
        todo!()
    }

    /// One node, or `None` if the tree has no such node.
    pub fn get_node(&self, _tree: &TreeKey, _node: NodeId) -> Result<Option<NodeInfo>> {
        todo!()
    }

    /// Children ids of a node, ascending.
    pub fn get_children(&self, _tree: &TreeKey, _node: NodeId) -> Result<Vec<NodeId>> {
        todo!()
    }

    /// Depth-first, every parent before its children; depth 0 = unlimited,
    /// 1 = the root alone. At most `limit` nodes (TooLarge beyond).
    pub fn get_subtree(
        &self,
        _tree: &TreeKey,
        _root: NodeId,
        _depth: u32,
        _limit: usize,
    ) -> Result<Vec<NodeInfo>> {
        todo!()
    }

    /// Stored ops from `from_height` on, in this replica's storage order.
    pub fn get_op_log(&self, _tree: &TreeKey, _from_height: u64, _limit: usize) -> Result<Vec<LogEntry>> {
        todo!()
    }

    /// The height the next stored op of this tree will get (= ops stored).
    pub fn next_height(&self, _tree: &TreeKey) -> Result<u64> {
        todo!()
    }

    /// Tree ids of a container, ascending.
    pub fn tree_list(&self, _cid: &ContainerId) -> Result<Vec<String>> {
        todo!()
    }

    /// Every tree of the forest, ascending.
    pub fn all_trees(&self) -> Result<Vec<TreeKey>> {
        todo!()
    }

    pub fn tree_exists(&self, _tree: &TreeKey) -> Result<bool> {
        todo!()
    }

    /// Deletes one tree (`Some`) or every tree of the container (`None`).
    pub fn tree_drop(&self, _cid: &ContainerId, _tree: Option<&str>) -> Result<()> {
        todo!()
    }

    /// A durable per-peer cursor (0 when never set).
    pub fn cursor(&self, _tree: &TreeKey, _kind: CursorKind, _peer: ReplicaId) -> Result<u64> {
        todo!()
    }

    /// Moves a cursor forward; moving it backwards is a programming error.
    pub fn set_cursor(&self, _tree: &TreeKey, _kind: CursorKind, _peer: ReplicaId, _value: u64) -> Result<()> {
        todo!()
    }

    /// Full state of a tree, for checkers.
    pub fn dump(&self, _tree: &TreeKey) -> Result<TreeDump> {
        todo!()
    }

    /// Checks the tree invariant over the whole stored tree: one parent per
    /// node, no cycle, indexes consistent with node state.
    pub fn check_invariants(&self, _tree: &TreeKey) -> Result<(), String> {
        todo!()
    }
}

#[allow(dead_code)]
fn _unused(_: Error) {}
