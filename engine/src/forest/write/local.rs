//! Local ops: they take timestamps newer than everything in the tree, and
//! AddByPath resolves its directories through the forest's cache.

use super::super::read;
use super::super::records::*;
use super::super::{WriteOp, WriteOutcome};
use super::Writer;
use crate::error::{Error, Result};
use crate::types::*;

impl Writer<'_, '_> {
    /// Path resolution through the forest's directory cache: the
    /// directories of a workload are few and shared by many calls.
    pub(super) fn resolve_dirs(&mut self, tree: u64, dirs: &[String]) -> Result<(NodeId, usize)> {
        let mut current = ROOT;
        for (i, component) in dirs.iter().enumerate() {
            let name = component_key(component);
            let found = match self.dirs.get(tree, current, &name) {
                Some(found) => found,
                None => {
                    let found =
                        read::find_dir(self.rows(tree), &self.children, tree, current, &name)?;
                    self.dirs.put(tree, current, &name, found);
                    found
                }
            };
            match found {
                Some(next) => {
                    assert!(
                        next != ROOT && next != TRASH,
                        "reserved node {next} as a directory"
                    );
                    current = next;
                }
                None => return Ok((current, i)),
            }
        }
        Ok((current, dirs.len()))
    }

    /// A local op: it takes timestamps newer than everything in the tree.
    /// The outer error fails the batch; the inner one is this request's.
    pub fn apply_local(&mut self, key: &TreeKey, op: &WriteOp) -> Result<Result<WriteOutcome>> {
        let create = !matches!(op, WriteOp::Remove { .. });
        let mut loaded = self.load_tree(key, false)?;
        if loaded.is_none() && create {
            // A tree that does not exist yet holds no live node but ROOT:
            // a Move under any other parent is refused before the tree is
            // made, so a refused write leaves no empty tree behind.
            match op {
                WriteOp::Move { parent, .. } if *parent != ROOT => {
                    return Ok(Err(Error::ParentNotLive(*parent)));
                }
                _ => {}
            }
            loaded = self.load_tree(key, true)?;
        }
        let Some(mut rec) = loaded else {
            return Ok(Err(Error::TreeNotFound));
        };
        let outcome = match op {
            WriteOp::Move {
                parent,
                child,
                items,
            } => match self.check_parent_live(&rec, *parent)? {
                Ok(()) => self.local_move(&mut rec, *parent, *child, items)?,
                Err(refused) => Err(refused),
            },
            WriteOp::AddByPath { path, items, .. } => {
                self.local_add_by_path(&mut rec, path, items)?
            }
            WriteOp::Remove { node } => self.local_remove(&mut rec, *node)?,
            WriteOp::Apply { .. } | WriteOp::Pulled { .. } => {
                unreachable!("replicated ops are applied per tree")
            }
        };
        self.store_tree(key, rec);
        Ok(outcome)
    }

    /// A local Add or Move puts its node under a parent a path from ROOT
    /// reaches: a node under a missing parent or under TRASH would be an
    /// orphan no path finds (docs/design.md §4). Replicated ops are not
    /// checked: the parent may be created or restored by ops on their way.
    fn check_parent_live(&self, rec: &TreeRecord, parent: NodeId) -> Result<Result<()>> {
        if parent == ROOT {
            return Ok(Ok(()));
        }
        match self.is_ancestor_or_self(rec, ROOT, parent)? {
            true => Ok(Ok(())),
            false => Ok(Err(Error::ParentNotLive(parent))),
        }
    }

    /// Reserves `count` consecutive local timestamps, oldest first.
    pub(super) fn reserve_timestamps(
        &self,
        rec: &mut TreeRecord,
        count: u64,
    ) -> Result<Vec<Timestamp>, Error> {
        assert!(count >= 1, "no timestamp reserved");
        if rec.max_counter + count > COUNTER_MAX {
            return Err(Error::InvalidOp("timestamp counter space exhausted".into()));
        }
        let first = rec.max_counter + 1;
        Ok((first..first + count)
            .map(|counter| make_timestamp(counter, self.replica_id))
            .collect())
    }

    pub(super) fn local_move(
        &mut self,
        rec: &mut TreeRecord,
        parent: NodeId,
        child: Option<NodeId>,
        items: &[KeyValue],
    ) -> Result<Result<WriteOutcome>> {
        let ts = match self.reserve_timestamps(rec, 1) {
            Ok(ts) => ts[0],
            Err(e) => return Ok(Err(e)),
        };
        let node = child.unwrap_or(ts);
        self.append(rec, ts, parent, node, items)?;
        assert_eq!(
            rec.max_counter,
            timestamp_counter(ts),
            "a local op is the newest"
        );
        Ok(Ok(WriteOutcome::Moved { node, ts }))
    }

    pub(super) fn local_remove(
        &mut self,
        rec: &mut TreeRecord,
        node: NodeId,
    ) -> Result<Result<WriteOutcome>> {
        // Checked on arrival (`validate::movable`).
        assert!(
            node != ROOT && node != TRASH,
            "reserved node {node} removed"
        );
        let Some(current) = read::node_record(self.rows(rec.number), rec.number, node)? else {
            return Ok(Err(Error::NodeNotFound(node)));
        };
        let items = read::node_items(&self.children, rec.number, node, &current)?;
        self.local_move(rec, TRASH, Some(node), &items)
    }

    pub(super) fn local_add_by_path(
        &mut self,
        rec: &mut TreeRecord,
        path: &[String],
        items: &[KeyValue],
    ) -> Result<Result<WriteOutcome>> {
        let (mut parent, found) = self.resolve_dirs(rec.number, path)?;
        let missing = &path[found..];
        let stamps = match self.reserve_timestamps(rec, missing.len() as u64 + 1) {
            Ok(stamps) => stamps,
            Err(e) => return Ok(Err(e)),
        };
        let mut created = Vec::with_capacity(missing.len());
        for (component, &ts) in missing.iter().zip(&stamps) {
            let dir = [KeyValue::new(ATTR_FILE_NAME, component.as_bytes())];
            let nodes_before = rec.node_count;
            self.append(rec, ts, parent, ts, &dir)?;
            if created.is_empty() && rec.node_count > nodes_before {
                // The lookup just found no such directory and this op made
                // the only one: the next call need not scan for it.
                self.dirs
                    .put(rec.number, parent, &component_key(component), Some(ts));
            }
            created.push(ts);
            parent = ts;
        }
        let leaf = *stamps.last().expect("at least the leaf");
        self.append(rec, leaf, parent, leaf, items)?;
        Ok(Ok(WriteOutcome::AddedByPath {
            leaf,
            created,
            parent,
            ts: leaf,
        }))
    }
}
