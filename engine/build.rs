//! Compiles `proto/tree.proto` (the gRPC tree service) with protox, a
//! protobuf compiler written in Rust, so a fresh machine needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/tree.proto");
    let descriptors = protox::compile(["tree.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
