//! The gRPC front through a real gRPC channel on 127.0.0.1: every call,
//! the translations gateways rely on, and refusals with the error text a
//! gateway expects ("not found", "is denied by"), with nothing stored for
//! a refused write.

mod service_support;

use arbor::config::{Config, ContainerAccess, ContainerConfig, Grants, PeerConfig, Role};
use arbor::grpc::client::{GrpcClient, Target};
use arbor::grpc::{pb, Front, Signer};
use arbor::service::Service;
use arbor::types::make_timestamp;
use arbor::*;
use futures::StreamExt;
use service_support::*;
use std::sync::Arc;
use tonic::Code;

/// Keys of the callers every test uses.
fn owner() -> Signer {
    Signer::from_seed(1)
}
fn writer() -> Signer {
    Signer::from_seed(2)
}
fn reader() -> Signer {
    Signer::from_seed(3)
}
fn stranger() -> Signer {
    Signer::from_seed(4)
}
/// The key replica 2 signs its gRPC sync calls with.
fn replica_two() -> Signer {
    Signer::from_seed(20)
}

/// A container this node does not hold (only replica 2 does).
fn foreign_cid() -> ContainerId {
    ContainerId([0xcd; 32])
}

struct Node {
    service: Arc<Service>,
    address: String,
    _server: arbor::grpc::GrpcServer,
}

impl Node {
    async fn client(&self, signer: Signer) -> GrpcClient {
        GrpcClient::connect(&Target::plaintext(&self.address), signer)
            .await
            .unwrap()
    }

    /// Ops stored in `tree` here (0 for a tree that does not exist).
    fn stored(&self, tree: &TreeKey) -> u64 {
        self.service.forest().next_height(tree).unwrap()
    }
}

fn config() -> Config {
    let mut config = Config::default_for_test(1);
    let mut peer = PeerConfig::new(2, "local:2");
    peer.public_key = Some(replica_two().public().hex());
    config.node.peers = vec![peer];
    config.node.containers = vec![ContainerConfig::new(foreign_cid(), vec![2])];
    let mut grants = Grants::default();
    grants.grant(Role::Owner, &owner().public().hex());
    grants.grant(Role::Writer, &writer().public().hex());
    grants.grant(Role::Reader, &reader().public().hex());
    config.access = arbor::config::AccessConfig {
        containers: vec![ContainerAccess { cid: cid(), grants }],
        ..Default::default()
    };
    config.grpc.stream_page_nodes = 3;
    config
}

async fn start(config: Config) -> Node {
    let net = Arc::new(LocalNet::default());
    let forest = memory_forest(&config);
    let service = start_node(&net, config.clone(), forest);
    let listener = arbor::grpc::listen(
        &Config {
            grpc: arbor::config::GrpcConfig {
                listen: Some("127.0.0.1:0".into()),
                ..config.grpc.clone()
            },
            ..config.clone()
        },
        false,
    )
    .await
    .unwrap()
    .unwrap();
    let server = arbor::grpc::serve(&config, listener, Front::new(service.clone()), None).unwrap();
    Node {
        address: server.local_addr.to_string(),
        service,
        _server: server,
    }
}

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue::new(key, value.as_bytes())
}

fn names(nodes: &[NodeInfo]) -> Vec<String> {
    nodes
        .iter()
        .map(|n| String::from_utf8_lossy(n.meta.get(ATTR_FILE_NAME).unwrap_or(b"-")).into_owned())
        .collect()
}

