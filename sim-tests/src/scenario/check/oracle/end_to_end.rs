//! A gateway's gRPC answer as it reached the gateway, held to the model:
//! the answer oracle of `watch` judges what the service answered the
//! front, this one what the front made of it (the translation to gRPC
//! messages, a listing streamed page by page, read back by the gateway).
//!
//! A streamed listing reads each page from its own snapshot, so a listing
//! that commits overtook may be no state the tree ever was in: the answer
//! is judged only when the replica's tree stood still for the whole call
//! (the same incarnation and height at its start and end, on the same
//! incarnation of the replica). It must then be the model's answer for
//! that state, with the translations the gRPC API makes (a GetSubTree of
//! a root that is not there answers that root alone with an empty meta).

use super::expect::{check_read, subtree, tree_of, wrong_detail, Checked};
use super::TreeView;
use crate::coverage::{Coverage, CoverageCounter};
use crate::failure::{Failure, FailureKind, Verdict};
use crate::world::World;
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::{Meta, NodeInfo, ReplicaId, ROOT};
use std::sync::{Arc, Weak};

/// Where a replica's tree stood when a gateway sent a read. It holds the
/// replica's incarnation weakly: a process that stops while the read is
/// under way must be free to drop its database.
pub struct Before {
    service: Weak<Service>,
    at: (Option<u64>, u64),
}

/// The replica's tree as the read is sent; `None` when there is nothing
/// to judge by (not a read of a tree, the replica down, its disk failing).
pub fn before(world: &World, replica: ReplicaId, request: &Request) -> Option<Before> {
    let tree = tree_of(request)?;
    let service = world.node(replica).service()?;
    let at = heights(&service, tree)?;
    let service = Arc::downgrade(&service);
    Some(Before { service, at })
}

fn heights(service: &Service, tree: &arbor::TreeKey) -> Option<(Option<u64>, u64)> {
    let forest = service.forest();
    Some((
        forest.tree_incarnation(tree).ok()?,
        forest.next_height(tree).ok()?,
    ))
}

/// Judges the answer a gateway got to `request` from `replica`, sent
/// when the tree stood at `before`.
pub fn check(
    world: &World,
    (verdict, coverage): (&Verdict, &CoverageCounter),
    replica: ReplicaId,
    request: &Request,
    response: &Response,
    before: Before,
) {
    if matches!(response, Response::Error(_)) {
        // Refusals are the service's, judged by `watch`; the gRPC status
        // keeps too little of them to judge again.
        return;
    }
    let tree = tree_of(request).expect("a read of a tree");
    let Some(service) = world.node(replica).service() else {
        return;
    };
    let same_incarnation = std::ptr::eq(Arc::as_ptr(&service), before.service.as_ptr());
    if !same_incarnation || heights(&service, tree) != Some(before.at) {
        return;
    }
    let forest = service.forest();
    let view = match TreeView::read(forest, tree) {
        Ok(view) => view,
        Err(_) => return,
    };
    let checked = match (request, view.as_ref()) {
        (Request::GetSubTree { root, .. }, Some(view)) if subtree(view, *root, 1).is_none() => {
            let alone = NodeInfo {
                id: *root,
                parent: ROOT,
                meta: Meta::default(),
            };
            if *response == Response::Nodes(vec![alone]) {
                Checked::Agreed(Coverage::GrpcAnswer)
            } else {
                Checked::Wrong(format!(
                    "answered {response:?} for a missing root (gRPC answers the root alone)"
                ))
            }
        }
        _ => match check_read(request, response, view.as_ref(), forest) {
            Checked::Agreed(_) => Checked::Agreed(Coverage::GrpcAnswer),
            other => other,
        },
    };
    match checked {
        Checked::Agreed(kind) => coverage.hit(kind),
        Checked::Skipped => {}
        Checked::Wrong(wrong) => {
            let detail = wrong_detail(replica, request, &wrong);
            verdict.fail(Failure::new(
                FailureKind::WrongAnswer,
                format!("over gRPC, as the gateway read it: {detail}"),
            ));
        }
    }
}
