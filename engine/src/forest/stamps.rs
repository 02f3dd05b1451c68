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

/// The first height of the height run that holds `height`: the last run
/// starting at or before it (runs are keyed by their first height).
pub(super) fn run_holding(
    rows: &impl ReadableTable<RowKey, &'static [u8]>,
    height: u64,
) -> Result<u64> {
    match rows.range(height_key(0)..=height_key(height))?.next_back() {
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
        let first_height = match rows.range(region_range(RowKind::Height))?.next() {
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
        let start = run_holding(&rows, from_height)?;
        for row in rows.range(height_key(start)..=height_key(u64::MAX))? {
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
        let read = match self.read_tree(tree) {
            Ok(found) => found,
            Err(Error::TreeNotFound) => return Ok(vec![None; stamps.len()]),
            Err(e) => return Err(e),
        };
        held_stamps(&read, stamps)
    }
}

/// How many heights per stamp of a page the walk over the height runs
/// between the heights of its first and last stamps may cover; a page
/// spread wider is settled by lookups alone.
pub const STAMP_WALK_GAP_MAX: usize = 4;

/// [`Forest::held_digests`] on a snapshot of the tree. A sync page's
/// stamps are a stretch of a peer's log, which the local log mostly holds
/// as one stretch of its own heights: the height runs that hold them give
/// each stored timestamp's digest, a run's 248 entries at a time. The runs
/// looked at are those around the heights of the page's first and last
/// stamps, found by one lookup of each in the log; stamps not met there
/// (ops stored in another order) cost a log lookup and a run lookup each.
pub(super) fn held_stamps(read: &TreeRead, stamps: &[Timestamp]) -> Result<Vec<Option<u64>>> {
    let rows = &read.rows;
    let mut held = vec![None; stamps.len()];
    let height_of = |ts: Timestamp| -> Result<Option<u64>> {
        match rows.get(log_key(ts))? {
            Some(guard) => Ok(Some(LogView::parse(guard.value())?.tail.height)),
            None => Ok(None),
        }
    };
    // The heights of the page's stored ends bound a walk over the runs.
    let ends: Vec<u64> = [stamps.first(), stamps.last()]
        .into_iter()
        .flatten()
        .map(|&ts| height_of(ts))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    let mut found = std::collections::HashMap::with_capacity(stamps.len());
    if let (Some(&low), Some(&high)) = (ends.iter().min(), ends.iter().max()) {
        // A page no longer than the walk bound walks the runs between.
        if high - low <= (stamps.len() as u64).saturating_mul(STAMP_WALK_GAP_MAX as u64) {
            let start = run_holding(rows, low)?;
            for row in rows.range(height_key(start)..=height_key(high))? {
                let (_, run) = row?;
                for (ts, digest) in decode_height_run(run.value())? {
                    found.insert(ts, digest);
                }
            }
        }
    }
    for (i, &ts) in stamps.iter().enumerate() {
        if let Some(&digest) = found.get(&ts) {
            held[i] = Some(digest);
            continue;
        }
        let Some(height) = height_of(ts)? else {
            continue;
        };
        let first = run_holding(rows, height)?;
        let guard = rows.get(height_key(first))?;
        let Some(run) = guard else {
            return Err(Error::Malformed(format!("height {height} has no run")));
        };
        let entry = decode_height_run(run.value())?.nth((height - first) as usize);
        match entry {
            Some((stored, digest)) if stored == ts => held[i] = Some(digest),
            _ => {
                return Err(Error::Malformed(format!(
                    "op {ts} at height {height}, which holds another op"
                )))
            }
        }
    }
    Ok(held)
}
