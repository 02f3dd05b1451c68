//! A misconfiguration in the simulator: the node at replica 3's address is
//! configured as replica 2 (two nodes with one replica id). It is detected,
//! never a silent divergence: its pushes, stamped as replica 2 from replica
//! 3's address, are refused; the other replicas' sync finds a peer
//! answering as another replica and does not pull from it; the trust
//! checker counts it as a failure of its own kind; and no correct replica
//! holds an op the impostor wrote.

use arbor::proto::{Request, Response};
use arbor::{ContainerId, KeyValue, TreeKey, ATTR_FILE_NAME, ROOT};
use arbor_sim::failure::FailureKind;
use arbor_sim::scenario::checkers::{self, check_at};
use arbor_sim::scenario::ledger::Ledger;
use arbor_sim::trace::Trace;
use arbor_sim::world::{cluster_configs_with, Knobs, World};
use madsim::runtime::Runtime;
use std::time::Duration;

fn add(tree: &TreeKey, name: &str) -> Request {
    Request::Add {
        tree: tree.clone(),
        parent: ROOT,
        items: vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes().to_vec())],
    }
}

#[test]
fn two_replicas_with_one_id_are_detected() {
    let runtime = Runtime::with_seed_and_config(7, madsim::Config::default());
    runtime.block_on(async {
        let knobs = Knobs {
            sync_interval: Some(Duration::from_secs(2)),
            ..Knobs::default()
        };
        let mut configs = cluster_configs_with(3, &knobs, &[]);
        // The third node's file says replica 2; it knows replica 1 only.
        configs[2].node.replica_id = 2;
        configs[2].node.peers.retain(|p| p.replica_id == 1);
        configs[2].validate().expect("valid on its own");
        let mut world = World::build_simple(configs, Trace::new(false));
        let client = world.client();
        madsim::time::sleep(Duration::from_secs(2)).await;
        let tree = TreeKey::new(ContainerId([5; 32]), "t");
        // Replica id 2 reaches the impostor (the last node named 2).
        for (replica, name) in [(1, "real"), (2, "impostor")] {
            let answer = client
                .call(replica, add(&tree, name), Duration::from_secs(2))
                .await;
            assert!(matches!(answer, Ok(Response::Added { .. })), "{answer:?}");
        }
        madsim::time::sleep(Duration::from_secs(20)).await;

        let stats = |index: usize| world.nodes[index].service().unwrap().stats();
        for index in [0, 1] {
            let seen = stats(index);
            assert!(
                seen.peer_identity_mismatches > 0,
                "node {index} did not notice the impostor: {seen:?}"
            );
            let forest = world.nodes[index].service().unwrap().forest().clone();
            let log = forest.dump(&tree).map(|d| d.log).unwrap_or_default();
            let impostors = log.iter().filter(|op| {
                op.meta
                    .items
                    .iter()
                    .any(|kv| kv.value.as_slice() == b"impostor")
            });
            assert_eq!(impostors.count(), 0, "node {index} took the impostor's op");
        }
        assert!(stats(0).requests_refused > 0, "pushes from 3 stamped as 2");
        let failure = check_at(&world, &Ledger::default(), "test", &checkers::standard())
            .await
            .unwrap_err();
        assert_eq!(failure.kind, FailureKind::StampConflict, "{failure}");
    });
}
