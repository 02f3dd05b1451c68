//! Rejoin: a node whose disk was replaced (`node.rejoin`) starts with an
//! empty database under its old replica id. Its peers may hold ops its
//! lost disk stamped; a local op takes its tree's largest stored counter
//! plus one (docs/design.md §3), so before that tree holds those ops a
//! new local op could repeat one of their stamps with another op, a stamp
//! conflict no replica can resolve. The node therefore takes no local
//! write until one sync round pulled every tree of every container it
//! replicates from every peer to the end of its log: from then on every
//! stamp its lost disk gave that any peer holds is stored here, and new
//! counters start above them (docs/design.md §6, "Node replacement").

use crate::canary::{self, Canary};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether local writes wait for a complete sync round.
pub struct Rejoin {
    pending: AtomicBool,
}

impl Rejoin {
    /// Pending from the start when the node is configured to rejoin.
    pub fn new(configured: bool) -> Self {
        Self {
            pending: AtomicBool::new(configured),
        }
    }

    /// True until a complete sync round ended.
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// `Rejoining` while the node has not learnt its peers' logs.
    pub fn check_writable(&self) -> Result<()> {
        if self.pending() && !canary::active(Canary::RejoinAcceptsWrites) {
            return Err(Error::Rejoining);
        }
        Ok(())
    }

    /// A sync round ended; a complete one ends the rejoin. True when this
    /// round ended it.
    pub fn round_ended(&self, complete: bool) -> bool {
        complete && self.pending.swap(false, Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes are refused until a complete round; an incomplete round
    /// changes nothing, and a node not rejoining never refuses.
    #[test]
    fn writes_wait_for_a_complete_round() {
        let rejoin = Rejoin::new(true);
        assert_eq!(rejoin.check_writable(), Err(Error::Rejoining));
        assert!(!rejoin.round_ended(false));
        assert_eq!(rejoin.check_writable(), Err(Error::Rejoining));
        assert!(rejoin.round_ended(true));
        assert_eq!(rejoin.check_writable(), Ok(()));
        assert!(!rejoin.round_ended(true), "ended once");
        assert_eq!(Rejoin::new(false).check_writable(), Ok(()));
    }
}
