//! The reference model: the move CRDT of Kleppmann et al. written as plainly
//! as possible, in memory, for one tree. Every op is applied with a full
//! undo/do/redo over a `BTreeMap` log, with no shortcut of any kind, so that
//! the stored forest can be checked against it (tests, fuzz targets).

use crate::forest::records::name_key;
use crate::forest::{ListOrder, TreeDump};
use crate::types::*;
use std::collections::{BTreeMap, BTreeSet};

/// The state a node had before an op: `None` when the op created it.
type Previous = Option<(NodeId, Meta)>;

/// One logged op and what it overwrote (`None` also when it was a no-op,
/// told apart by `effective`).
#[derive(Clone, Debug)]
struct Entry {
    op: Move,
    effective: bool,
    previous: Previous,
}

/// One tree of the paper's model.
#[derive(Clone, Debug, Default)]
pub struct TreeModel {
    log: BTreeMap<Timestamp, Entry>,
    nodes: BTreeMap<NodeId, (NodeId, Meta)>,
}

impl TreeModel {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies an op at its timestamp. Returns false when the log already
    /// holds an op with that timestamp (nothing changes).
    pub fn apply(&mut self, op: &Move) -> bool {
        let ts = op.ts();
        if self.log.contains_key(&ts) {
            return false;
        }
        let newer: Vec<Timestamp> = self.log.range(ts..).map(|(t, _)| *t).collect();
        for t in newer.iter().rev() {
            self.undo(*t);
        }
        let entry = self.do_op(op.clone());
        self.log.insert(ts, entry);
        for t in newer {
            let op = self.log[&t].op.clone();
            let entry = self.do_op(op);
            self.log.insert(t, entry);
        }
        true
    }

    fn undo(&mut self, ts: Timestamp) {
        let entry = &self.log[&ts];
        if !entry.effective {
            return;
        }
        match entry.previous.clone() {
            None => {
                self.nodes.remove(&entry.op.child);
            }
            Some(state) => {
                self.nodes.insert(entry.op.child, state);
            }
        }
    }

    fn do_op(&mut self, op: Move) -> Entry {
        if self.is_ancestor_or_self(op.child, op.parent) {
            return Entry {
                op,
                effective: false,
                previous: None,
            };
        }
        let previous = self.nodes.get(&op.child).cloned();
        self.nodes.insert(op.child, (op.parent, op.meta.clone()));
        Entry {
            op,
            effective: true,
            previous,
        }
    }

    /// True when `ancestor` is `node` or above it.
    pub fn is_ancestor_or_self(&self, ancestor: NodeId, node: NodeId) -> bool {
        let mut current = node;
        let mut steps = 0;
        loop {
            if current == ancestor {
                return true;
            }
            match self.nodes.get(&current) {
                Some((parent, _)) => current = *parent,
                None => return false,
            }
            steps += 1;
            assert!(steps <= self.nodes.len(), "model: cycle above {node}");
        }
    }

    pub fn node(&self, id: NodeId) -> Option<NodeInfo> {
        self.nodes.get(&id).map(|(parent, meta)| NodeInfo {
            id,
            parent: *parent,
            meta: meta.clone(),
        })
    }

