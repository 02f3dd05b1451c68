//! What a sync puller asks before it asks for ops: which timestamps (and
//! op digests) sit at which heights of a peer's log, and which of them the
//! local log holds, with what digest. The first answer comes from the
//! height index alone, the second from one ordered walk of the log, so a
//! round over a log that pushes already delivered sends no op.

use super::records::*;
use super::{Forest, TreeRead};
use crate::error::{Error, Result};
use crate::types::*;
use redb::ReadableTable;

/// A page of the op log's stamps (see [`Forest::get_op_log_stamps`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StampPage {
    pub stamps: Vec<LogStamp>,
    /// The first height not in the page.
    pub next_height: u64,
    /// The log's first height (§6: above 0 for a tree created again after
    /// a drop).
    pub first_height: u64,
}

/// The first height of the height run of tree `t` that holds `height`.
/// Runs are keyed newest first: that run (the newest one starting at or
/// before `height`) is the first key at or after `height`'s own, and the
/// newer runs come before it.
pub(super) fn run_holding(
    rows: &impl ReadableTable<RowKey, &'static [u8]>,
    t: u64,
    height: u64,
) -> Result<u64> {
    match rows.range(height_key(t, height)..=height_key(t, 0))?.next() {
        Some(row) => Ok(height_of_key(row?.0.value())),
        None => Ok(height),
    }
}

impl Forest {
    /// The heights, timestamps and digests of at most `limit` stored ops
    /// from `from_height` on, in storage order, read from the height index
    /// only. An empty page from beyond the log's end says where the log
    /// ends (`next_height` below `from_height`): a puller whose cursor is
    /// there learns that this log was rebuilt on a replaced disk.
    pub fn get_op_log_stamps(
        &self,
        tree: &TreeKey,
        from_height: u64,
        limit: usize,
    ) -> Result<StampPage> {
        let TreeRead { rows, rec, .. } = self.read_tree(tree)?;
        let t = rec.number;
        // Runs are keyed newest first: the oldest run is the last key.
        let first_height = match rows
            .range(height_key(t, u64::MAX)..=height_key(t, 0))?
            .next_back()
        {
            Some(row) => height_of_key(row?.0.value()),
            None => rec.next_height,
        };
        assert!(
            first_height <= rec.next_height,
            "a log starts below its end"
        );
        let mut page = StampPage {
            stamps: Vec::new(),
            next_height: from_height,
            first_height,
        };
        if from_height >= rec.next_height {
            page.next_height = rec.next_height;
            return Ok(page);
        }
        if limit == 0 {
            return Ok(page);
        }
        let start = run_holding(&rows, t, from_height)?;
        for row in rows
            .range(height_key(t, u64::MAX)..=height_key(t, start))?
            .rev()
        {
            let (key, run) = row?;
            let first = height_of_key(key.value());
            let stamps = (first..).zip(decode_height_run(run.value())?);
            for (height, (ts, digest)) in stamps.skip_while(|(height, _)| *height < from_height) {
                if page.stamps.len() >= limit {
                    return Ok(page);
                }
                page.stamps.push(LogStamp { height, ts, digest });
                page.next_height = height + 1;
            }
        }
        Ok(page)
    }

    /// For each timestamp, the digest of the op the tree's log holds under
    /// it, `None` where it holds none. An absent tree holds none.
    pub fn held_digests(&self, tree: &TreeKey, stamps: &[Timestamp]) -> Result<Vec<Option<u64>>> {
        let (txn, number) = match self.read_tree_number(tree) {
            Ok(found) => found,
            Err(Error::TreeNotFound) => return Ok(vec![None; stamps.len()]),
            Err(e) => return Err(e),
        };
        let rows = txn.open_table(ROWS)?;
        held_stamps(&rows, number, stamps)
    }
}

/// How many rows a walk of the log region may step over without settling
/// a stamp before it seeks again. Measured under callgrind, a step of
/// redb's range costs about a fifth of a lookup, so a walk pays off only
/// over short gaps; the bound keeps a page of scattered stamps from
/// walking the log between them. Every create op holds two rows there
/// (node and log), so a dense page settles a stamp every two rows or so.
pub const STAMP_WALK_GAP_MAX: usize = 4;

/// [`Forest::held_digests`] for tree number `t`. A sync page's stamps are
/// a stretch of a peer's log, which the local log mostly holds as one
/// stretch of its own timestamp order: one ordered walk over the log
/// region settles them, where a lookup per stamp would descend the b-tree
/// once each. The walk seeks afresh (one descent, like a lookup) whenever
/// it steps over [`STAMP_WALK_GAP_MAX`] rows without settling a stamp, so
/// no page costs much more than its lookups would.
pub(super) fn held_stamps(
    rows: &impl ReadableTable<RowKey, &'static [u8]>,
    t: u64,
    stamps: &[Timestamp],
) -> Result<Vec<Option<u64>>> {
    let mut held = vec![None; stamps.len()];
    // Positions in timestamp order; equal stamps settle together.
    let mut order: Vec<usize> = (0..stamps.len()).collect();
    order.sort_unstable_by_key(|&i| stamps[i]);
    let ts_at = |k: usize| stamps[order[k]];
    let Some(last) = order.last().map(|&i| stamps[i]) else {
        return Ok(held);
    };
    let mut next = 0;
    'seek: while next < order.len() {
        let mut gap = 0;
        for row in rows.range(log_key(t, ts_at(next))..=log_key(t, last))? {
            let (key, value) = row?;
            let key = key.value();
            let row_ts = key.1;
            while next < order.len() && ts_at(next) < row_ts {
                next += 1;
                gap = 0;
            }
            if next == order.len() {
                break 'seek;
            }
            if ts_at(next) == row_ts && key == log_key(t, row_ts) {
                let digest = op_digest(log_body(value.value())?);
                while next < order.len() && ts_at(next) == row_ts {
                    held[order[next]] = Some(digest);
                    next += 1;
                }
                gap = 0;
                continue;
            }
            gap += 1;
            // A seek lands past this row only for a later timestamp: one
            // to the same timestamp could find this row again.
            if gap > STAMP_WALK_GAP_MAX && ts_at(next) > row_ts {
                continue 'seek;
            }
        }
        // The range ran out: no log row is left for the stamps not settled.
        break;
    }
    Ok(held)
}
