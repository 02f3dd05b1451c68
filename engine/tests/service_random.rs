//! Seeded random runs of a 3-node cluster on the in-process network in
//! virtual time: random writes through random nodes while links are cut and
//! healed and nodes drop off the network. After healing, replication alone
//! (sync off) must bring every replica to the same trees and logs, and no
//! write may be left waiting.
//!
//! `ARBOR_SERVICE_SEEDS=100 cargo test -p arbor-engine --test service_random`
//! runs more seeds; a failure prints the seed.

mod service_support;

use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::Caller;
use arbor::{KeyValue, TreeKey, ATTR_FILE_NAME, ROOT};
use service_support::*;
use std::sync::Arc;
use std::time::Duration;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: small, seeded, the same everywhere.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Node ids a replica currently knows for a tree (for moves and removes).
async fn known_nodes(service: &Service, tree: &TreeKey) -> Vec<u64> {
    let request = Request::GetSubTree {
        tree: tree.clone(),
        root: ROOT,
        depth: 0,
    };
    match service.handle(&Caller::Anonymous, request).await {
        Response::Nodes(nodes) => nodes.into_iter().map(|n| n.id).collect(),
        _ => vec![ROOT],
    }
}

async fn random_write(rng: &mut Rng, service: &Service, tree: &TreeKey) {
    let known = known_nodes(service, tree).await;
    let pick = |rng: &mut Rng| known[rng.below(known.len() as u64) as usize];
    let name = format!("n{}", rng.below(6));
    let items = vec![KeyValue::new(ATTR_FILE_NAME, name.as_bytes())];
    let request = match rng.below(4) {
        0 => Request::Add {
            tree: tree.clone(),
            parent: pick(rng),
            items,
        },
        1 => Request::AddByPath {
            tree: tree.clone(),
            attr: ATTR_FILE_NAME.into(),
            path: vec![format!("d{}", rng.below(3)), format!("e{}", rng.below(2))],
            items,
        },
        2 => Request::Move {
            tree: tree.clone(),
            parent: pick(rng),
            node: pick(rng),
            items,
        },
        _ => Request::Remove {
            tree: tree.clone(),
            node: pick(rng),
        },
    };
    // Refusals (moving ROOT, unknown nodes) are part of the workload.
    let _ = service.handle(&Caller::Anonymous, request).await;
}

async fn run(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let net = LocalNet::new();
    let nodes: Vec<Arc<Service>> = cluster_configs(3)
        .into_iter()
        .map(|mut c| {
            c.tree.replication_channel_capacity = 1 + rng.below(3) as usize;
            c.tree.replication_timeout = Duration::from_secs(1 + rng.below(5));
            c.limits.sync_page_size = 1 + rng.below(8) as usize;
            let forest = memory_forest(&c);
            start_node(&net, c, forest)
        })
        .collect();
    let trees = [tree("x"), tree("y")];
    let mut writers = Vec::new();
    for _ in 0..150 {
        match rng.below(10) {
            0 => {
                let (from, to) = (1 + rng.below(3) as u16, 1 + rng.below(3) as u16);
                net.cut(from, to, rng.below(2) == 0);
            }
            1 => net.set_down(1 + rng.below(3) as u16, rng.below(3) == 0),
            2 => tokio::time::sleep(Duration::from_millis(rng.below(3000))).await,
            _ => {
                let node = nodes[rng.below(3) as usize].clone();
                let t = trees[rng.below(2) as usize].clone();
                let mut task_rng = Rng(rng.next() | 1);
                writers.push(tokio::spawn(async move {
                    random_write(&mut task_rng, &node, &t).await
                }));
            }
        }
    }
    for w in writers {
        w.await.unwrap();
    }
    for a in 1..=3 {
        net.set_down(a, false);
        for b in 1..=3 {
            net.cut(a, b, false);
        }
    }
    let deadline = Duration::from_secs(3600);
    eventually(&format!("seed {seed}: replication idle"), deadline, || {
        nodes.iter().all(|n| n.replication_idle())
    })
    .await;
    for t in &trees {
        let reference = dump(&nodes[0], t);
        for node in &nodes[1..] {
            assert_eq!(
                dump(node, t),
                reference,
                "seed {seed}: replicas differ on {t:?}"
            );
        }
        for node in &nodes {
            if reference.is_some() {
                node.forest()
                    .check_invariants(t)
                    .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            }
        }
    }
    for node in &nodes {
        assert_eq!(node.stats().pending_writes, 0, "seed {seed}: a write hangs");
    }
}

#[tokio::test(start_paused = true)]
async fn random_partitions_converge_by_replication_alone() {
    let seeds: u64 = std::env::var("ARBOR_SERVICE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    for seed in 0..seeds {
        run(seed).await;
    }
}
