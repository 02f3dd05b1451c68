//! `arbor grpc ...`: the gRPC front from a shell, every request signed with
//! a key file (`arbor grpc keygen` makes one).

use arbor::grpc::client::{GrpcClient, Target};
use arbor::grpc::Signer;
use arbor::{ContainerId, TreeKey};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand)]
pub enum GrpcCommand {
    /// Writes a new P-256 signing key (PKCS#8 PEM) to OUT; prints its
    /// public key, the name `access:` gives this caller.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Prints the public key of a key file.
    PublicKey {
        #[arg(long)]
        key: PathBuf,
    },
    /// Adds a node under PARENT; prints its id.
    Add {
        #[command(flatten)]
        tree: GrpcTree,
        #[arg(long, default_value_t = 0)]
        parent: u64,
        /// key=value, repeatable.
        #[arg(long = "meta")]
        meta: Vec<String>,
    },
    /// Adds a leaf under the directories PATH (a/b; empty: the root).
    AddByPath {
        #[command(flatten)]
        tree: GrpcTree,
        #[arg(long, default_value = "")]
        path: String,
        /// key=value, repeatable.
        #[arg(long = "meta")]
        meta: Vec<String>,
    },
    /// Prints the nodes at PATH (a/b/c).
    GetByPath {
        #[command(flatten)]
        tree: GrpcTree,
        #[arg(long)]
        path: String,
        #[arg(long)]
        latest_only: bool,
    },
    /// Prints a subtree as it streams, parents before children.
    Subtree {
        #[command(flatten)]
        tree: GrpcTree,
        #[arg(long, default_value_t = 0)]
        root: u64,
        /// 0 = unlimited, 1 = the root alone.
        #[arg(long, default_value_t = 0)]
        depth: u32,
        /// Children by FileName instead of by id.
        #[arg(long)]
        by_name: bool,
    },
    /// Removes a node.
    Remove {
        #[command(flatten)]
        tree: GrpcTree,
        #[arg(long)]
        node: u64,
    },
    /// Lists the trees of a container.
    List {
        #[command(flatten)]
        front: Front,
        #[arg(long)]
        cid: String,
    },
    /// Checks that the front answers (unsigned).
    Healthcheck {
        #[command(flatten)]
        front: Front,
    },
}

#[derive(Args)]
pub struct Front {
    /// HOST:PORT of a node's gRPC front (grpc.listen).
    #[arg(long)]
    addr: String,
    /// The signing key (PEM).
    #[arg(long)]
    key: Option<PathBuf>,
    /// PEM of a CA: the call runs over TLS and the node's certificate
    /// must be signed by it.
    #[arg(long)]
    ca: Option<PathBuf>,
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[derive(Args)]
pub struct GrpcTree {
    #[command(flatten)]
    front: Front,
    /// Container id, 64 hex digits.
    #[arg(long)]
    cid: String,
    #[arg(long, default_value = "")]
    tree: String,
}

pub async fn run(command: GrpcCommand) -> Result<(), String> {
    match command {
        GrpcCommand::Keygen { out } => keygen(&out),
        GrpcCommand::PublicKey { key } => {
            println!("{}", read_key(&key)?.public().hex());
            Ok(())
        }
        command => {
            let timeout = front_of(&command).timeout;
            tokio::time::timeout(timeout, call(command))
                .await
                .map_err(|_| "request timed out".to_string())?
        }
    }
}

fn keygen(out: &std::path::Path) -> Result<(), String> {
    let mut secret = [0u8; 32];
    let signer = loop {
        getrandom(&mut secret)?;
        if let Some(signer) = Signer::from_secret(&secret) {
            break signer;
        }
    };
    if out.exists() {
        return Err(format!("{}: exists; not overwritten", out.display()));
    }
    std::fs::write(out, signer.to_pem()).map_err(|e| format!("{}: {e}", out.display()))?;
    println!("{}", signer.public().hex());
    Ok(())
}

/// 32 random bytes from the operating system.
fn getrandom(out: &mut [u8; 32]) -> Result<(), String> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(out))
        .map_err(|e| format!("/dev/urandom: {e}"))
}

