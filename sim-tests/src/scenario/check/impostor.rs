//! Misconfiguration: no replica holds an op written by a process that
//! claimed another replica's id (`scenario::nemesis::misconfig`). Such a process
//! writes only the misled client's objects, each tagged
//! `MISCONFIG_TAG_KEY`, so one scan of every replica's log finds any that
//! crossed over, by push, by sync or through the restored replica.

use super::{trust, Checker, Checkpoint};
use crate::failure::{Failure, FailureKind};
use crate::scenario::nemesis::misconfig::MISCONFIG_TAG_KEY;
use arbor::runtime::BoxFuture;

/// See the module documentation.
pub struct ImpostorLeftNoTrace;

impl Checker for ImpostorLeftNoTrace {
    fn check<'a>(&'a self, at: &'a Checkpoint<'a>) -> BoxFuture<'a, Result<(), Failure>> {
        Box::pin(async move {
            let whose = "a misconfigured node's";
            trust::no_op_tagged(at, MISCONFIG_TAG_KEY, FailureKind::ImpostorOp, whose)
        })
    }
}
