//! Reads of one tree: lookups by path, nodes, subtrees, the op log, and the
//! full dumps and checks the simulator's checkers use. Each opens one read
//! snapshot.

use super::records::*;
use super::{check, read, stamps, Forest, OpLogPage, TreeDump, TreeRead};
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::probe::{self, Probe};
use crate::types::*;
use crate::validate;

impl Forest {
    /// Nodes reached by `path` (see docs/design.md §4); empty when nothing
    /// matches.
    pub fn get_by_path(
        &self,
        tree: &TreeKey,
        attr: &str,
        path: &[String],
        latest_only: bool,
    ) -> Result<Vec<NodeInfo>> {
        let everything = PathAnswer {
            keep: &|_| true,
            bounds: AnswerBounds::UNBOUNDED,
        };
        self.get_by_path_bounded(tree, attr, path, latest_only, everything)
    }

    /// [`Forest::get_by_path`] that keeps only the items `answer.keep`
    /// accepts and stops, with `TooLarge`, as soon as the answer passes
    /// `answer.bounds`: a match's meta is read only when it is its turn to
    /// join the answer, so a refused read costs at most the bound plus one
    /// node, never every version under the path (docs/design.md §4).
    pub fn get_by_path_bounded(
        &self,
        tree: &TreeKey,
        attr: &str,
        path: &[String],
        latest_only: bool,
        answer: PathAnswer,
    ) -> Result<Vec<NodeInfo>> {
        validate::path(attr, path, self.options.input_limits())?;
        let read = self.read_tree(tree)?;
        path_lookup(&read, path, latest_only, answer)
    }

    /// `get_by_path` for many `(path, latest_only)` queries against one
    /// snapshot, for checkers that ask many paths of one state (the
    /// fuzz targets): one read transaction instead of one per query. The
    /// first invalid path fails the whole call.
    pub fn get_by_paths(
        &self,
        tree: &TreeKey,
        attr: &str,
        queries: &[(&[String], bool)],
    ) -> Result<Vec<Vec<NodeInfo>>> {
        for (path, _) in queries {
            validate::path(attr, path, self.options.input_limits())?;
        }
        let read = self.read_tree(tree)?;
        queries
            .iter()
            .map(|&(path, latest_only)| {
                let everything = PathAnswer {
                    keep: &|_| true,
                    bounds: AnswerBounds::UNBOUNDED,
                };
                path_lookup(&read, path, latest_only, everything)
            })
            .collect()
    }

    /// One node, or `None` if the tree has no such node. ROOT and TRASH are
    /// not stored nodes: they give `None`.
    pub fn get_node(&self, tree: &TreeKey, node: NodeId) -> Result<Option<NodeInfo>> {
        let TreeRead {
            rows,
            children,
            rec,
        } = self.read_tree(tree)?;
        read::node_info(&rows, &children, rec.number, node)
    }

    /// `get_node` for many nodes in one read transaction: a checker that
    /// looks up every acknowledged node would otherwise pay for a
    /// transaction per node.
    pub fn get_nodes(&self, tree: &TreeKey, nodes: &[NodeId]) -> Result<Vec<Option<NodeInfo>>> {
        let TreeRead {
            rows,
            children,
            rec,
        } = self.read_tree(tree)?;
        nodes
            .iter()
            .map(|&node| read::node_info(&rows, &children, rec.number, node))
            .collect()
    }