#[tokio::test]
async fn add_by_path_with_and_without_a_path() {
    let node = start(config()).await;
    let mut client = node.client(writer()).await;
    let tree = tree("version");
    // The top level of a bucket: an empty path puts the leaf under the root.
    let (nodes, parent) = client
        .add_by_path(&tree, &[], &[kv("FileName", "top.txt"), kv("OID", "1")])
        .await
        .unwrap();
    assert_eq!((nodes.len(), parent), (1, ROOT));
    let top = &client
        .get_node_by_path(&tree, &["top.txt"], false)
        .await
        .unwrap();
    assert_eq!(top.len(), 1);
    assert_eq!((top[0].id, top[0].parent), (nodes[0], ROOT));
    // A path: the leaf first, then the directories created, top down.
    let (nodes, parent) = client
        .add_by_path(&tree, &["a", "b"], &[kv("FileName", "f"), kv("OID", "2")])
        .await
        .unwrap();
    assert_eq!(nodes.len(), 3);
    assert_eq!(
        parent, nodes[2],
        "the leaf hangs under the deepest directory"
    );
    let dir_a = client.get_node_by_path(&tree, &["a"], false).await.unwrap();
    assert_eq!(dir_a[0].id, nodes[1]);
    assert_eq!(dir_a[0].parent, ROOT);
    let leaf = client
        .get_node_by_path(&tree, &["a", "b", "f"], false)
        .await
        .unwrap();
    assert_eq!((leaf[0].id, leaf[0].parent), (nodes[0], nodes[2]));
    // Existing directories are reused: only the leaf is new.
    let (again, parent) = client
        .add_by_path(&tree, &["a", "b"], &[kv("FileName", "g")])
        .await
        .unwrap();
    assert_eq!((again.len(), parent), (1, nodes[2]));
    // An empty path attribute means FileName; another attribute is refused.
    let mut body = pb::add_by_path_request::Body {
        container_id: cid().0.to_vec(),
        tree_id: "version".into(),
        path_attribute: String::new(),
        path: vec!["a".into()],
        meta: arbor::grpc::client::proto_meta(&[kv("FileName", "h")]),
        bearer_token: Vec::new(),
    };
    let request = client.sign(body.clone());
    let answer = client
        .raw()
        .add_by_path(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.body.unwrap().parent_id, nodes[1]);
    body.path_attribute = "OID".into();
    let request = client.sign(body);
    let refused = client.raw().add_by_path(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
}

#[tokio::test]
async fn versions_of_one_name_and_what_a_lookup_returns() {
    let node = start(config()).await;
    let mut client = node.client(writer()).await;
    let tree = tree("version");
    let mut ids = Vec::new();
    for version in ["1", "2", "3"] {
        let meta = [kv("FileName", "obj"), kv("OID", version), kv("Size", "9")];
        let (nodes, _) = client.add_by_path(&tree, &["dir"], &meta).await.unwrap();
        ids.push(nodes[0]);
    }
    let all = client
        .get_node_by_path(&tree, &["dir", "obj"], false)
        .await
        .unwrap();
    let mut found: Vec<NodeId> = all.iter().map(|n| n.id).collect();
    found.sort();
    assert_eq!(found, ids, "every version answers");
    let latest = client
        .get_node_by_path(&tree, &["dir", "obj"], true)
        .await
        .unwrap();
    assert_eq!(latest.len(), 1);
    assert_eq!(
        latest[0].meta.get("OID"),
        Some(&b"3"[..]),
        "the newest version"
    );
    assert_eq!(latest[0].meta.time, ids[2]);
    // `attributes` filters the meta unless `all_attributes`.
    let body = pb::get_node_by_path_request::Body {
        container_id: cid().0.to_vec(),
        tree_id: "version".into(),
        path_attribute: "FileName".into(),
        path: vec!["dir".into(), "obj".into()],
        attributes: vec!["OID".into()],
        latest_only: true,
        all_attributes: false,
        bearer_token: Vec::new(),
    };
    let request = client.sign(body.clone());
    let answer = client
        .raw()
        .get_node_by_path(request)
        .await
        .unwrap()
        .into_inner();
    let info = &answer.body.unwrap().nodes[0];
    let keys: Vec<&str> = info.meta.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["OID"]);
    assert_eq!(info.timestamp, ids[2]);
    // An empty path names nothing.
    let empty = pb::get_node_by_path_request::Body {
        path: Vec::new(),
        ..body
    };
    let request = client.sign(empty);
    let answer = client
        .raw()
        .get_node_by_path(request)
        .await
        .unwrap()
        .into_inner();
    assert!(answer.body.unwrap().nodes.is_empty());
    // A missing path is an empty answer, not an error.
    let none = client
        .get_node_by_path(&tree, &["dir", "nope"], false)
        .await
        .unwrap();
    assert!(none.is_empty());
}

