//! Who may send what: the rules of docs/security.md ("Identities and
//! rights"), written again from that table and not from the engine's
//! `service/access.rs`, so that a weakened check in the engine disagrees
//! with it. The intruder's calls (`scenario::workload::intruder`) are
//! judged by it: a call its role allows must not be refused for rights, and
//! one it does not allow must be.

use crate::scenario::plan::swarm::CallerRole;
use arbor::proto::Request;
use arbor::ReplicaId;

/// What a request asks of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Anyone (`Healthcheck`, `Hello`).
    Nobody,
    /// At least this client role on the request's container.
    Role(CallerRole),
    /// At least this client role, or being one of the container's other
    /// replicas (`TreeList`, op-log reads).
    RoleOrReplica(CallerRole),
    /// Being one of the container's other replicas (`Apply`).
    Replica,
}

/// The table of docs/security.md.
pub fn needs(request: &Request) -> Needs {
    use CallerRole::*;
    match request {
        Request::Healthcheck | Request::Hello { .. } => Needs::Nobody,
        Request::GetNodeByPath { .. }
        | Request::GetMeta { .. }
        | Request::GetSubTree { .. }
        | Request::ListChildren { .. }
        | Request::GetSubTreePage { .. } => Needs::Role(Reader),
        Request::TreeList { .. } => Needs::RoleOrReplica(Reader),
        Request::Add { .. }
        | Request::AddByPath { .. }
        | Request::Move { .. }
        | Request::Remove { .. } => Needs::Role(Writer),
        Request::Drop { .. } => Needs::Role(Owner),
        Request::GetOpLog { .. } | Request::GetOpLogStamps { .. } => Needs::RoleOrReplica(Owner),
        Request::Apply { .. } => Needs::Replica,
    }
}

/// Whether a client holding `role` on the request's container (no
/// replica) may send `request`.
pub fn client_may(role: CallerRole, request: &Request) -> bool {
    match needs(request) {
        Needs::Nobody => true,
        Needs::Role(needed) | Needs::RoleOrReplica(needed) => {
            role != CallerRole::None && role >= needed
        }
        Needs::Replica => false,
    }
}

/// Whether a caller at replica `caller`'s address may send `request` to
/// replica `target`, the request's container being held by `holders`: a
/// replica holds no client role, and its replication rights (`Apply`,
/// op-log reads, `TreeList`) are on the containers it holds, called at
/// one of their other replicas. An `Apply` it may send must also carry
/// only ops it stamped itself (docs/security.md); that rule is the
/// caller's to apply (`workload::rogue`).
pub fn replica_may(
    caller: ReplicaId,
    target: ReplicaId,
    holders: &[ReplicaId],
    request: &Request,
) -> bool {
    let replicates = caller != target && holders.contains(&caller);
    match needs(request) {
        Needs::Nobody => true,
        Needs::Role(_) => false,
        Needs::RoleOrReplica(_) | Needs::Replica => replicates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::{ContainerId, TreeKey, ROOT};

    fn tree() -> TreeKey {
        TreeKey::new(ContainerId([1; 32]), "t")
    }

    /// Each role may what the table gives it and everything below, and
    /// no client may Apply.
    #[test]
    fn roles_follow_the_table() {
        let read = Request::GetSubTree {
            tree: tree(),
            root: ROOT,
            depth: 1,
        };
        let write = Request::Remove {
            tree: tree(),
            node: 5,
        };
        let drop = Request::Drop {
            cid: tree().cid,
            tree: None,
        };
        let log = Request::GetOpLog {
            tree: tree(),
            from_height: 0,
            limit: 1,
        };
        let apply = Request::Apply {
            tree: tree(),
            ops: Vec::new(),
        };
        let may = |role| {
            [&read, &write, &drop, &log, &apply, &Request::Healthcheck].map(|r| client_may(role, r))
        };
        let none = [false, false, false, false, false, true];
        assert_eq!(may(CallerRole::None), none);
        let reader = [true, false, false, false, false, true];
        assert_eq!(may(CallerRole::Reader), reader);
        let writer = [true, true, false, false, false, true];
        assert_eq!(may(CallerRole::Writer), writer);
        let owner = [true, true, true, true, false, true];
        assert_eq!(may(CallerRole::Owner), owner);
        // A replica of the container, calling another of its replicas,
        // may replicate and read the log, and nothing a client may.
        let as_replica = |caller, target, holders: &[ReplicaId]| {
            [&read, &write, &drop, &log, &apply, &Request::Healthcheck]
                .map(|r| replica_may(caller, target, holders, r))
        };
        let replica = [false, false, false, true, true, true];
        assert_eq!(as_replica(2, 1, &[1, 2, 3]), replica);
        // Not at itself, and not for a container it does not hold.
        let stranger = [false, false, false, false, false, true];
        assert_eq!(as_replica(2, 2, &[1, 2, 3]), stranger);
        assert_eq!(as_replica(4, 1, &[1, 2, 3]), stranger);
    }
}
