//! Compiles `proto/tree.proto` (the gRPC tree service) with protox, a
//! protobuf compiler written in Rust, so a fresh machine needs no `protoc`.
//!
//! `arbor-engine-sim` (../engine-sim) builds the same sources with this same
//! script, so the .proto is found from the package's directory through
//! `../engine`, which names engine/ from either package.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto = manifest.join("../engine/proto");
    println!(
        "cargo:rerun-if-changed={}",
        proto.join("tree.proto").display()
    );
    let descriptors = protox::compile(["tree.proto"], [&proto])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