#[tokio::test]
async fn add_move_remove_and_subtrees() {
    let node = start(config()).await;
    let mut client = node.client(writer()).await;
    let tree = tree("system");
    let dir = client
        .add(&tree, ROOT, &[kv("FileName", "uploads")])
        .await
        .unwrap();
    let mut parts = Vec::new();
    for n in ["3", "1", "2"] {
        let id = client
            .add(
                &tree,
                dir,
                &[kv("FileName", &format!("part{n}")), kv("Number", n)],
            )
            .await
            .unwrap();
        parts.push(id);
    }
    // Depth 1: the root alone; 2: with its children; 0: everything. The
    // pages are 3 nodes (`grpc.stream_page_nodes`), so 5 nodes take two.
    let one = client.get_subtree(&tree, dir, 1, false).await.unwrap();
    assert_eq!(one.iter().map(|n| n.id).collect::<Vec<_>>(), [dir]);
    let two = client.get_subtree(&tree, dir, 2, false).await.unwrap();
    let mut expected = vec![dir];
    expected.extend(parts.iter().copied());
    assert_eq!(two.iter().map(|n| n.id).collect::<Vec<_>>(), expected);
    assert!(two[1..].iter().all(|n| n.parent == dir));
    let all = client.get_subtree(&tree, ROOT, 0, false).await.unwrap();
    assert_eq!(all.len(), 5);
    assert_eq!((all[0].id, all[0].parent), (ROOT, ROOT));
    // Ordered by FileName on request.
    let by_name = client.get_subtree(&tree, dir, 2, true).await.unwrap();
    assert_eq!(names(&by_name), ["uploads", "part1", "part2", "part3"]);
    // Move: new meta in place (an overwrite), then to another parent.
    client
        .move_node(
            &tree,
            dir,
            parts[0],
            &[kv("FileName", "part3"), kv("Number", "33")],
        )
        .await
        .unwrap();
    let moved = client.get_subtree(&tree, parts[0], 1, false).await.unwrap();
    assert_eq!(moved[0].meta.get("Number"), Some(&b"33"[..]));
    client
        .move_node(&tree, ROOT, parts[1], &[kv("FileName", "loose")])
        .await
        .unwrap();
    let top = client.get_subtree(&tree, ROOT, 2, false).await.unwrap();
    assert!(top.iter().any(|n| n.id == parts[1] && n.parent == ROOT));
    // Remove, and Remove of what is not there: both succeed.
    client.remove(&tree, parts[2]).await.unwrap();
    let left = client.get_subtree(&tree, dir, 0, false).await.unwrap();
    assert!(left.iter().all(|n| n.id != parts[2]));
    client.remove(&tree, 123_456).await.unwrap();
    client
        .remove(&TreeKey::new(cid(), "no-such-tree"), 5)
        .await
        .unwrap();
    // A root that is not there streams one node with an empty meta.
    let missing = client.get_subtree(&tree, 777, 0, false).await.unwrap();
    assert_eq!(missing.len(), 1);
    assert_eq!((missing[0].id, missing[0].parent), (777, ROOT));
    assert!(missing[0].meta.items.is_empty());
    // A tree that is not there is "not found".
    let status = client
        .get_subtree(&TreeKey::new(cid(), "nope"), ROOT, 0, false)
        .await
        .unwrap_err();
    assert!(status.message().contains("not found"), "{status:?}");
    // TreeList, ascending.
    client
        .add(&TreeKey::new(cid(), "a-tree"), ROOT, &[])
        .await
        .unwrap();
    let trees = client.tree_list(&cid()).await.unwrap();
    assert_eq!(trees, ["a-tree", "system"]);
    // Healthcheck needs no signature.
    client.healthcheck().await.unwrap();
}

