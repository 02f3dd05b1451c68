//! The gRPC front's signature check against vectors another implementation
//! made (scripts/grpc/make_vectors.py: Python's protobuf runtime encodes the
//! bodies, OpenSSL through `cryptography` signs them).
//!
//! For each vector: a valid body decodes into Arbor's message and encodes
//! back to the very bytes that were signed (so what Arbor re-encodes is
//! what clients sign), and the signature verifies exactly when the vector
//! says it is valid.

use arbor::grpc::pb;
use arbor::grpc::sign;
use prost::Message;

#[derive(serde::Deserialize)]
struct Vectors {
    vectors: Vec<Vector>,
}

#[derive(serde::Deserialize)]
struct Vector {
    rpc: String,
    case: String,
    valid: bool,
    body: String,
    key: String,
    sign: String,
}

/// Decodes `bytes` as the body of `rpc` and encodes it again.
fn reencode(rpc: &str, bytes: &[u8]) -> Vec<u8> {
    fn again<M: Message + Default>(bytes: &[u8]) -> Vec<u8> {
        M::decode(bytes).expect("the body decodes").encode_to_vec()
    }
    match rpc {
        "Add" => again::<pb::add_request::Body>(bytes),
        "AddByPath" => again::<pb::add_by_path_request::Body>(bytes),
        "Remove" => again::<pb::remove_request::Body>(bytes),
        "Move" => again::<pb::move_request::Body>(bytes),
        "GetNodeByPath" => again::<pb::get_node_by_path_request::Body>(bytes),
        "GetSubTree" => again::<pb::get_sub_tree_request::Body>(bytes),
        "TreeList" => again::<pb::tree_list_request::Body>(bytes),
        "Apply" => again::<pb::apply_request::Body>(bytes),
        "GetOpLog" => again::<pb::get_op_log_request::Body>(bytes),
        other => panic!("no body type for {other}"),
    }
}

#[test]
fn signatures_made_elsewhere_verify_exactly_when_valid() {
    let text = include_str!("vectors/grpc_signatures.json");
    let vectors: Vectors = serde_json::from_str(text).unwrap();
    let mut valid = 0;
    let mut invalid = 0;
    let mut rpcs = std::collections::BTreeSet::new();
    for v in &vectors.vectors {
        let body = hex::decode(&v.body).unwrap();
        let key = hex::decode(&v.key).unwrap();
        let signature = hex::decode(&v.sign).unwrap();
        if v.valid {
            assert_eq!(
                reencode(&v.rpc, &body),
                body,
                "{} {}: Arbor's encoding differs from the signed one",
                v.rpc,
                v.case
            );
        }
        let verdict = sign::verify(&key, &signature, &body);
        assert_eq!(
            verdict.is_ok(),
            v.valid,
            "{} {}: {verdict:?}",
            v.rpc,
            v.case
        );
        if v.valid {
            valid += 1;
            // The caller is named by the compressed key, whichever form came.
            let named = verdict.unwrap().hex();
            assert_eq!(named.len(), 66);
            assert!(v.key.starts_with(&named[..2]) || v.key.len() == 130);
        } else {
            invalid += 1;
        }
        rpcs.insert(v.rpc.clone());
    }
    assert!(
        valid >= 20 && invalid >= 30,
        "{valid} valid, {invalid} invalid"
    );
    assert_eq!(rpcs.len(), 9, "every signed call has vectors: {rpcs:?}");
}
