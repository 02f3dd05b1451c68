//! What a call whose rights hold must get: the input rules of
//! docs/design.md §4 ("Errors", and the order refusals are given in),
//! written again from the docs and not from the engine's `validate.rs` or
//! `service/api.rs`. The intruder's calls its role allows
//! (`scenario::workload::intruder`) and the calls of the caller at a
//! replica's address (`scenario::workload::rogue`) are shaped so that
//! their outcome is known before they are sent: accepted, or refused with
//! one typed error. An answer is then held to that prediction; an operating
//! error (timeouts, overload, storage, shutdown, rejoining) says nothing.

use arbor::proto::{Request, Response};
use arbor::Error;

/// A typed refusal the model predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `PermissionDenied`: the caller's rights, or an `Apply` carrying
    /// another replica's ops.
    Rights,
    /// `NotReplica`: the replica called does not hold the container.
    NotReplica,
    /// `RootImmutable`: `Move` or `Remove` of `ROOT`.
    RootImmutable,
    /// `InvalidOp`: `TRASH` moved, or a replicated op with a reserved child.
    InvalidOp,
    /// `EmptyPath`: a path request without components.
    EmptyPath,
    /// `UnsupportedAttribute`: a path attribute other than `FileName`.
    UnsupportedAttribute,
    /// `ParentNotLive`: a local write under a parent the tree never held.
    ParentNotLive,
    /// `NodeNotFound`: `Remove` of a node the tree never held
    /// (`TreeNotFound` where the replica holds no such tree either).
    NodeNotFound,
    /// `CounterTooFar`: replicated ops further ahead of everything the
    /// tree could hold than `limits.counter_jump_max`.
    CounterTooFar,
}

impl Refusal {
    /// True when `error` is this refusal.
    pub fn is(self, error: &Error) -> bool {
        matches!(
            (self, error),
            (Refusal::Rights, Error::PermissionDenied { .. })
                | (Refusal::NotReplica, Error::NotReplica(_))
                | (Refusal::RootImmutable, Error::RootImmutable)
                | (Refusal::InvalidOp, Error::InvalidOp(_))
                | (Refusal::EmptyPath, Error::EmptyPath)
                | (
                    Refusal::UnsupportedAttribute,
                    Error::UnsupportedAttribute(_)
                )
                | (Refusal::ParentNotLive, Error::ParentNotLive(_))
                | (
                    Refusal::NodeNotFound,
                    Error::NodeNotFound(_) | Error::TreeNotFound
                )
                | (Refusal::CounterTooFar, Error::CounterTooFar { .. })
        )
    }

    /// Refused for the request's own shape, before the replica looks at
    /// whether it holds the container (docs/design.md §4: a local write is
    /// checked for rights, then its shape, then holding, then the tree).
    pub fn before_holding(self) -> bool {
        matches!(
            self,
            Refusal::RootImmutable
                | Refusal::InvalidOp
                | Refusal::EmptyPath
                | Refusal::UnsupportedAttribute
        )
    }
}

/// The predicted outcome of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A write stored: the answer of its kind (`Added`, `AddedByPath`,
    /// `Done`, `Applied`); `NotReplicated` also (stored, still
    /// replicating).
    Accepted,
    /// A read served, or refused for what the tree holds at that moment:
    /// anything but a refusal for rights or holding.
    Served,
    /// Refused with this error.
    Refused(Refusal),
    /// Accepted, or refused with this error: a node the replica held may
    /// have gone with a drop of the tree or a replaced disk since.
    AcceptedOr(Refusal),
}

impl Expect {
    /// What a call to a replica that `holds` the container or not gets,
    /// given what it would get from one that holds it.
    pub fn at(self, holds: bool) -> Expect {
        match self {
            Expect::Refused(refusal) if refusal.before_holding() => self,
            Expect::Refused(Refusal::Rights) => self,
            _ if !holds => Expect::Refused(Refusal::NotReplica),
            _ => self,
        }
    }

    /// The tag a write carries: a write predicted refused must leave no
    /// trace anywhere (`check::trust`), one predicted stored may.
    pub fn refused(self) -> bool {
        matches!(self, Expect::Refused(_))
    }
}

/// How an answer compares with the prediction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judged {
    Agrees,
    /// No answer, or an operating error: nothing learned.
    Unknown,
    /// The answer contradicts the model.
    Disagrees(String),
}