#[tokio::test]
async fn refusals_carry_the_text_gateways_match_and_store_nothing() {
    let node = start(config()).await;
    let tree = tree("version");
    let meta = [kv("FileName", "x")];
    let body = pb::add_by_path_request::Body {
        container_id: cid().0.to_vec(),
        tree_id: "version".into(),
        path_attribute: "FileName".into(),
        path: vec!["d".into()],
        meta: arbor::grpc::client::proto_meta(&meta),
        bearer_token: Vec::new(),
    };
    let mut client = node.client(writer()).await;
    let refused = |status: tonic::Status, code: Code| {
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains("is denied by"), "{status:?}");
    };
    // No signature at all.
    let unsigned = pb::AddByPathRequest {
        body: Some(body.clone()),
        signature: None,
    };
    refused(
        client.raw().add_by_path(unsigned).await.unwrap_err(),
        Code::Unauthenticated,
    );
    // A signature over another body (the body altered after signing).
    let mut altered = client.sign(body.clone());
    altered.body.as_mut().unwrap().path = vec!["elsewhere".into()];
    refused(
        client.raw().add_by_path(altered).await.unwrap_err(),
        Code::Unauthenticated,
    );
    // A signature made with another key than the one it names.
    let mut wrong_key = client.sign(body.clone());
    wrong_key.signature.as_mut().unwrap().key = owner().public().compressed();
    refused(
        client.raw().add_by_path(wrong_key).await.unwrap_err(),
        Code::Unauthenticated,
    );
    // Garbage in the signature's fields.
    let mut garbage = client.sign(body.clone());
    garbage.signature.as_mut().unwrap().sign = vec![4; 10];
    refused(
        client.raw().add_by_path(garbage).await.unwrap_err(),
        Code::Unauthenticated,
    );
    // A valid signature by a key without rights, and a reader writing.
    for signer in [stranger(), reader()] {
        let mut other = node.client(signer).await;
        let request = other.sign(body.clone());
        refused(
            other.raw().add_by_path(request).await.unwrap_err(),
            Code::PermissionDenied,
        );
    }
    // A stranger may not read either; a reader may.
    let mut outsider = node.client(stranger()).await;
    let status = outsider
        .get_node_by_path(&tree, &["d"], false)
        .await
        .unwrap_err();
    refused(status, Code::PermissionDenied);
    // Nothing of the refused writes was stored.
    assert_eq!(node.stored(&tree), 0);
    let mut reading = node.client(reader()).await;
    let status = reading
        .get_node_by_path(&tree, &["d"], false)
        .await
        .unwrap_err();
    assert!(
        status.message().contains("not found"),
        "no tree yet: {status:?}"
    );
    // A container this node does not hold: "not found", nothing stored.
    let foreign = TreeKey::new(foreign_cid(), "version");
    let mut owning = node.client(owner()).await;
    let status = owning
        .add_by_path(&foreign, &["d"], &meta)
        .await
        .unwrap_err();
    assert!(status.message().contains("is denied by"), "{status:?}");
    let mut trusting = config();
    trusting
        .access
        .default
        .grant(Role::Owner, &owner().public().hex());
    drop(node);
    let node = start(trusting).await;
    let mut owning = node.client(owner()).await;
    let status = owning
        .add_by_path(&foreign, &["d"], &meta)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains("not found"), "{status:?}");
    assert_eq!(node.stored(&foreign), 0);
    // A container id of the wrong size.
    let mut short = body.clone();
    short.container_id = vec![1; 31];
    let request = owning.sign(short);
    let status = owning.raw().add_by_path(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // A message over `limits.max_message_bytes` is refused whole.
    let mut huge = body;
    huge.meta = arbor::grpc::client::proto_meta(&[kv("FileName", &"x".repeat(5 << 20))]);
    let target = Target {
        max_message_bytes: 64 << 20,
        ..Target::plaintext(&node.address)
    };
    let mut big = GrpcClient::connect(&target, owner()).await.unwrap();
    let request = big.sign(huge);
    let status = big.raw().add_by_path(request).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");
    assert_eq!(node.stored(&tree), 0);
    // Moving or removing the root is refused as invalid.
    let status = owning.remove(&tree, ROOT).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

#[tokio::test]
async fn a_parent_that_is_not_there_is_not_found() {
    let node = start(config()).await;
    let mut client = node.client(writer()).await;
    let tree = tree("system");
    client
        .add(&tree, ROOT, &[kv("FileName", "d")])
        .await
        .unwrap();
    let status = client
        .add(&tree, 424_242, &[kv("FileName", "x")])
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains("not found"), "{status:?}");
    assert_eq!(node.stored(&tree), 1);
}

