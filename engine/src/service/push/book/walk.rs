//! The walk over stored trees that finds trees with ops still to push
//! when the book could not track them all (`limits.max_tracked_trees`).

use super::*;

impl PushBook {
    /// Where the walk goes on, and how many trees it may take now; `None`
    /// when no walk is under way or the book is full.
    pub fn walk_position(&self) -> Option<(Option<TreeKey>, usize)> {
        let book = self.lock();
        let room = self.limits.trees_max.saturating_sub(book.unsettled());
        match &book.walk {
            Walk::Walking { after, .. } if room > 0 => Some((after.clone(), room)),
            _ => None,
        }
    }

    /// Tracks and queues the untracked trees of `found`, the forest's
    /// trees after the walk's position; `complete`: the forest has none
    /// after them. Stops where the book is full.
    pub fn walk_found(&self, from: Option<&TreeKey>, found: &[TreeKey], complete: bool) {
        let mut book = self.lock();
        match &book.walk {
            Walk::Walking { after, .. } if after.as_ref() == from => {}
            // Restarted or ended meanwhile: this stretch is stale.
            _ => return,
        }
        for (i, tree) in found.iter().enumerate() {
            assert!(i == 0 || found[i - 1] < *tree, "trees listed out of order");
            if self.track_queued(&mut book, tree).is_none() {
                let before = found[..i].last().cloned().or(from.cloned());
                set_walk_after(&mut book.walk, before);
                return;
            }
        }
        match (&book.walk, complete) {
            (Walk::Walking { again: true, .. }, true) => {
                book.walk = Walk::Walking {
                    after: None,
                    again: false,
                }
            }
            (_, true) => book.walk = Walk::Done,
            (_, false) => set_walk_after(&mut book.walk, found.last().cloned()),
        }
    }

    /// Tracks `tree` and queues all its pairs when this node pushes it and
    /// the book lacks it; returns the pairs queued, `None` when the book
    /// is full of trees with work.
    fn track_queued(&self, book: &mut Book, tree: &TreeKey) -> Option<usize> {
        if !self.pushes(tree) || book.trees.contains_key(tree) {
            return Some(0);
        }
        let tracked = self.track(book, tree)?;
        let peers: Vec<ReplicaId> = tracked.pairs.iter().map(|p| p.peer).collect();
        for peer in &peers {
            queue(book, (tree.clone(), *peer));
        }
        Some(peers.len())
    }

    /// Tracks again, after `forget`, those of `trees` that the forest still
    /// holds, each pair queued (its cursor is read afresh); a tree the
    /// book has no room for is left to a new walk. Returns the pairs
    /// queued.
    pub fn track_again(&self, trees: &[TreeKey]) -> usize {
        let mut book = self.lock();
        let mut queued = 0;
        for tree in trees {
            match self.track_queued(&mut book, tree) {
                Some(count) => queued += count,
                None => walk_again(&mut book.walk),
            }
        }
        self.check(&book);
        queued
    }
}

pub(super) fn walk_again(walk: &mut Walk) {
    *walk = match walk {
        Walk::Done => Walk::Walking {
            after: None,
            again: false,
        },
        Walk::Walking { after, .. } => Walk::Walking {
            after: after.take(),
            again: true,
        },
    };
}

fn set_walk_after(walk: &mut Walk, to: Option<TreeKey>) {
    if let Walk::Walking { after, .. } = walk {
        assert!(to >= *after, "the walk moved back");
        *after = to;
    }
}