    /// Children ids of a node, ascending.
    pub fn get_children(&self, tree: &TreeKey, node: NodeId) -> Result<Vec<NodeId>> {
        let TreeRead { children, rec, .. } = self.read_tree(tree)?;
        let mut ids: Vec<NodeId> = read::children_of(&children, rec.number, node)?
            .into_iter()
            .map(|c| c.0)
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Depth-first, every parent before its children (children by ascending
    /// id); depth 0 = unlimited, 1 = the root alone. At most `limit` nodes
    /// (TooLarge beyond). ROOT and TRASH are reported with an empty meta
    /// and themselves as parent.
    pub fn get_subtree(
        &self,
        tree: &TreeKey,
        root: NodeId,
        depth: u32,
        limit: usize,
    ) -> Result<Vec<NodeInfo>> {
        let bounds = AnswerBounds {
            nodes_max: limit,
            ..AnswerBounds::UNBOUNDED
        };
        self.get_subtree_bounded(tree, root, depth, bounds)
    }

    /// [`Forest::get_subtree`] that also stops, with `TooLarge`, as soon as
    /// the answer passes `bounds.bytes_max`: a node's meta is read only
    /// when it is its turn to join the answer, so a refused read costs at
    /// most the bound plus one node, never the whole subtree
    /// (docs/design.md §4).
    pub fn get_subtree_bounded(
        &self,
        tree: &TreeKey,
        root: NodeId,
        depth: u32,
        bounds: AnswerBounds,
    ) -> Result<Vec<NodeInfo>> {
        let TreeRead {
            rows,
            children,
            rec,
        } = self.read_tree(tree)?;
        let t = rec.number;
        if !matches!(root, ROOT | TRASH) && read::node_record(&rows, t, root)?.is_none() {
            return Err(Error::NodeNotFound(root));
        }
        let mut out = Vec::new();
        let mut budget = AnswerBudget::new("subtree", bounds);
        // Ids only: a wide level costs 8 bytes a child until its turn.
        let mut stack = vec![(root, 1u32)];
        while let Some((id, level)) = stack.pop() {
            budget.count_node()?;
            let info = match id {
                ROOT | TRASH if id == root => NodeInfo {
                    id,
                    parent: id,
                    meta: Meta::default(),
                },
                _ => read::node_info(&rows, &children, t, id)?
                    .expect("children index points at a stored node"),
            };
            budget.count_meta(&info.meta)?;
            // Planted bug `SubtreeDepthOffByOne`: one level too deep.
            let deeper = u32::from(canary::active(Canary::SubtreeDepthOffByOne));
            if depth == 0 || level < depth + deeper {
                let mut ids: Vec<NodeId> = read::children_of(&children, t, id)?
                    .into_iter()
                    .map(|c| c.0)
                    .collect();
                ids.sort_unstable();
                stack.extend(ids.into_iter().rev().map(|child| (child, level + 1)));
            }
            out.push(info);
        }
        Ok(out)
    }

    /// Stored ops from `from_height` on, in this replica's storage order.
    pub fn get_op_log(
        &self,
        tree: &TreeKey,
        from_height: u64,
        limit: usize,
    ) -> Result<Vec<LogEntry>> {
        Ok(self
            .scan_op_log(tree, from_height, limit, limit, None)?
            .entries)
    }

    /// The stored ops that originated at replica `origin` (the low bits of
    /// their timestamps), from `from_height` on in storage order: at most
    /// `limit` of them, looking at no more than `scan_max` heights. The
    /// origin is read from the height index, so the ops of other replicas
    /// are skipped without a log lookup. `next_height` is where the next
    /// page starts: every height below it was looked at.
    pub fn get_op_log_of_origin(
        &self,
        tree: &TreeKey,
        from_height: u64,
        limit: usize,
        scan_max: usize,
        origin: ReplicaId,
    ) -> Result<OpLogPage> {
        self.scan_op_log(tree, from_height, limit, scan_max, Some(origin))
    }

    fn scan_op_log(
        &self,
        tree: &TreeKey,
        from_height: u64,
        limit: usize,
        scan_max: usize,
        origin: Option<ReplicaId>,
    ) -> Result<OpLogPage> {
        let TreeRead {
            rows,
            children,
            rec,
        } = self.read_tree(tree)?;
        let mut page = OpLogPage {
            entries: Vec::new(),
            next_height: from_height,
        };
        if from_height >= rec.next_height {
            return Ok(page);
        }
        let t = rec.number;
        let start = stamps::run_holding(&rows, from_height)?;
        let mut scanned = 0usize;
        for row in rows.range(height_key(start)..=height_key(u64::MAX))? {
            let (key, stamps) = row?;
            let first = height_of_key(key.value());
            for (height, (ts, _)) in (first..).zip(decode_height_run(stamps.value())?) {
                if height < from_height {
                    continue;
                }
                if page.entries.len() >= limit || scanned >= scan_max {
                    return Ok(page);
                }
                scanned += 1;
                page.next_height = height + 1;
                if origin.is_some_and(|o| timestamp_replica(ts) != o) {
                    continue;
                }
                let record = read::log_op(&rows, &children, t, ts)?;
                assert_eq!(record.tail.height, height, "height index out of sync");
                page.entries.push(LogEntry {
                    height,
                    op: record.into_move(ts),
                });
            }
        }
        Ok(page)
    }

    /// For each op, whether the tree's log already holds exactly that op
    /// (same timestamp, parent, child and meta): a puller need not submit
    /// those. An absent tree holds none.
    pub fn stored_ops(&self, tree: &TreeKey, ops: &[&Move]) -> Result<Vec<bool>> {
        let TreeRead {
            rows,
            children,
            rec,
        } = match self.read_tree(tree) {
            Ok(found) => found,
            Err(Error::TreeNotFound) => return Ok(vec![false; ops.len()]),
            Err(e) => return Err(e),
        };
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            // An op newer than every stored one cannot be stored: no lookup
            // (a pulled page from a peer ahead is mostly such ops).
            if timestamp_counter(op.ts()) > rec.max_counter {
                out.push(false);
                continue;
            }
            let same = match rows.get(log_key(op.ts()))? {
                Some(guard) => {
                    let view = LogView::parse(guard.value())?;
                    if !view.at_node() {
                        view.same_op(op.parent, op.child, &op.meta.items)
                    } else {
                        view.parent == op.parent
                            && view.child == op.child
                            && read::items_at_node(&rows, &children, rec.number, op.ts(), op.child)?
                                == op.meta.items
                    }
                }
                None => false,
            };
            out.push(same);
        }
        Ok(out)
    }

    /// The height the next stored op of this tree will get (= ops stored);
    /// 0 for a tree that does not exist.
    pub fn next_height(&self, tree: &TreeKey) -> Result<u64> {
        match self.read_tree(tree) {
            Ok(read) => Ok(read.rec.next_height),
            Err(Error::TreeNotFound) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// The height of the op stored under `ts`; `None` when the tree holds
    /// no op under it (or does not exist).
    pub fn op_height(&self, tree: &TreeKey, ts: Timestamp) -> Result<Option<u64>> {
        let TreeRead { rows, .. } = match self.read_tree(tree) {
            Ok(read) => read,
            Err(Error::TreeNotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        match rows.get(log_key(ts))? {
            Some(guard) => Ok(Some(LogView::parse(guard.value())?.tail.height)),
            None => Ok(None),
        }
    }

    /// Full state of a tree, for checkers: nodes by id, log by timestamp.
    /// Each node's meta comes from its children row; the log's ops whose
    /// items their node holds (`LogView::at_node`) take them from there.
    pub fn dump(&self, tree: &TreeKey) -> Result<TreeDump> {
        let TreeRead {
            rows,
            children,
            rec,
        } = self.read_tree(tree)?;
        let t = rec.number;
        let mut dump = TreeDump {
            nodes: Vec::new(),
            log: Vec::new(),
        };
        for row in read::rows_of_kind(&rows, t, RowKind::Node)? {
            let (id, value) = row?;
            let node = decode_node(value.value())?;
            dump.nodes.push(NodeInfo {
                id,
                parent: node.parent,
                meta: Meta {
                    time: node.time,
                    items: read::node_items(&children, t, id, &node)?,
                },
            });
        }
        for row in read::rows_of_kind(&rows, t, RowKind::Log)? {
            let (ts, value) = row?;
            let view = LogView::parse(value.value())?;
            let op = match view.at_node() {
                false => view.to_record().into_move(ts),
                true => {
                    let at = dump.nodes.binary_search_by_key(&view.child, |n| n.id);
                    let node = at
                        .ok()
                        .map(|at| &dump.nodes[at])
                        .filter(|n| n.meta.time == ts);
                    let Some(node) = node else {
                        return Err(Error::Malformed(format!(
                            "tree {t}: op {ts} leaves its items to node {}, whose meta is another op's",
                            view.child
                        )));
                    };
                    Move {
                        parent: view.parent,
                        child: view.child,
                        meta: node.meta.clone(),
                    }
                }
            };
            dump.log.push(op);
        }
        Ok(dump)
    }

    /// Checks the tree invariant over the whole stored tree: one parent per
    /// node, no cycle, indexes consistent with node state.
    pub fn check_invariants(&self, tree: &TreeKey) -> Result<(), String> {
        let read = self.read_tree(tree).map_err(|e| e.to_string())?;
        check::check_tree(&read).map_err(|e| e.to_string())?
    }

    /// The checks of `check_invariants` that a write to `touched` nodes can
    /// break, without reading the whole tree (see `check::check_touched`).
    pub fn check_invariants_touched(
        &self,
        tree: &TreeKey,
        touched: &[NodeId],
    ) -> Result<(), String> {
        let read = self.read_tree(tree).map_err(|e| e.to_string())?;
        check::check_touched(&read, touched).map_err(|e| e.to_string())?
    }

    /// Number of logged ops over all trees (bench, tests).
    pub fn log_rows(&self) -> Result<u64> {
        let txn = self.begin_read()?;
        let mut count = 0u64;
        for (_, number) in self.trees_from(&[])? {
            let rows = super::tree_rows_named(&txn, number)?;
            for row in read::rows_of_kind(&rows, number, RowKind::Log)? {
                row?;
                count += 1;
            }
        }
        Ok(count)
    }
}

/// The body of `get_by_path` on an open snapshot (`path` already checked).
fn path_lookup(
    read: &TreeRead,
    path: &[String],
    latest_only: bool,
    answer: PathAnswer,
) -> Result<Vec<NodeInfo>> {
    let (rows, number) = (&read.rows, read.rec.number);
    let (dirs, last) = path.split_at(path.len() - 1);
    let (dir, found) = read::resolve_dirs(rows, &read.children, number, dirs)?;
    if found < dirs.len() {
        return Ok(Vec::new());
    }
    let mut matches = read::children_named(&read.children, number, dir, &component_key(&last[0]))?;
    if latest_only {
        if matches.len() > 1 {
            probe::hit(Probe::LatestAmongSeveral);
        }
        // Newest meta wins; times are unique, the id only breaks
        // impossible ties deterministically.
        matches.sort_by_key(|&(id, time, _)| (std::cmp::Reverse(time), id));
        if canary::active(Canary::LatestPicksOldest) {
            // Planted bug: the oldest version instead of the newest.
            matches.reverse();
        }
        matches.truncate(1);
    }
    let mut budget = AnswerBudget::new("nodes", answer.bounds);
    let mut out = Vec::new();
    let name = component_key(&last[0]);
    for (id, time, _) in matches {
        budget.count_node()?;
        let key = child_key(number, dir, &name, id);
        let guard = read.children.get(key)?;
        let guard = guard.expect("a match read from this snapshot");
        let mut items = child_items(&decode_child(key, guard.value())?)?;
        items.retain(|kv| (answer.keep)(kv));
        let meta = Meta { time, items };
        budget.count_meta(&meta)?;
        out.push(NodeInfo {
            id,
            parent: dir,
            meta,
        });
    }
    Ok(out)
}

/// What one read answer (a subtree, the matches of a path) may hold.
#[derive(Clone, Copy, Debug)]
pub struct AnswerBounds {
    pub nodes_max: usize,
    pub bytes_max: usize,
    /// Counted per node besides its meta (ids, framing).
    pub node_overhead_bytes: usize,
}

impl AnswerBounds {
    pub const UNBOUNDED: Self = Self {
        nodes_max: usize::MAX,
        bytes_max: usize::MAX,
        node_overhead_bytes: 0,
    };
}

/// How a path lookup shapes its answer: which meta items it keeps
/// (the request's attribute filter) and how large the kept answer may be.
pub struct PathAnswer<'a> {
    pub keep: &'a dyn Fn(&KeyValue) -> bool,
    pub bounds: AnswerBounds,
}

/// The running size of one answer while it is built.
struct AnswerBudget {
    what: &'static str,
    bounds: AnswerBounds,
    nodes: usize,
    bytes: usize,
}

impl AnswerBudget {
    fn new(what: &'static str, bounds: AnswerBounds) -> Self {
        Self {
            what,
            bounds,
            nodes: 0,
            bytes: 0,
        }
    }

    /// Called before a node is read: one more node must fit.
    fn count_node(&mut self) -> Result<()> {
        let max = self.bounds.nodes_max;
        if self.nodes == max {
            probe::hit(Probe::AnswerTooLarge);
            return Err(too_large(self.what, max.saturating_add(1), max));
        }
        self.nodes += 1;
        Ok(())
    }

    /// Called once a node's meta is read, before it joins the answer.
    fn count_meta(&mut self, meta: &Meta) -> Result<()> {
        let size = meta.size_bytes() + self.bounds.node_overhead_bytes;
        self.bytes = self.bytes.saturating_add(size);
        let mut max = self.bounds.bytes_max;
        if canary::active(Canary::AnswerBudgetEighth) {
            max /= 8; // Planted bug: an eighth of the budget.
        }
        if self.bytes > max {
            probe::hit(Probe::AnswerTooLarge);
            return Err(too_large(self.what, self.bytes, self.bounds.bytes_max));
        }
        Ok(())
    }
}

fn too_large(what: &str, size: usize, limit: usize) -> Error {
    Error::TooLarge {
        what: what.into(),
        size: size as u64,
        limit: limit as u64,
    }
}
