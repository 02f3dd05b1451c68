//! `arbor node --config FILE` runs one node of the tree service over TCP;
//! the other subcommands are a small client for trying it from a shell.

use arbor::config::Config;
use arbor::forest::Forest;
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::tcp::{self, Connection, TcpTransport};
use arbor::{ContainerId, KeyValue, NodeInfo, TreeKey, ATTR_FILE_NAME};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "arbor", about = "Arbor replicated tree service")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a node (RUST_LOG sets the log filter, e.g. RUST_LOG=info).
    Node {
        #[arg(long)]
        config: PathBuf,
    },
    /// Adds a node under PARENT; prints its id.
    Add {
        #[command(flatten)]
        tree: TreeArgs,
        #[arg(long, default_value_t = 0)]
        parent: u64,
        /// key=value, repeatable.
        #[arg(long = "meta")]
        meta: Vec<String>,
    },
    /// Adds a leaf at PATH (a/b/c), creating missing directories.
    AddByPath {
        #[command(flatten)]
        tree: TreeArgs,
        #[arg(long)]
        path: String,
        /// key=value, repeatable.
        #[arg(long = "meta")]
        meta: Vec<String>,
    },
    /// Prints the nodes at PATH (a/b/c) with all their attributes.
    GetByPath {
        #[command(flatten)]
        tree: TreeArgs,
        #[arg(long)]
        path: String,
        #[arg(long)]
        latest_only: bool,
    },
    /// Prints a subtree, parents before children.
    Subtree {
        #[command(flatten)]
        tree: TreeArgs,
        #[arg(long, default_value_t = 0)]
        root: u64,
        /// 0 = unlimited, 1 = the root alone.
        #[arg(long, default_value_t = 0)]
        depth: u32,
    },
    /// Lists the trees of a container.
    List {
        #[command(flatten)]
        server: ServerArgs,
        #[arg(long)]
        cid: String,
    },
    /// Checks that a node answers.
    Healthcheck {
        #[command(flatten)]
        server: ServerArgs,
    },
}

#[derive(Args)]
struct ServerArgs {
    /// HOST:PORT of a node.
    #[arg(long)]
    addr: String,
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[derive(Args)]
struct TreeArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Container id, 64 hex digits.
    #[arg(long)]
    cid: String,
    #[arg(long, default_value = "")]
    tree: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Node { config } => run_node(&config).await,
        command => run_client(command).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("arbor: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run_node(path: &std::path::Path) -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let config = Config::load(path).map_err(|e| e.to_string())?;
    if !config.tree.enabled {
        // The modelled system runs other services beside the tree; this
        // node has only the tree, so a disabled tree leaves nothing to run.
        eprintln!(
            "arbor: tree.enabled is false in {}: not serving",
            path.display()
        );
        return Ok(());
    }
    let db = &config.pilorama.path;
    if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let forest =
        Forest::open(db, config.forest_options()).map_err(|e| format!("{}: {e}", db.display()))?;
    let transport = Arc::new(TcpTransport::new(&config));
    let service = Service::start(
        config.clone(),
        Arc::new(forest),
        arbor::system::system_env(),
        transport,
    )
    .map_err(|e| e.to_string())?;
    let (address, server) = tcp::bind(&config, service)
        .await
        .map_err(|e| format!("listen on {}: {e}", config.node.listen))?;
    // Scripts and tests read this line to learn the bound port.
    println!(
        "arbor: replica {} listening on {address}",
        config.node.replica_id
    );
    tracing::info!(%address, replica = config.node.replica_id, "serving");
    server.await;
    Ok(())
}

async fn run_client(command: Command) -> Result<(), String> {
    let (server, request) = client_request(command)?;
    let mut connection = Connection::connect(&server.addr, server.timeout, usize::MAX >> 1)
        .await
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(server.timeout, connection.call(&request))
        .await
        .map_err(|_| "request timed out".to_string())?
        .map_err(|e| e.to_string())?;
    print_response(response)
}

fn client_request(command: Command) -> Result<(ServerArgs, Request), String> {
    Ok(match command {
        Command::Add { tree, parent, meta } => {
            let (server, tree) = tree.split()?;
            let items = parse_meta(&meta)?;
            (
                server,
                Request::Add {
                    tree,
                    parent,
                    items,
                },
            )
        }
        Command::AddByPath { tree, path, meta } => {
            let (server, tree) = tree.split()?;
            let items = parse_meta(&meta)?;
            let attr = ATTR_FILE_NAME.to_string();
            let path = split_path(&path);
            (
                server,
                Request::AddByPath {
                    tree,
                    attr,
                    path,
                    items,
                },
            )
        }
        Command::GetByPath {
            tree,
            path,
            latest_only,
        } => {
            let (server, tree) = tree.split()?;
            let request = Request::GetNodeByPath {
                tree,
                attr: ATTR_FILE_NAME.to_string(),
                path: split_path(&path),
                attributes: Vec::new(),
                latest_only,
                all_attributes: true,
            };
            (server, request)
        }
        Command::Subtree { tree, root, depth } => {
            let (server, tree) = tree.split()?;
            (server, Request::GetSubTree { tree, root, depth })
        }
        Command::List { server, cid } => (
            server,
            Request::TreeList {
                cid: parse_cid(&cid)?,
            },
        ),
        Command::Healthcheck { server } => (server, Request::Healthcheck),
        Command::Node { .. } => unreachable!("node is not a client command"),
    })
}

impl TreeArgs {
    fn split(self) -> Result<(ServerArgs, TreeKey), String> {
        let cid = parse_cid(&self.cid)?;
        Ok((self.server, TreeKey::new(cid, self.tree)))
    }
}

fn parse_cid(hex: &str) -> Result<ContainerId, String> {
    ContainerId::from_hex(hex).ok_or_else(|| format!("--cid {hex:?}: expected 64 hex digits"))
}

fn split_path(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

fn parse_meta(pairs: &[String]) -> Result<Vec<KeyValue>, String> {
    pairs
        .iter()
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("--meta {pair:?}: expected key=value"))?;
            Ok(KeyValue::new(key, value.as_bytes()))
        })
        .collect()
}

fn print_response(response: Response) -> Result<(), String> {
    match response {
        Response::Added { node } => println!("node {node}"),
        Response::AddedByPath { leaf, created } => {
            println!("leaf {leaf}");
            for dir in created {
                println!("created {dir}");
            }
        }
        Response::Done => println!("done"),
        Response::Nodes(nodes) => nodes.iter().for_each(print_node),
        Response::Trees(trees) => trees.iter().for_each(|t| println!("{t}")),
        Response::Applied { fresh } => println!("applied {fresh}"),
        Response::OpLog {
            entries,
            next_height,
        } => {
            println!("{} ops, next height {next_height}", entries.len())
        }
        Response::OpLogStamps {
            stamps,
            next_height,
        } => {
            println!("{} stamps, next height {next_height}", stamps.len())
        }
        Response::Health { replica_id } => println!("ok replica {replica_id}"),
        Response::Error(error) => return Err(error.to_string()),
    }
    Ok(())
}

fn print_node(node: &NodeInfo) {
    let items: Vec<String> = node
        .meta
        .items
        .iter()
        .map(|kv| format!("{}={}", kv.key, String::from_utf8_lossy(&kv.value)))
        .collect();
    println!(
        "{} parent={} ts={} {}",
        node.id,
        node.parent,
        node.meta.time,
        items.join(" ")
    );
}
