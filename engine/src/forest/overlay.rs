//! Node states of one tree held in memory while a batch undoes logged ops
//! and redoes them around older replicated ops.
//!
//! Undoing `k` ops and redoing them rewrites the same few node and
//! children rows twice, and most of them end exactly as they started: an
//! op the late one does not interact with is undone and redone to the same
//! state. Every such write costs redb a copy-on-write page and a freed
//! page. The overlay keeps the states in memory during the pass and the
//! writer stores only the nodes whose final state differs from the stored
//! one (`Writer::flush_overlay`).

use super::records::NodeRecord;
use crate::types::NodeId;
use std::collections::BTreeMap;

/// One node touched by the pass: its stored state and its state now.
#[derive(Debug)]
pub(super) struct NodeChange {
    pub stored: Option<NodeRecord>,
    pub current: Option<NodeRecord>,
}

/// The pass's node states, and how many of them hang under each parent
/// now (so that "may this node have children?" stays answerable without
/// the children rows, which are written only at the end).
#[derive(Debug)]
pub(super) struct Overlay {
    /// The tree whose nodes these are.
    pub tree: u64,
    nodes: BTreeMap<NodeId, NodeChange>,
    children_now: BTreeMap<NodeId, u64>,
}

impl Overlay {
    pub fn new(tree: u64) -> Self {
        Self {
            tree,
            nodes: BTreeMap::new(),
            children_now: BTreeMap::new(),
        }
    }

    /// The node's state now, if the pass touched it (`Some(None)`: it
    /// does not exist now).
    pub fn current(&self, id: NodeId) -> Option<Option<&NodeRecord>> {
        self.nodes.get(&id).map(|change| change.current.as_ref())
    }

    /// True when the pass touched `id`.
    pub fn contains(&self, id: NodeId) -> bool {
        self.nodes.contains_key(&id)
    }

    /// Records the first touch of `id`, whose stored state is `stored`.
    pub fn start(&mut self, id: NodeId, stored: Option<NodeRecord>) {
        assert!(!self.contains(id), "node {id} entered the overlay twice");
        if let Some(record) = &stored {
            self.count_child(record.parent, true);
        }
        let current = stored.clone();
        self.nodes.insert(id, NodeChange { stored, current });
    }

    /// Sets the state of a touched node; returns the one it replaces.
    pub fn set(&mut self, id: NodeId, state: Option<NodeRecord>) -> Option<NodeRecord> {
        if let Some(record) = &state {
            self.count_child(record.parent, true);
        }
        let change = self
            .nodes
            .get_mut(&id)
            .unwrap_or_else(|| panic!("node {id} set before it entered the overlay"));
        let old = std::mem::replace(&mut change.current, state);
        if let Some(record) = &old {
            self.count_child(record.parent, false);
        }
        old
    }

    /// True when some touched node hangs under `parent` now.
    pub fn has_children_now(&self, parent: NodeId) -> bool {
        self.children_now.contains_key(&parent)
    }

    /// The touched nodes in id order, for writing back.
    pub fn into_changes(self) -> impl Iterator<Item = (NodeId, NodeChange)> {
        self.nodes.into_iter()
    }

    fn count_child(&mut self, parent: NodeId, added: bool) {
        if added {
            *self.children_now.entry(parent).or_default() += 1;
            return;
        }
        let count = self
            .children_now
            .get_mut(&parent)
            .unwrap_or_else(|| panic!("overlay child count of {parent} went negative"));
        *count -= 1;
        if *count == 0 {
            self.children_now.remove(&parent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(parent: NodeId, time: u64) -> NodeRecord {
        NodeRecord {
            parent,
            time,
            internal: false,
            name_key: vec![0],
        }
    }

    #[test]
    fn child_counts_follow_every_move() {
        let mut overlay = Overlay::new(3);
        overlay.start(5, Some(node(1, 10)));
        overlay.start(6, None);
        assert!(overlay.has_children_now(1));
        assert_eq!(overlay.set(6, Some(node(1, 11))), None);
        assert_eq!(overlay.set(5, Some(node(2, 12))), Some(node(1, 10)));
        assert!(overlay.has_children_now(1) && overlay.has_children_now(2));
        assert_eq!(overlay.set(6, None), Some(node(1, 11)));
        assert!(!overlay.has_children_now(1), "both children of 1 left it");
        assert_eq!(overlay.current(6), Some(None));
        assert_eq!(overlay.current(7), None);
        let changes: Vec<NodeId> = overlay.into_changes().map(|(id, _)| id).collect();
        assert_eq!(changes, vec![5, 6]);
    }
}