#[tokio::test]
async fn replicas_apply_and_read_the_op_log_others_may_not() {
    let node = start(config()).await;
    let tree = tree("t");
    let mut replica = node.client(replica_two()).await;
    let op = |counter: u64, name: &str| pb::LogMove {
        parent_id: ROOT,
        meta: arbor::grpc::meta::encode(&Meta {
            time: make_timestamp(counter, 2),
            items: vec![kv("FileName", name)],
        }),
        child_id: make_timestamp(counter, 2),
    };
    for (counter, name) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
        let request = replica.sign(pb::apply_request::Body {
            container_id: cid().0.to_vec(),
            tree_id: "t".into(),
            operation: Some(op(counter, name)),
        });
        replica.raw().apply(request).await.unwrap();
    }
    assert_eq!(node.stored(&tree), 4);
    // The op log streams from a height, in pages of 3, up to `count`.
    let read_log = |height: u64, count: u64| pb::get_op_log_request::Body {
        container_id: cid().0.to_vec(),
        tree_id: "t".into(),
        height,
        count,
    };
    let request = replica.sign(read_log(1, 0));
    let mut stream = replica
        .raw()
        .get_op_log(request)
        .await
        .unwrap()
        .into_inner();
    let mut names = Vec::new();
    while let Some(item) = stream.next().await {
        let operation = item.unwrap().body.unwrap().operation.unwrap();
        let meta = arbor::grpc::meta::decode(&operation.meta).unwrap();
        assert_eq!(operation.child_id, meta.time);
        names.push(String::from_utf8(meta.items[0].value.clone()).unwrap());
    }
    assert_eq!(names, ["b", "c", "d"]);
    let request = replica.sign(read_log(0, 2));
    let stream = replica
        .raw()
        .get_op_log(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.count().await, 2);
    // An op stamped by another replica than the signer is refused.
    let mut forged = op(5, "e");
    let other = make_timestamp(5, 3);
    forged.child_id = other;
    forged.meta = arbor::grpc::meta::encode(&Meta {
        time: other,
        items: vec![],
    });
    let request = replica.sign(pb::apply_request::Body {
        container_id: cid().0.to_vec(),
        tree_id: "t".into(),
        operation: Some(forged),
    });
    let status = replica.raw().apply(request).await.unwrap_err();
    assert!(status.message().contains("is denied by"), "{status:?}");
    // Malformed meta is refused as invalid.
    let mut bad = op(6, "f");
    bad.meta = vec![0xFF, 1];
    let request = replica.sign(pb::apply_request::Body {
        container_id: cid().0.to_vec(),
        tree_id: "t".into(),
        operation: Some(bad),
    });
    let status = replica.raw().apply(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // Clients, even the owner, are no replicas.
    let mut owning = node.client(owner()).await;
    let request = owning.sign(pb::apply_request::Body {
        container_id: cid().0.to_vec(),
        tree_id: "t".into(),
        operation: Some(op(7, "g")),
    });
    let status = owning.raw().apply(request).await.unwrap_err();
    assert!(status.message().contains("is denied by"), "{status:?}");
    let request = owning.sign(read_log(0, 0));
    let status = owning.raw().get_op_log(request).await.unwrap_err();
    assert!(status.message().contains("is denied by"), "{status:?}");
    assert_eq!(node.stored(&tree), 4);
}