    /// Children of `parent`, ascending.
    pub fn children(&self, parent: NodeId) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, (p, _))| *p == parent)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Children of `parent` with their metas, in `order`: by id, or by
    /// name key (`records::name_key`) then id.
    pub fn children_in(&self, parent: NodeId, order: ListOrder) -> Vec<NodeInfo> {
        let mut children: Vec<NodeInfo> = self
            .children(parent)
            .into_iter()
            .filter_map(|id| self.node(id))
            .collect();
        if order == ListOrder::Name {
            children.sort_by_cached_key(|n| (name_key(&n.meta.items), n.id));
        }
        children
    }

    /// The subtree under `root` in pre-order (a node, then the subtrees
    /// of its children in `order`), `depth` levels deep (0 = all, 1 = the
    /// root alone); ROOT and TRASH come with an empty meta and themselves
    /// as parent. `None` when `root` is no node.
    pub fn subtree(&self, root: NodeId, depth: u32, order: ListOrder) -> Option<Vec<NodeInfo>> {
        let top = match root {
            ROOT | TRASH => NodeInfo {
                id: root,
                parent: root,
                meta: Meta::default(),
            },
            _ => self.node(root)?,
        };
        let mut out = Vec::new();
        let mut stack = vec![(top, 1u32)];
        while let Some((node, level)) = stack.pop() {
            if depth == 0 || level < depth {
                let children = self.children_in(node.id, order);
                stack.extend(children.into_iter().rev().map(|c| (c, level + 1)));
            }
            out.push(node);
        }
        Some(out)
    }

    /// The logged op with this timestamp.
    pub fn op_at(&self, ts: Timestamp) -> Option<&Move> {
        self.log.get(&ts).map(|e| &e.op)
    }

    /// Whether the logged op at `ts` moved its node (false: it would have
    /// made a cycle); `None` when no op has that timestamp.
    pub fn effective(&self, ts: Timestamp) -> Option<bool> {
        self.log.get(&ts).map(|e| e.effective)
    }

    /// The largest Lamport counter in the log.
    pub fn max_counter(&self) -> u64 {
        self.log
            .keys()
            .next_back()
            .map_or(0, |ts| timestamp_counter(*ts))
    }

    /// The directory `component` under `parent`: an internal child with
    /// that name, the smallest id among duplicates.
    pub fn find_dir(&self, parent: NodeId, component: &str) -> Option<NodeId> {
        self.children(parent).into_iter().find(|id| {
            let meta = &self.nodes[id].1;
            meta.is_internal() && meta.file_name() == Some(component.as_bytes())
        })
    }

    /// The ops a local AddByPath issues on `replica`: the missing
    /// directories (parents first), then the leaf, on consecutive counters
    /// after the largest one in the log.
    pub fn add_by_path_ops(
        &self,
        dirs: &[String],
        items: &[KeyValue],
        replica: ReplicaId,
    ) -> Vec<Move> {
        let mut parent = ROOT;
        let mut found = 0;
        for component in dirs {
            match self.find_dir(parent, component) {
                Some(dir) => parent = dir,
                None => break,
            }
            found += 1;
        }
        let mut counter = self.max_counter();
        let mut ops = Vec::new();
        let mut make = |parent: NodeId, items: Vec<KeyValue>| {
            counter += 1;
            let ts = make_timestamp(counter, replica);
            ops.push(Move {
                parent,
                child: ts,
                meta: Meta { time: ts, items },
            });
            ts
        };
        for component in &dirs[found..] {
            parent = make(
                parent,
                vec![KeyValue::new(ATTR_FILE_NAME, component.as_bytes())],
            );
        }
        make(parent, items.to_vec());
        ops
    }

    /// Path lookup with the forest's rules: directories are internal
    /// children with that name, the smallest id among duplicates; the last
    /// component matches any child with that name.
    pub fn get_by_path(&self, path: &[String], latest_only: bool) -> Vec<NodeInfo> {
        let Some((last, dirs)) = path.split_last() else {
            return Vec::new();
        };
        let mut current = ROOT;
        for component in dirs {
            match self.find_dir(current, component) {
                Some(id) => current = id,
                None => return Vec::new(),
            }
        }
        let mut found: Vec<NodeInfo> = self
            .children(current)
            .into_iter()
            .filter(|id| self.nodes[id].1.file_name() == Some(last.as_bytes()))
            .filter_map(|id| self.node(id))
            .collect();
        if latest_only {
            found.sort_by_key(|n| (std::cmp::Reverse(n.meta.time), n.id));
            found.truncate(1);
        }
        found
    }

    /// Nodes by id and the log by timestamp, as `Forest::dump` gives them.
    pub fn dump(&self) -> TreeDump {
        TreeDump {
            nodes: self.nodes.keys().filter_map(|id| self.node(*id)).collect(),
            log: self.log.values().map(|e| e.op.clone()).collect(),
        }
    }

    /// The tree invariant: no reserved id is a node and every node reaches
    /// ROOT, TRASH or an absent parent without a cycle.
    pub fn check_invariant(&self) -> Result<(), String> {
        for &id in self.nodes.keys() {
            if id == ROOT || id == TRASH {
                return Err(format!("reserved id {id} is a node"));
            }
            let mut seen = BTreeSet::new();
            let mut current = id;
            while let Some((parent, _)) = self.nodes.get(&current) {
                if !seen.insert(current) {
                    return Err(format!("cycle through {current}"));
                }
                current = *parent;
            }
        }
        Ok(())
    }
}
