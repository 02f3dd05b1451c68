//! The gRPC front: the `tree.TreeService` that object-storage gateways and
//! tree loaders speak, on its own port (`grpc.listen`), beside the node's
//! own protocol (docs/grpc.md).
//!
//! `pb` is generated at build time from `engine/proto/tree.proto`; `sign`
//! checks request signatures; `meta` is the binary meta of `LogMove`;
//! `front` translates each call to the service's requests; `server`
//! listens (TLS or loopback plaintext) and bounds connections; `client` is
//! a signing client (tests, the load generator, the command line).

pub mod client;
mod comb;
mod front;
pub mod meta;
mod server;
pub mod sign;

/// The messages and the service of `tree.proto`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("tree");
}

pub use front::{status_of, Front};
pub use server::{listen, serve, tls_for, GrpcHandle, GrpcServer};
pub use sign::{looks_like_key, PublicKey, SignatureError, Signer, VariableTimeSigner, Verifier};