/// A body signed by a client that knows one root encodes `root_id` as a
/// plain integer; it must verify like the packed form.
#[tokio::test]
async fn a_subtree_request_signed_with_a_single_plain_root_is_accepted() {
    use prost::Message;
    #[derive(Clone, PartialEq, Message)]
    struct SingleRoot {
        #[prost(bytes = "vec", tag = "1")]
        container_id: Vec<u8>,
        #[prost(string, tag = "2")]
        tree_id: String,
        #[prost(uint64, tag = "3")]
        root_id: u64,
        #[prost(uint32, tag = "4")]
        depth: u32,
    }
    let node = start(config()).await;
    let mut client = node.client(writer()).await;
    let tree = tree("t");
    let dir = client
        .add(&tree, ROOT, &[kv("FileName", "d")])
        .await
        .unwrap();
    let single = SingleRoot {
        container_id: cid().0.to_vec(),
        tree_id: "t".into(),
        root_id: dir,
        depth: 1,
    };
    let bytes = single.encode_to_vec();
    let (key, sign) = writer().sign(&bytes);
    let body = pb::get_sub_tree_request::Body::decode(&bytes[..]).unwrap();
    assert_eq!(body.root_id, [dir]);
    assert_ne!(body.encode_to_vec(), bytes, "the list encodes packed");
    let request = pb::GetSubTreeRequest {
        body: Some(body),
        signature: Some(pb::Signature { key, sign }),
    };
    let stream = client
        .raw()
        .get_sub_tree(request)
        .await
        .unwrap()
        .into_inner();
    let nodes: Vec<_> = stream.collect().await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(
        nodes[0].as_ref().unwrap().body.as_ref().unwrap().node_id,
        dir
    );
}

/// With TLS the front presents the node's certificate; a client that
/// trusts the cluster's CA gets through, one that trusts another CA or
/// speaks plaintext does not.
#[tokio::test]
async fn the_front_over_tls() {
    use arbor::certs::{self, Validity};
    use arbor::tls::CertIdentity;
    let ca = certs::create_ca("arbor", Validity::days_from_now(1)).unwrap();
    let node_cert = certs::issue(
        &ca,
        &CertIdentity::Replica {
            cluster_id: "arbor".into(),
            replica_id: 1,
        },
        Validity::days_from_now(1),
    )
    .unwrap();
    let config = config();
    let net = Arc::new(LocalNet::default());
    let service = start_node(&net, config.clone(), memory_forest(&config));
    let acceptor =
        arbor::tls::grpc_acceptor(node_cert.cert_pem.as_bytes(), node_cert.key_pem.as_bytes())
            .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server =
        arbor::grpc::serve(&config, listener, Front::new(service), Some(acceptor)).unwrap();
    let address = server.local_addr.to_string();
    let trusting = Target {
        tls: Some(arbor::tls::grpc_client_config(ca.cert_pem.as_bytes()).unwrap()),
        ..Target::plaintext(&address)
    };
    let mut client = GrpcClient::connect(&trusting, writer()).await.unwrap();
    let tree = tree("t");
    client
        .add(&tree, ROOT, &[kv("FileName", "over-tls")])
        .await
        .unwrap();
    let found = client
        .get_node_by_path(&tree, &["over-tls"], false)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    let other_ca = certs::create_ca("arbor", Validity::days_from_now(1)).unwrap();
    let distrusting = Target {
        tls: Some(arbor::tls::grpc_client_config(other_ca.cert_pem.as_bytes()).unwrap()),
        ..Target::plaintext(&address)
    };
    assert!(GrpcClient::connect(&distrusting, writer()).await.is_err());
    // Plaintext HTTP/2 to a TLS port: the connection or the call fails.
    let plain = GrpcClient::connect(&Target::plaintext(&address), writer()).await;
    if let Ok(mut plain) = plain {
        assert!(plain.healthcheck().await.is_err());
    }
    assert!(server.handle().handshakes_failed() >= 1);
    server.shutdown().await;
}

/// A directory "big" under the root of `tree` with `children` children,
/// written straight to the forest; its id.
async fn fill_directory(
    service: &Service,
    client: &mut GrpcClient,
    tree: &TreeKey,
    children: usize,
) -> u64 {
    use arbor::forest::{WriteOp, WriteRequest};
    let dir = client
        .add(tree, ROOT, &[kv("FileName", "big")])
        .await
        .unwrap();
    let writes: Vec<WriteRequest> = (0..children)
        .map(|i| WriteRequest {
            tree: tree.clone(),
            op: WriteOp::Move {
                parent: dir,
                child: None,
                // Names in an order other than creation's.
                items: vec![kv("FileName", &format!("k{:05}", (i * 7919) % children))],
            },
        })
        .collect();
    for chunk in writes.chunks(500) {
        let outcomes = service.forest().write_batch(chunk).unwrap();
        assert!(outcomes.results.iter().all(|r| r.is_ok()));
    }
    dir
}

