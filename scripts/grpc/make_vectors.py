#!/usr/bin/env python3
"""Signature vectors for the gRPC front, made by implementations other than
Arbor's: Python's protobuf runtime encodes the request bodies (from
engine/proto/tree.proto, compiled with grpcio-tools) and the
`cryptography` package (OpenSSL) signs them with ECDSA P-256 over SHA-512.

Writes engine/tests/vectors/grpc_signatures.json, which
engine/tests/grpc_vectors.rs checks: every body must decode and encode back
to the same bytes in Arbor, every `valid` signature must verify and every
other one must not.

    pip install grpcio-tools cryptography
    python3 scripts/grpc/make_vectors.py

The keys are fixed, the signatures random (ECDSA draws a fresh nonce), so a
rerun writes other signatures over the same bodies; both sets are valid.
"""

import json
import os
import subprocess
import sys
import tempfile

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROTO_DIR = os.path.join(ROOT, "engine", "proto")
OUT = os.path.join(ROOT, "engine", "tests", "vectors", "grpc_signatures.json")
# The order of the P-256 group.
N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def compile_proto(out_dir):
    from grpc_tools import protoc

    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}", "tree.proto"]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out_dir)
    import tree_pb2

    return tree_pb2


def key(secret):
    return ec.derive_private_key(secret, ec.SECP256R1())


def compressed(private):
    return private.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint
    )


def sign(private, data):
    der = private.sign(data, ec.ECDSA(hashes.SHA512()))
    r, s = decode_dss_signature(der)
    return r, s


def wire(r, s):
    return b"\x04" + r.to_bytes(32, "big") + s.to_bytes(32, "big")


def verifies(private, data, r, s):
    try:
        private.public_key().verify(
            encode_dss_signature(r, s), data, ec.ECDSA(hashes.SHA512())
        )
        return True
    except Exception:
        return False


def bodies(pb):
    cid = bytes(range(32))
    kv = lambda k, v: pb.KeyValue(key=k, value=v)
    meta = [kv("FileName", b"photo.jpg"), kv("OID", b"\x01\x02"), kv("Size", b"42")]
    order = pb.GetSubTreeRequest.Body.Order(direction=1)
    return [
        ("Add", pb.AddRequest.Body(container_id=cid, tree_id="system", parent_id=7, meta=meta)),
        ("AddByPath", pb.AddByPathRequest.Body(container_id=cid, tree_id="version",
                                               path_attribute="FileName",
                                               path=["test", "only", "path", "1"], meta=meta)),
        ("AddByPath", pb.AddByPathRequest.Body(container_id=cid, tree_id="version", meta=meta,
                                               bearer_token=b"\xff" * 40)),
        ("Remove", pb.RemoveRequest.Body(container_id=cid, tree_id="t", node_id=2**63 + 5)),
        ("Move", pb.MoveRequest.Body(container_id=cid, tree_id="t", parent_id=1, node_id=2,
                                     meta=meta)),
        ("GetNodeByPath", pb.GetNodeByPathRequest.Body(container_id=cid, tree_id="version",
                                                       path=["a", "b"], attributes=["OID"],
                                                       latest_only=True)),
        ("GetSubTree", pb.GetSubTreeRequest.Body(container_id=cid, tree_id="version",
                                                 root_id=[5], depth=2, order_by=order)),
        ("GetSubTree", pb.GetSubTreeRequest.Body(container_id=cid, tree_id="version",
                                                 root_id=[1, 2, 3])),
        ("TreeList", pb.TreeListRequest.Body(container_id=cid)),
        ("Apply", pb.ApplyRequest.Body(container_id=cid, tree_id="t",
                                       operation=pb.LogMove(parent_id=0, meta=b"\x05\x00",
                                                            child_id=9))),
        ("GetOpLog", pb.GetOpLogRequest.Body(container_id=cid, tree_id="t", height=10, count=3)),
    ]


def main():
    with tempfile.TemporaryDirectory() as out_dir:
        pb = compile_proto(out_dir)
        signer = key(0x1F2E3D4C5B6A798897A6B5C4D3E2F1000102030405060708090A0B0C0D0E0F10)
        other = key(0x0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF)
        vectors = []
        for rpc, body in bodies(pb):
            data = body.SerializeToString(deterministic=True)
            r, s = sign(signer, data)
            assert verifies(signer, data, r, s)
            high_s = N - s
            # The same signature with s negated is valid too: ECDSA does not
            # fix the sign of s, and the service must not demand low s.
            assert verifies(signer, data, r, high_s)
            altered = bytearray(data)
            altered[-1] ^= 0x01
            cases = [
                ("valid", compressed(signer), wire(r, s), data),
                ("valid (other s)", compressed(signer), wire(r, high_s), data),
                ("invalid: other key", compressed(other), wire(r, s), data),
                ("invalid: body altered", compressed(signer), wire(r, s), bytes(altered)),
                ("invalid: r altered", compressed(signer), wire((r + 1) % N, s), data),
            ]
            for name, pub, sig, signed_data in cases:
                vectors.append({
                    "rpc": rpc,
                    "case": name,
                    "valid": name.startswith("valid"),
                    "body": signed_data.hex(),
                    "key": pub.hex(),
                    "sign": sig.hex(),
                })
        # An uncompressed key (65 bytes) is accepted as well.
        data = bodies(pb)[0][1].SerializeToString(deterministic=True)
        r, s = sign(signer, data)
        uncompressed = signer.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        vectors.append({"rpc": "Add", "case": "valid (uncompressed key)", "valid": True,
                        "body": data.hex(), "key": uncompressed.hex(), "sign": wire(r, s).hex()})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({
            "made_by": "scripts/grpc/make_vectors.py (Python protobuf + cryptography)",
            "vectors": vectors,
        }, f, indent=1)
        f.write("\n")
    print(f"{len(vectors)} vectors -> {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
