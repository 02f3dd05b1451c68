#!/usr/bin/env python3
"""Checks a node's gRPC front from outside Arbor: stubs that grpcio-tools
generates from engine/proto/tree.proto, request signatures made with the
`cryptography` package, a node started from the `arbor` binary.

    pip install grpcio grpcio-tools cryptography
    cargo build -p arbor-engine --bin arbor
    python3 scripts/grpc/check_client.py [--arbor target/debug/arbor]

Exits non-zero on the first answer that differs from what a gateway
expects; prints one line per check.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import grpc
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CID = bytes([0xAB] * 32)


def compile_proto(out_dir):
    from grpc_tools import protoc

    proto_dir = os.path.join(ROOT, "engine", "proto")
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", "tree.proto"]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out_dir)
    import tree_pb2
    import tree_pb2_grpc

    return tree_pb2, tree_pb2_grpc


class Key:
    def __init__(self):
        self.private = ec.generate_private_key(ec.SECP256R1())
        self.public = self.private.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)

    def sign(self, pb, request):
        data = request.body.SerializeToString(deterministic=True)
        r, s = decode_dss_signature(self.private.sign(data, ec.ECDSA(hashes.SHA512())))
        request.signature.CopyFrom(pb.Signature(
            key=self.public, sign=b"\x04" + r.to_bytes(32, "big") + s.to_bytes(32, "big")))
        return request


def check(what, condition):
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        sys.exit(1)


def refused(call, code, text):
    try:
        call()
    except grpc.RpcError as e:
        return e.code() == code and text in e.details()
    return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arbor", default=os.path.join(ROOT, "target", "debug", "arbor"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        pb, pb_grpc = compile_proto(work)
        writer, stranger = Key(), Key()
        config = os.path.join(work, "node.yaml")
        with open(config, "w") as f:
            f.write(f"""node:
  replica_id: 1
  listen: 127.0.0.1:0
grpc:
  listen: 127.0.0.1:0
  stream_page_nodes: 4
pilorama:
  path: {work}/tree.db
access:
  default:
    writers: ["{writer.public.hex()}"]
""")
        node = subprocess.Popen([args.arbor, "node", "--config", config],
                                stdout=subprocess.PIPE, text=True)
        try:
            address = None
            for line in node.stdout:
                found = re.search(r"gRPC on (\S+)", line)
                if found:
                    address = found.group(1)
                    break
            check("the node prints its gRPC address", address is not None)
            run(pb, pb_grpc, address, writer, stranger)
        finally:
            node.terminate()
            node.wait(timeout=30)


def run(pb, pb_grpc, address, writer, stranger):
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.TreeServiceStub(channel)
    grpc.channel_ready_future(channel).result(timeout=10)
    stub.Healthcheck(pb.HealthcheckRequest())
    check("Healthcheck answers unsigned", True)

    meta = lambda **kv: [pb.KeyValue(key=k, value=v.encode()) for k, v in kv.items()]
    add = lambda key, path, **kv: stub.AddByPath(key.sign(pb, pb.AddByPathRequest(
        body=pb.AddByPathRequest.Body(container_id=CID, tree_id="version", path=path,
                                      meta=meta(**kv)))))
    top = add(writer, [], FileName="top.txt", OID="1")
    check("AddByPath with an empty path adds under the root",
          len(top.body.nodes) == 1 and top.body.parent_id == 0)
    deep = add(writer, ["photos", "2024"], FileName="beach.jpg", OID="2")
    check("AddByPath answers the leaf, then the directories it made",
          len(deep.body.nodes) == 3 and deep.body.parent_id == deep.body.nodes[2])
    again = add(writer, ["photos", "2024"], FileName="beach.jpg", OID="3")
    check("a second version reuses the directories", len(again.body.nodes) == 1)

    lookup = lambda path, latest, attrs=(), all_attrs=True: stub.GetNodeByPath(writer.sign(
        pb, pb.GetNodeByPathRequest(body=pb.GetNodeByPathRequest.Body(
            container_id=CID, tree_id="version", path=path, latest_only=latest,
            attributes=list(attrs), all_attributes=all_attrs)))).body.nodes
    versions = lookup(["photos", "2024", "beach.jpg"], False)
    check("GetNodeByPath answers every version", len(versions) == 2)
    latest = lookup(["photos", "2024", "beach.jpg"], True, ["OID"], False)
    check("latest_only answers the newest, filtered to the attributes asked",
          len(latest) == 1 and [(kv.key, kv.value) for kv in latest[0].meta] == [("OID", b"3")])

    for i in range(10):
        add(writer, ["many"], FileName=f"f{9 - i}")
    subtree = lambda root, depth, asc: list(stub.GetSubTree(writer.sign(pb, pb.GetSubTreeRequest(
        body=pb.GetSubTreeRequest.Body(
            container_id=CID, tree_id="version", root_id=[root], depth=depth,
            order_by=pb.GetSubTreeRequest.Body.Order(direction=1 if asc else 0))))))
    everything = subtree(0, 0, False)
    check("GetSubTree streams the whole tree in pages", len(everything) == 17)
    many = lookup(["many"], False)[0].node_id
    children = subtree(many, 2, True)
    names = [next(kv.value for kv in n.body.meta if kv.key == "FileName") for n in children]
    check("GetSubTree with order_by Asc lists children by FileName",
          names == [b"many"] + [f"f{i}".encode() for i in range(10)])
    check("TreeList", list(stub.TreeList(writer.sign(pb, pb.TreeListRequest(
        body=pb.TreeListRequest.Body(container_id=CID)))).body.ids) == ["version"])

    check("a write signed by a key without rights is 'denied by'",
          refused(lambda: add(stranger, ["x"], FileName="y"), grpc.StatusCode.PERMISSION_DENIED,
                  "is denied by"))
    unsigned = pb.AddByPathRequest(body=pb.AddByPathRequest.Body(
        container_id=CID, tree_id="version", meta=meta(FileName="z")))
    check("an unsigned write is 'denied by' the signature check",
          refused(lambda: stub.AddByPath(unsigned), grpc.StatusCode.UNAUTHENTICATED,
                  "is denied by"))
    tampered = writer.sign(pb, pb.AddByPathRequest(body=pb.AddByPathRequest.Body(
        container_id=CID, tree_id="version", meta=meta(FileName="z"))))
    tampered.body.tree_id = "other"
    check("a body changed after signing is refused",
          refused(lambda: stub.AddByPath(tampered), grpc.StatusCode.UNAUTHENTICATED,
                  "is denied by"))
    check("nothing refused was stored",
          len(lookup(["x", "y"], False)) == 0 and len(lookup(["z"], False)) == 0)
    missing = lambda: stub.GetSubTree(writer.sign(pb, pb.GetSubTreeRequest(
        body=pb.GetSubTreeRequest.Body(container_id=CID, tree_id="nope")))).next()
    check("an unknown tree is 'not found'",
          refused(missing, grpc.StatusCode.NOT_FOUND, "not found"))
    removed = stub.Remove(writer.sign(pb, pb.RemoveRequest(body=pb.RemoveRequest.Body(
        container_id=CID, tree_id="version", node_id=999999))))
    check("Remove of an absent node succeeds", removed is not None)


if __name__ == "__main__":
    main()