/// A GetSubTree stream of all of `dir` in tree "version", unread.
async fn subtree_stream(
    client: &mut GrpcClient,
    dir: u64,
) -> tonic::Streaming<pb::GetSubTreeResponse> {
    let request = client.sign(pb::get_sub_tree_request::Body {
        container_id: cid().0.to_vec(),
        tree_id: "version".into(),
        root_id: vec![dir],
        depth: 0,
        ..Default::default()
    });
    client
        .raw()
        .get_sub_tree(request)
        .await
        .unwrap()
        .into_inner()
}

/// Stopping the front answers the calls in flight whole, waits for them,
/// and then takes no connection: a subtree stream held up by its client's
/// flow control (the client reads nothing for a while) still streams to
/// its end after the stop, and the shutdown ends only after it has.
#[tokio::test]
async fn a_stop_answers_the_calls_in_flight() {
    let config = config();
    let net = Arc::new(LocalNet::default());
    let service = start_node(&net, config.clone(), memory_forest(&config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = arbor::grpc::serve(&config, listener, Front::new(service.clone()), None).unwrap();
    let address = server.local_addr.to_string();
    let mut client = GrpcClient::connect(&Target::plaintext(&address), writer())
        .await
        .unwrap();
    let tree = tree("version");
    // Far more than HTTP/2's initial stream window of 64 KiB: the front's
    // stream stops until the client reads.
    const CHILDREN: usize = 5000;
    let dir = fill_directory(&service, &mut client, &tree, CHILDREN).await;
    let mut stream = subtree_stream(&mut client, dir).await;
    let mut read = 0;
    for _ in 0..10 {
        stream.next().await.unwrap().unwrap();
        read += 1;
    }
    let mut shutting = tokio::spawn(server.shutdown());
    // Nothing reads the stream meanwhile, so a shutdown that waits for it
    // cannot end in this time; one that does not wait ends at once.
    let waited = tokio::time::timeout(std::time::Duration::from_millis(300), &mut shutting).await;
    assert!(waited.is_err(), "the shutdown ended with a stream unread");
    while let Some(node) = stream.next().await {
        node.expect("a stream in flight is answered whole after a stop");
        read += 1;
    }
    assert_eq!(read, CHILDREN + 1);
    tokio::time::timeout(std::time::Duration::from_secs(30), shutting)
        .await
        .expect("the shutdown ends once its last call is answered")
        .unwrap();
    let refused = match GrpcClient::connect(&Target::plaintext(&address), writer()).await {
        Err(_) => true,
        Ok(mut late) => late.healthcheck().await.is_err(),
    };
    assert!(refused, "a stopped front took a new call");
}

/// A directory far larger than a page streams whole, in name order, a page
/// at a time; a client that stops reading half-way leaves the node serving.
#[tokio::test]
async fn a_large_directory_streams_whole_in_pages() {
    let mut config = config();
    config.grpc.stream_page_nodes = 50;
    let node = start(config).await;
    let tree = tree("version");
    let mut client = node.client(writer()).await;
    const CHILDREN: usize = 3000;
    let dir = fill_directory(&node.service, &mut client, &tree, CHILDREN).await;
    let listed = client.get_subtree(&tree, dir, 2, true).await.unwrap();
    assert_eq!(listed.len(), CHILDREN + 1);
    let names = names(&listed[1..]);
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(names, sorted, "every child once, by name");
    // Read a few nodes of a stream, then drop it.
    let mut stream = subtree_stream(&mut client, dir).await;
    for _ in 0..10 {
        stream.next().await.unwrap().unwrap();
    }
    drop(stream);
    client.healthcheck().await.unwrap();
    let again = client.get_subtree(&tree, dir, 0, false).await.unwrap();
    assert_eq!(again.len(), CHILDREN + 1);
}
