//! The forest's trees as a whole: listing, dropping, per-peer cursors, and
//! emptying the forest.

use super::records::*;
use super::{open_all_tables, tree_number, CursorKind, Forest};
use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use crate::types::*;
use redb::ReadableTable;

impl Forest {
    /// Tree ids of a container, ascending.
    pub fn tree_list(&self, cid: &ContainerId) -> Result<Vec<String>> {
        Ok(self
            .trees_from(&cid.0)?
            .into_iter()
            .take_while(|(key, _)| key.cid == *cid)
            .map(|(key, _)| key.tree)
            .collect())
    }

    /// Every tree of the forest, ascending.
    pub fn all_trees(&self) -> Result<Vec<TreeKey>> {
        Ok(self.trees_from(&[])?.into_iter().map(|t| t.0).collect())
    }

    /// At most `limit` trees after `after` (from the first with `None`),
    /// ascending: a walk over every tree in bounded steps.
    pub fn trees_after(&self, after: Option<&TreeKey>, limit: usize) -> Result<Vec<TreeKey>> {
        let txn = self.begin_read()?;
        let trees = txn.open_table(TREES)?;
        let from = after.map(tree_key_bytes).unwrap_or_default();
        let mut out = Vec::with_capacity(limit.min(1024));
        for row in trees.range(from.as_slice()..)? {
            if out.len() == limit {
                break;
            }
            let key = decode_tree_key(row?.0.value())?;
            if Some(&key) != after {
                out.push(key);
            }
        }
        Ok(out)
    }

    /// Every tree whose key is at least `from`, ascending, with its number.
    pub(super) fn trees_from(&self, from: &[u8]) -> Result<Vec<(TreeKey, u64)>> {
        let txn = self.begin_read()?;
        let trees = txn.open_table(TREES)?;
        let mut out = Vec::new();
        for row in trees.range(from..)? {
            let (key, value) = row?;
            out.push((decode_tree_key(key.value())?, value.value()));
        }
        Ok(out)
    }