/// Errors any call may get, whatever the model says.
fn operating(error: &Error) -> bool {
    matches!(
        error,
        Error::Timeout
            | Error::Network(_)
            | Error::Storage(_)
            | Error::ShuttingDown
            | Error::Overloaded(_)
            | Error::Rejoining
    )
}

/// The answer `request` gets when it is accepted.
fn accepted_answer(request: &Request, response: &Response) -> bool {
    match (request, response) {
        (Request::Add { .. }, Response::Added { .. }) => true,
        (Request::AddByPath { .. }, Response::AddedByPath { .. }) => true,
        (Request::Move { .. } | Request::Remove { .. } | Request::Drop { .. }, Response::Done) => {
            true
        }
        // Fewer fresh than sent when the call was sent again after its
        // connection broke behind it (`Apply` is idempotent, and a
        // transport may): the first attempt stored them.
        (Request::Apply { ops, .. }, Response::Applied { fresh }) => *fresh as usize <= ops.len(),
        _ => false,
    }
}

/// Holds the answer to `request` to `expect`.
pub fn judge(expect: Expect, request: &Request, answer: &Result<Response, Error>) -> Judged {
    let response = match answer {
        Err(_) => return Judged::Unknown,
        Ok(response) => response,
    };
    let error = match response {
        Response::Error(error) if operating(error) => return Judged::Unknown,
        Response::Error(error) => Some(error),
        _ => None,
    };
    let agrees = match (expect, error) {
        (Expect::Served, Some(error)) => {
            !matches!(error, Error::PermissionDenied { .. } | Error::NotReplica(_))
        }
        (Expect::Served, None) => true,
        (Expect::Accepted | Expect::AcceptedOr(_), Some(Error::NotReplicated { .. })) => true,
        (Expect::AcceptedOr(refusal), Some(error)) => refusal.is(error),
        (Expect::Accepted | Expect::AcceptedOr(_), None) => accepted_answer(request, response),
        (Expect::Accepted, Some(_)) => false,
        (Expect::Refused(refusal), Some(error)) => refusal.is(error),
        (Expect::Refused(_), None) => false,
    };
    if agrees {
        Judged::Agrees
    } else {
        Judged::Disagrees(format!("expected {expect:?}, answered {response:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbor::{ContainerId, TreeKey, ROOT};

    fn remove() -> Request {
        Request::Remove {
            tree: TreeKey::new(ContainerId([1; 32]), "t"),
            node: ROOT,
        }
    }

    #[test]
    fn answers_are_held_to_the_prediction() {
        let r = remove();
        let root = Ok(Response::Error(Error::RootImmutable));
        let done = Ok(Response::Done);
        let expect = Expect::Refused(Refusal::RootImmutable);
        assert_eq!(judge(expect, &r, &root), Judged::Agrees);
        assert!(matches!(judge(expect, &r, &done), Judged::Disagrees(_)));
        assert_eq!(judge(Expect::Accepted, &r, &done), Judged::Agrees);
        assert!(matches!(
            judge(Expect::Accepted, &r, &root),
            Judged::Disagrees(_)
        ));
        let busy = Ok(Response::Error(Error::Overloaded("queue".into())));
        assert_eq!(judge(expect, &r, &busy), Judged::Unknown);
        assert_eq!(judge(expect, &r, &Err(Error::Timeout)), Judged::Unknown);
        let denied = Ok(Response::Error(Error::PermissionDenied {
            operation: "Remove".into(),
            caller: "x".into(),
        }));
        assert!(matches!(
            judge(Expect::Served, &r, &denied),
            Judged::Disagrees(_)
        ));
    }

    /// A shape refusal comes before holding; the rest become `NotReplica`
    /// at a replica that does not hold the container.
    #[test]
    fn holding_is_checked_after_the_shape() {
        let shape = Expect::Refused(Refusal::EmptyPath);
        assert_eq!(shape.at(false), shape);
        let state = Expect::Refused(Refusal::ParentNotLive);
        assert_eq!(state.at(false), Expect::Refused(Refusal::NotReplica));
        assert_eq!(state.at(true), state);
        assert_eq!(
            Expect::Accepted.at(false),
            Expect::Refused(Refusal::NotReplica)
        );
    }
}
