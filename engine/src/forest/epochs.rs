//! Log epochs: which incarnation of a replica's database a log (and every
//! height in it) belongs to. A disk replaced and rebuilt from nothing
//! starts a new epoch; a peer whose pull cursors count heights of the old
//! one must start them over (docs/design.md §6).

use super::records::*;
use super::Forest;
use crate::error::Result;
use crate::types::ReplicaId;
use redb::ReadableTable;

impl Forest {
    /// This database's log epoch. The first call on a database without
    /// one (new, or laid out before epochs existed) stores `fresh`, which
    /// must be a number this replica never used as an epoch.
    pub fn log_epoch_init(&self, fresh: u64) -> Result<u64> {
        let txn = self.begin_write()?;
        let stored = {
            let mut meta = txn.open_table(META)?;
            let stored = meta.get(LOG_EPOCH)?.map(|g| g.value());
            if stored.is_none() {
                meta.insert(LOG_EPOCH, fresh)?;
            }
            stored
        };
        match stored {
            Some(epoch) => {
                txn.abort()?;
                Ok(epoch)
            }
            None => {
                txn.commit()?;
                Ok(fresh)
            }
        }
    }

    /// This database's log epoch; `None` before a service first ran on it.
    pub fn log_epoch(&self) -> Result<Option<u64>> {
        let txn = self.begin_read()?;
        let meta = txn.open_table(META)?;
        Ok(meta.get(LOG_EPOCH)?.map(|g| g.value()))
    }

    /// The log epoch of `peer` that the pull cursors of `peer` stored here
    /// count heights in; `None` before the first one is recorded.
    pub fn peer_log_epoch(&self, peer: ReplicaId) -> Result<Option<u64>> {
        let txn = self.begin_read()?;
        let meta = txn.open_table(META)?;
        let key = peer_log_epoch_key(peer);
        Ok(meta.get(key.as_str())?.map(|g| g.value()))
    }

    /// Records that the pull cursors of `peer` stored here count heights
    /// of its log of epoch `epoch`. The caller deleted every cursor of
    /// another epoch first: a crash between the two leaves the old epoch
    /// recorded, and the deletion is done again.
    pub fn peer_log_epoch_set(&self, peer: ReplicaId, epoch: u64) -> Result<()> {
        let txn = self.begin_write()?;
        txn.open_table(META)?
            .insert(peer_log_epoch_key(peer).as_str(), epoch)?;
        txn.commit()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forest::ForestOptions;

    fn forest() -> Forest {
        Forest::in_memory(ForestOptions::default()).expect("forest")
    }

    #[test]
    fn the_first_epoch_stays() {
        let forest = forest();
        assert_eq!(forest.log_epoch().unwrap(), None);
        assert_eq!(forest.log_epoch_init(7).unwrap(), 7);
        assert_eq!(forest.log_epoch().unwrap(), Some(7));
        assert_eq!(forest.log_epoch_init(8).unwrap(), 7);
    }

    #[test]
    fn a_peer_epoch_is_recorded_per_peer() {
        let forest = forest();
        assert_eq!(forest.peer_log_epoch(2).unwrap(), None);
        forest.peer_log_epoch_set(2, 11).unwrap();
        forest.peer_log_epoch_set(3, 12).unwrap();
        forest.peer_log_epoch_set(2, 13).unwrap();
        assert_eq!(forest.peer_log_epoch(2).unwrap(), Some(13));
        assert_eq!(forest.peer_log_epoch(3).unwrap(), Some(12));
    }
}