    /// The tree's number, `None` when it does not exist: a tree created
    /// again after a drop has another one (numbers are never reused while
    /// the forest lives), so it tells incarnations apart.
    pub fn tree_incarnation(&self, tree: &TreeKey) -> Result<Option<u64>> {
        match self.read_tree_number(tree) {
            Ok((_, number)) => Ok(Some(number)),
            Err(Error::TreeNotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every tree key ever dropped here, with the next height its
    /// dropped incarnations reached (see [`DROPPED`]), ascending.
    pub fn dropped_heights(&self) -> Result<Vec<(TreeKey, u64)>> {
        let txn = self.begin_read()?;
        let dropped = txn.open_table(DROPPED)?;
        let mut out = Vec::new();
        for row in dropped.iter()? {
            let (key, marks) = row?;
            out.push((decode_tree_key(key.value())?, marks.value().1));
        }
        Ok(out)
    }

    pub fn tree_exists(&self, tree: &TreeKey) -> Result<bool> {
        match self.read_tree_number(tree) {
            Ok(_) => Ok(true),
            Err(Error::TreeNotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes one tree (`Some`; TreeNotFound if absent) or every tree of
    /// the container (`None`), with all their rows.
    pub fn tree_drop(&self, cid: &ContainerId, tree: Option<&str>) -> Result<()> {
        let victims: Vec<(TreeKey, u64)> = match tree {
            Some(name) => {
                let key = TreeKey::new(*cid, name);
                let (_, number) = self.read_tree_number(&key)?;
                vec![(key, number)]
            }
            None => self
                .trees_from(&cid.0)?
                .into_iter()
                .take_while(|(key, _)| key.cid == *cid)
                .collect(),
        };
        self.drop_victims(&victims)
    }

    /// Drops exactly `trees` of one container, those of them it holds (the
    /// Drop of a whole container lists them first, under locks that keep
    /// passes from creating others; a client's write may still create one
    /// meanwhile, which the drop then leaves alone).
    pub fn trees_drop(&self, trees: &[TreeKey]) -> Result<()> {
        let mut victims = Vec::with_capacity(trees.len());
        for key in trees {
            match self.read_tree_number(key) {
                Ok((_, number)) => victims.push((key.clone(), number)),
                Err(Error::TreeNotFound) => {}
                Err(e) => return Err(e),
            }
        }
        self.drop_victims(&victims)
    }

    fn drop_victims(&self, victims: &[(TreeKey, u64)]) -> Result<()> {
        if victims.is_empty() {
            return Ok(());
        }
        // Tree numbers are never reused, so the dropped trees' lookups
        // could not be hit again; emptying the cache keeps it small.
        let mut dirs = self.lock_dir_cache();
        if !canary::active(Canary::DropKeepsDirCache) {
            dirs.clear();
        }
        let txn = self.begin_write()?;
        for (key, number) in victims {
            remember_marks(&txn, key, *number)?;
            delete_tree_rows(&txn, key, *number)?;
        }
        txn.commit()?;
        Ok(())
    }

    /// A durable per-peer cursor (0 when never set or the tree is absent).
    pub fn cursor(&self, tree: &TreeKey, kind: CursorKind, peer: ReplicaId) -> Result<u64> {
        let (txn, number) = match self.read_tree_number(tree) {
            Ok(found) => found,
            Err(Error::TreeNotFound) => return Ok(0),
            Err(e) => return Err(e),
        };
        let cursors = txn.open_table(CURSORS)?;
        Ok(cursors
            .get((number, kind as u8, peer))?
            .map_or(0, |g| g.value()))
    }

    /// Writes many cursors in one durable commit, each only where it is
    /// ahead of the stored copy (a pass still running may have written a
    /// newer one); cursors of trees that no longer exist are skipped.
    /// Returns how many moved. Used when a node stops.
    pub fn raise_cursors(
        &self,
        cursors: &[(TreeKey, CursorKind, ReplicaId, u64)],
    ) -> Result<usize> {
        let txn = self.begin_write()?;
        let mut moved = 0;
        {
            let trees = txn.open_table(TREES)?;
            let mut table = txn.open_table(CURSORS)?;
            for (tree, kind, peer, value) in cursors {
                let number = match tree_number(&trees, tree) {
                    Err(Error::TreeNotFound) => continue,
                    other => other?,
                };
                let key = (number, *kind as u8, *peer);
                let current = table.get(key)?.map_or(0, |g| g.value());
                if *value > current {
                    table.insert(key, *value)?;
                    moved += 1;
                }
            }
        }
        if moved > 0 {
            txn.commit()?;
        } else {
            txn.abort()?;
        }
        Ok(moved)
    }

    /// Deletes one cursor (it reads 0 again): a pull cursor of a peer whose
    /// log was rebuilt on a replaced disk, where the old heights mean
    /// nothing (docs/design.md §6). Nothing to do when the tree is absent.
    pub fn reset_cursor(&self, tree: &TreeKey, kind: CursorKind, peer: ReplicaId) -> Result<()> {
        let txn = self.begin_write()?;
        let number = match tree_number(&txn.open_table(TREES)?, tree) {
            Err(Error::TreeNotFound) => None,
            other => Some(other?),
        };
        let Some(number) = number else {
            txn.abort()?;
            return Ok(());
        };
        txn.open_table(CURSORS)?
            .remove((number, kind as u8, peer))?;
        txn.commit()?;
        Ok(())
    }

    /// Moves a cursor forward; moving it backwards is a programming error.
    /// TreeNotFound when the tree does not exist.
    pub fn set_cursor(
        &self,
        tree: &TreeKey,
        kind: CursorKind,
        peer: ReplicaId,
        value: u64,
    ) -> Result<()> {
        let txn = self.begin_write()?;
        let moved = {
            let number = tree_number(&txn.open_table(TREES)?, tree)?;
            let mut cursors = txn.open_table(CURSORS)?;
            let key = (number, kind as u8, peer);
            let current = cursors.get(key)?.map_or(0, |g| g.value());
            assert!(
                value >= current,
                "cursor {kind:?}/{peer} moved back from {current} to {value}"
            );
            if value > current {
                cursors.insert(key, value)?;
            }
            value > current
        };
        // A cursor already at `value` is durable as it is: a commit would
        // cost a flush and change nothing.
        if moved {
            txn.commit()?;
        } else {
            txn.abort()?;
        }
        Ok(())
    }

    /// Empties every table, tree numbering included, so the forest behaves
    /// exactly like a freshly created one; one durable commit. For harnesses
    /// that run many short cases on one database (fuzzing), where opening
    /// and closing redb per case costs more than the case.
    pub fn clear(&self) -> Result<()> {
        self.clear_with(true)
    }

    /// `clear` in a commit without durability, for harnesses whose forests
    /// commit without it anyway (`ForestOptions::durable` false): redb
    /// frees the pages of non-durable commits at once, so this skips the
    /// flush of `clear` and nothing grows; a later `clear` makes it all
    /// durable.
    pub fn clear_without_sync(&self) -> Result<()> {
        self.clear_with(false)
    }

    fn clear_with(&self, durable: bool) -> Result<()> {
        // Tree numbers start over, so a cached lookup would name a node of
        // a deleted tree. Taken before `db`, in the order `write_batch` does.
        let mut dirs = self.lock_dir_cache();
        dirs.clear();
        let mut txn = self.begin_write()?;
        txn.set_durable(durable)?;
        let tree_tables: Vec<String> = txn
            .list_tables()
            .map_err(|e| Error::Storage(e.to_string()))?
            .map(|handle| redb::TableHandle::name(&handle).to_string())
            .filter(|name| name.starts_with(TREE_TABLE_PREFIX))
            .collect();
        for name in &tree_tables {
            txn.delete_table(tree_table(name))?;
        }
        txn.delete_table(TREES)?;
        txn.delete_table(META)?;
        txn.delete_table(CHILDREN)?;
        txn.delete_table(CURSORS)?;
        txn.delete_table(DROPPED)?;
        // Recreated at once: reads never meet a missing table.
        open_all_tables(&txn)?;
        let committed = txn.commit();
        // Tree numbers start over (also after a commit that failed half
        // way). Still under the directory lock.
        self.tree_numbers.new_epoch();
        committed
    }
}

/// Keeps the counter and height a dropped tree reached (see [`DROPPED`]),
/// never lowering what an earlier incarnation left.
fn remember_marks(txn: &redb::WriteTransaction, key: &TreeKey, t: u64) -> Result<()> {
    let rec = super::read::tree_state(&txn.open_table(tree_table(&tree_table_name(t)))?, t)?;
    let mut dropped = txn.open_table(DROPPED)?;
    let key = tree_key_bytes(key);
    let (counter, height) = dropped.get(key.as_slice())?.map_or((0, 0), |g| g.value());
    assert!(
        rec.max_counter >= counter && rec.next_height >= height,
        "a tree went below the marks of its dropped incarnation"
    );
    dropped.insert(key.as_slice(), (rec.max_counter, rec.next_height))?;
    Ok(())
}

fn delete_tree_rows(txn: &redb::WriteTransaction, key: &TreeKey, t: u64) -> Result<()> {
    txn.delete_table(tree_table(&tree_table_name(t)))?;
    txn.open_table(CHILDREN)?
        .retain_in(tree_children(t), |_, _| false)?;
    txn.open_table(CURSORS)?
        .retain_in((t, 0, 0)..=(t, u8::MAX, u16::MAX), |_, _| false)?;
    txn.open_table(TREES)?
        .remove(tree_key_bytes(key).as_slice())?;
    Ok(())
}