fn read_key(path: &std::path::Path) -> Result<Signer, String> {
    let pem = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Signer::from_pem(&pem).map_err(|e| format!("{}: {e}", path.display()))
}

fn front_of(command: &GrpcCommand) -> &Front {
    match command {
        GrpcCommand::Add { tree, .. }
        | GrpcCommand::AddByPath { tree, .. }
        | GrpcCommand::GetByPath { tree, .. }
        | GrpcCommand::Subtree { tree, .. }
        | GrpcCommand::Remove { tree, .. } => &tree.front,
        GrpcCommand::List { front, .. } | GrpcCommand::Healthcheck { front } => front,
        GrpcCommand::Keygen { .. } | GrpcCommand::PublicKey { .. } => {
            unreachable!("no front for a local command")
        }
    }
}

impl Front {
    async fn connect(&self) -> Result<GrpcClient, String> {
        let signer = match &self.key {
            Some(path) => read_key(path)?,
            // Unsigned calls are refused but Healthcheck; any key does.
            None => Signer::from_seed(0),
        };
        let tls = match &self.ca {
            Some(ca) => {
                let pem = std::fs::read(ca).map_err(|e| format!("--ca {}: {e}", ca.display()))?;
                Some(arbor::tls::grpc_client_config(&pem).map_err(|e| format!("--{e}"))?)
            }
            None => None,
        };
        let target = Target {
            tls,
            connect_timeout: self.timeout,
            ..Target::plaintext(&self.addr)
        };
        GrpcClient::connect(&target, signer)
            .await
            .map_err(|e| e.to_string())
    }
}

impl GrpcTree {
    fn key(&self) -> Result<TreeKey, String> {
        Ok(TreeKey::new(cid(&self.cid)?, self.tree.clone()))
    }
}

fn cid(hex: &str) -> Result<ContainerId, String> {
    ContainerId::from_hex(hex).ok_or_else(|| format!("--cid {hex:?}: expected 64 hex digits"))
}

fn status(status: tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

async fn call(command: GrpcCommand) -> Result<(), String> {
    let mut client = front_of(&command).connect().await?;
    match command {
        GrpcCommand::Add { tree, parent, meta } => {
            let meta = super::parse_meta(&meta)?;
            let node = client
                .add(&tree.key()?, parent, &meta)
                .await
                .map_err(status)?;
            println!("node {node}");
        }
        GrpcCommand::AddByPath { tree, path, meta } => {
            let meta = super::parse_meta(&meta)?;
            let path = super::split_path(&path);
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            let (nodes, parent) = client
                .add_by_path(&tree.key()?, &path, &meta)
                .await
                .map_err(status)?;
            println!("leaf {} parent {parent}", nodes[0]);
            for dir in &nodes[1..] {
                println!("created {dir}");
            }
        }
        GrpcCommand::GetByPath {
            tree,
            path,
            latest_only,
        } => {
            let path = super::split_path(&path);
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            let nodes = client
                .get_node_by_path(&tree.key()?, &path, latest_only)
                .await
                .map_err(status)?;
            if nodes.is_empty() {
                return Err("not found".into());
            }
            nodes.iter().for_each(super::print_node);
        }
        GrpcCommand::Subtree {
            tree,
            root,
            depth,
            by_name,
        } => {
            let nodes = client
                .get_subtree(&tree.key()?, root, depth, by_name)
                .await
                .map_err(status)?;
            nodes.iter().for_each(super::print_node);
        }
        GrpcCommand::Remove { tree, node } => {
            client.remove(&tree.key()?, node).await.map_err(status)?;
            println!("done");
        }
        GrpcCommand::List { cid: hex, .. } => {
            let trees = client.tree_list(&cid(&hex)?).await.map_err(status)?;
            trees.iter().for_each(|t| println!("{t}"));
        }
        GrpcCommand::Healthcheck { .. } => {
            client.healthcheck().await.map_err(status)?;
            println!("ok");
        }
        GrpcCommand::Keygen { .. } | GrpcCommand::PublicKey { .. } => {
            unreachable!("handled without a connection")
        }
    }
    Ok(())
}
