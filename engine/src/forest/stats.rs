//! What the database holds on disk, and what it is: pages in use, per
//! table, and the bytes of each kind of row (benches, operators).

use super::records::*;
use super::Forest;
use crate::error::{Error, Result};
use redb::{ReadableTable, ReadableTableMetadata};

/// The pages of one table and the bytes its rows hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableUse {
    pub name: &'static str,
    pub leaf_pages: u64,
    pub branch_pages: u64,
    /// Key and value bytes of its rows (without page overhead).
    pub stored_bytes: u64,
    /// Unused bytes inside its pages.
    pub fragmented_bytes: u64,
}

/// The rows of one kind over every tree: how many and their key and
/// value bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KindUse {
    pub name: &'static str,
    pub rows: u64,
    pub stored_bytes: u64,
}

/// Storage use of a forest's database (see [`Forest::storage_stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StorageStats {
    pub page_size: u64,
    /// Pages allocated in the file: every table, redb's own metadata and
    /// pages freed by a commit that a later one has yet to release. The
    /// file is larger: redb grows it in steps.
    pub allocated_pages: u64,
    /// The forest's per-tree tables.
    pub tables: Vec<TableUse>,
    /// The rows of each kind, over every tree.
    pub kinds: Vec<KindUse>,
}

impl StorageStats {
    /// Bytes of the pages allocated in the file.
    pub fn used_bytes(&self) -> u64 {
        self.allocated_pages * self.page_size
    }
}

fn table_use(name: &'static str, stats: redb::TableStats) -> TableUse {
    TableUse {
        name,
        leaf_pages: stats.leaf_pages(),
        branch_pages: stats.branch_pages(),
        stored_bytes: stats.stored_bytes(),
        fragmented_bytes: stats.fragmented_bytes(),
    }
}

impl Forest {
    /// The database's pages in use, per table, without the rows of each
    /// kind (`kinds` stays empty). Takes the write lock for the page
    /// count (redb counts allocated pages in a write transaction), so no
    /// batch commits meanwhile.
    pub fn storage_use(&self) -> Result<StorageStats> {
        let (page_size, allocated_pages) = {
            let txn = self.begin_write_as(false)?;
            let stats = txn.stats().map_err(|e| Error::Storage(e.to_string()))?;
            let counted = (stats.page_size() as u64, stats.allocated_pages());
            txn.abort()?;
            counted
        };
        let txn = self.begin_read()?;
        let mut rows = TableUse {
            name: "tree rows",
            ..TableUse::default()
        };
        for (_, number) in self.trees_from(&[])? {
            let one = table_use("", super::tree_rows_named(&txn, number)?.stats()?);
            rows.leaf_pages += one.leaf_pages;
            rows.branch_pages += one.branch_pages;
            rows.stored_bytes += one.stored_bytes;
            rows.fragmented_bytes += one.fragmented_bytes;
        }
        let tables = vec![
            rows,
            table_use("children", txn.open_table(CHILDREN)?.stats()?),
        ];
        Ok(StorageStats {
            page_size,
            allocated_pages,
            tables,
            kinds: Vec::new(),
        })
    }

    /// [`Forest::storage_use`] and the rows of each kind. Counting them
    /// reads every row of every tree: a bench's or an operator's call,
    /// not the service's.
    pub fn storage_stats(&self) -> Result<StorageStats> {
        let mut stats = self.storage_use()?;
        let txn = self.begin_read()?;
        let mut kinds: Vec<KindUse> = [
            "node",
            "log (items held)",
            "log (items at node)",
            "state",
            "height",
        ]
        .into_iter()
        .map(|name| KindUse {
            name,
            ..KindUse::default()
        })
        .collect();
        for (_, number) in self.trees_from(&[])? {
            for row in super::tree_rows_named(&txn, number)?.iter()? {
                let (key, value) = row?;
                let index = match key_kind(key.value()) {
                    Some(RowKind::Node) => 0,
                    Some(RowKind::Log) if LogView::parse(value.value())?.at_node() => 2,
                    Some(RowKind::Log) => 1,
                    Some(RowKind::State) => 3,
                    Some(RowKind::Height) => 4,
                    None => continue,
                };
                kinds[index].rows += 1;
                kinds[index].stored_bytes += (ROW_KEY_BYTES + value.value().len()) as u64;
            }
        }
        let mut index = KindUse {
            name: "children index",
            ..KindUse::default()
        };
        for row in txn.open_table(CHILDREN)?.iter()? {
            let (key, value) = row?;
            index.rows += 1;
            index.stored_bytes += (child_key_len(key.value()) + value.value().len()) as u64;
        }
        kinds.push(index);
        stats.kinds = kinds;
        Ok(stats)
    }
}
