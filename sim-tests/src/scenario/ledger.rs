//! The ledger: what the clients of a run were acknowledged, which the
//! checkers hold every replica to. The scenario's workload, the `sim` fuzz
//! target and the load evaluator's sim mode all record into one.

use arbor::proto::{Request, Response};
use arbor::{NodeId, ReplicaId, TreeKey, ATTR_FILE_NAME};
use std::collections::{BTreeMap, BTreeSet};

/// The meta key whose unique value tags a move, so the checkers can tell
/// its op from other moves of the same node.
pub const MOVE_TAG_KEY: &str = "op";

/// An acknowledged write: what every replica must eventually hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acked {
    /// A node created by an op whose timestamp is the node id.
    Created {
        tree: TreeKey,
        node: NodeId,
        acker: ReplicaId,
    },
    /// A move tagged with a unique `MOVE_TAG_KEY` meta value.
    Moved {
        tree: TreeKey,
        node: NodeId,
        parent: NodeId,
        tag: String,
        acker: ReplicaId,
    },
    /// A remove: some op of the acker moved `node` under TRASH.
    Removed {
        tree: TreeKey,
        node: NodeId,
        acker: ReplicaId,
    },
}

/// What the clients did, shared between them and the checkers.
#[derive(Clone, Default)]
pub struct Ledger {
    pub acked: Vec<Acked>,
    /// Nodes known to exist per tree (acked creations), move/remove targets.
    pub known: BTreeMap<TreeKey, Vec<NodeId>>,
    /// Full paths of acked leaves made by AddByPath.
    pub leaf_paths: BTreeSet<(TreeKey, Vec<String>)>,
    pub ops_sent: u64,
    pub ops_acked: u64,
    pub ops_failed: u64,
    /// What the intruder's calls got (`scenario::intruder`).
    pub intruder: super::intruder::IntruderRecord,
}

impl Ledger {
    /// Records what `acker`'s answer to a write acknowledged; the nodes the
    /// write touched (nothing for reads and error answers).
    pub fn record(
        &mut self,
        acker: ReplicaId,
        request: &Request,
        response: &Response,
    ) -> Vec<NodeId> {
        match (request, response) {
            (
                Request::AddByPath {
                    tree, path, items, ..
                },
                Response::AddedByPath { leaf, created },
            ) => {
                let touched: Vec<NodeId> = created.iter().copied().chain([*leaf]).collect();
                for &node in &touched {
                    self.created(tree, node, acker);
                }
                if let Some(name) = value_of(items, ATTR_FILE_NAME) {
                    let leaf_path = path.iter().cloned().chain([name]).collect();
                    self.leaf_paths.insert((tree.clone(), leaf_path));
                }
                touched
            }
            (Request::Add { tree, .. }, Response::Added { node }) => {
                self.created(tree, *node, acker);
                vec![*node]
            }
            (
                Request::Move {
                    tree,
                    parent,
                    node,
                    items,
                },
                Response::Done,
            ) => {
                let tag = value_of(items, MOVE_TAG_KEY).expect("every move carries a tag");
                self.acked.push(Acked::Moved {
                    tree: tree.clone(),
                    node: *node,
                    parent: *parent,
                    tag,
                    acker,
                });
                vec![*node]
            }
            (Request::Remove { tree, node }, Response::Done) => {
                self.acked.push(Acked::Removed {
                    tree: tree.clone(),
                    node: *node,
                    acker,
                });
                vec![*node]
            }
            _ => Vec::new(),
        }
    }

    fn created(&mut self, tree: &TreeKey, node: NodeId, acker: ReplicaId) {
        self.acked.push(Acked::Created {
            tree: tree.clone(),
            node,
            acker,
        });
        self.known.entry(tree.clone()).or_default().push(node);
    }
}

/// The value of `key` in a meta, as text.
fn value_of(items: &[arbor::KeyValue], key: &str) -> Option<String> {
    items
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::{ContainerId, KeyValue, ROOT};

    /// An AddByPath acknowledges every node it made and its leaf's path; a
    /// move its tag; an error answer nothing.
    #[test]
    fn answers_are_recorded_as_acknowledged() {
        let tree = TreeKey::new(ContainerId([1; 32]), "t");
        let mut ledger = Ledger::default();
        let add = Request::AddByPath {
            tree: tree.clone(),
            attr: ATTR_FILE_NAME.into(),
            path: vec!["dir".into()],
            items: vec![KeyValue::new(ATTR_FILE_NAME, b"obj".to_vec())],
        };
        let added = Response::AddedByPath {
            leaf: 9,
            created: vec![8],
        };
        assert_eq!(ledger.record(2, &add, &added), vec![8, 9]);
        assert_eq!(ledger.known[&tree], vec![8, 9]);
        assert!(ledger
            .leaf_paths
            .contains(&(tree.clone(), vec!["dir".to_string(), "obj".into()])));
        let moved = Request::Move {
            tree: tree.clone(),
            parent: ROOT,
            node: 9,
            items: vec![KeyValue::new(MOVE_TAG_KEY, b"17".to_vec())],
        };
        assert_eq!(ledger.record(1, &moved, &Response::Done), vec![9]);
        let refused = Response::Error(arbor::Error::TreeNotFound);
        assert_eq!(ledger.record(1, &moved, &refused), Vec::<NodeId>::new());
        let tags: Vec<&str> = ledger
            .acked
            .iter()
            .filter_map(|a| match a {
                Acked::Moved { tag, .. } => Some(tag.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(tags, ["17"]);
        assert_eq!(ledger.acked.len(), 3);
    }
}
