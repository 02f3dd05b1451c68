//! The two paged reads of sync, and the checks every page from a peer
//! passes before anything of it is used.

use crate::error::{Error, Result};
use crate::proto::{Request, Response};
use crate::types::{LogEntry, LogStamp, ReplicaId, TreeKey};

/// An item of a paged sync read: how it is asked for and found in the
/// answer, and its height in the peer's log.
pub(super) trait SyncPage: Sized {
    /// The request's name, for errors.
    const REQUEST: &'static str;
    fn request(tree: TreeKey, from_height: u64, limit: u32) -> Request;
    /// The page of a matching answer, the log's first height it names
    /// and its `next_height`; any other answer is given back. A tree
    /// created again after a drop numbers its log from the height its
    /// dropped incarnation reached, and a stamp page asked from below that
    /// starts at the log's first height, which the answer says
    /// (docs/design.md §6). The op pages of a pull are asked only for
    /// heights a stamp page listed, so they count as starting at 0.
    fn from_answer(answer: Response) -> std::result::Result<(Vec<Self>, u64, u64), Response>;
    fn height(&self) -> u64;
}

impl SyncPage for LogStamp {
    const REQUEST: &'static str = "GetOpLogStamps";

    fn request(tree: TreeKey, from_height: u64, limit: u32) -> Request {
        Request::GetOpLogStamps {
            tree,
            from_height,
            limit,
        }
    }

    fn from_answer(answer: Response) -> std::result::Result<(Vec<Self>, u64, u64), Response> {
        match answer {
            Response::OpLogStamps {
                stamps,
                first_height,
                next_height,
            } => Ok((stamps, first_height, next_height)),
            other => Err(other),
        }
    }

    fn height(&self) -> u64 {
        self.height
    }
}

impl SyncPage for LogEntry {
    const REQUEST: &'static str = "GetOpLog";

    fn request(tree: TreeKey, from_height: u64, limit: u32) -> Request {
        Request::GetOpLog {
            tree,
            from_height,
            limit,
        }
    }

    fn from_answer(answer: Response) -> std::result::Result<(Vec<Self>, u64, u64), Response> {
        match answer {
            Response::OpLog {
                entries,
                next_height,
            } => Ok((entries, 0, next_height)),
            other => Err(other),
        }
    }

    fn height(&self) -> u64 {
        self.height
    }
}

pub(super) fn unexpected_answer(peer: ReplicaId, request: &str, answer: &Response) -> Error {
    Error::Malformed(format!("peer {peer} answered {request} with {answer:?}"))
}

/// A peer's page is input like any other: no more than asked for, and the
/// heights `start, start + 1, ..` without a gap, where `start` is
/// `from_height` or the log's first height (`first_height`) if that is
/// higher. A peer stores an op at every height from its log's first height
/// below its next one, so a page that skips a height would move the cursor
/// over an op never seen here.
pub(super) fn check_page(
    peer: ReplicaId,
    from_height: u64,
    first_height: u64,
    heights: impl ExactSizeIterator<Item = u64>,
    limit: usize,
) -> Result<()> {
    if heights.len() > limit {
        return Err(Error::Malformed(format!(
            "peer {peer} sent an oversized page"
        )));
    }
    let start = from_height.max(first_height);
    for (expected, height) in (start..).zip(heights) {
        if height != expected {
            return Err(Error::Malformed(format!(
                "peer {peer} sent height {height} where {expected} belongs"
            )));
        }
    }
    Ok(())
}

/// Runs `(first, last)` of ascending `missing` heights; a run also covers
/// gaps of at most `gap_max` heights between two missing ones.
pub(super) fn missing_runs(missing: &[u64], gap_max: u64) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &height in missing {
        match runs.last_mut() {
            Some((_, last)) if height - *last <= gap_max + 1 => *last = height,
            _ => runs.push((height, height)),
        }
    }
    assert!(
        runs.windows(2).all(|w| w[0].1 + gap_max + 1 < w[1].0),
        "runs apart"
    );
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_runs_bridge_small_gaps_only() {
        assert_eq!(missing_runs(&[], 2), vec![]);
        assert_eq!(missing_runs(&[5], 2), vec![(5, 5)]);
        // 5 -> 8 skips two held heights (bridged), 8 -> 12 skips three.
        assert_eq!(
            missing_runs(&[5, 8, 12, 13, 100], 2),
            vec![(5, 8), (12, 13), (100, 100)]
        );
        assert_eq!(missing_runs(&[0, 1, 2], 0), vec![(0, 2)]);
    }

    #[test]
    fn peer_pages_are_checked() {
        assert!(check_page(2, 10, 0, [10, 11, 12].into_iter(), 3).is_ok());
        assert!(check_page(2, 10, 0, std::iter::empty(), 0).is_ok());
        let malformed = |r: Result<()>| matches!(r, Err(Error::Malformed(_)));
        assert!(malformed(check_page(2, 10, 0, [10, 11].into_iter(), 1)));
        assert!(malformed(check_page(2, 10, 0, [9].into_iter(), 5)));
        assert!(malformed(check_page(2, 10, 0, [12, 12].into_iter(), 5)));
        assert!(malformed(check_page(2, 10, 0, [13, 11].into_iter(), 5)));
        // A gap, at the start or inside: heights the peer holds were skipped.
        assert!(malformed(check_page(2, 10, 0, [11, 12].into_iter(), 5)));
        assert!(malformed(check_page(2, 10, 0, [10, 11, 15].into_iter(), 5)));
        // A log that starts above the height asked for (a tree created
        // again after a drop): the page starts at its first height, not
        // below, not above, and has no gap after it.
        assert!(check_page(2, 10, 14, [14, 15].into_iter(), 5).is_ok());
        assert!(check_page(2, 20, 14, [20].into_iter(), 5).is_ok());
        assert!(malformed(check_page(2, 10, 14, [15, 16].into_iter(), 5)));
        assert!(malformed(check_page(2, 10, 14, [10, 11].into_iter(), 5)));
        assert!(malformed(check_page(2, 10, 14, [14, 16].into_iter(), 5)));
    }
}
