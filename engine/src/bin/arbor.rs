//! `arbor node --config FILE` runs one node of the tree service over TCP
//! (mutual TLS when configured); `arbor certs` makes development
//! certificates; the other subcommands are a small client for trying it
//! from a shell.

use arbor::certs::{self, Validity};
use arbor::config::{Config, DEFAULT_CLUSTER_ID};
use arbor::forest::{Forest, ListCursor, ListOrder};
use arbor::grpc;
use arbor::proto::{Request, Response};
use arbor::service::Service;
use arbor::tcp::{self, Connection, Dialer, Server, ServerOptions, TcpTransport};
use arbor::tls::{CertIdentity, PemFiles, TlsContext};
use arbor::{ContainerId, KeyValue, NodeInfo, ReplicaId, TreeKey, ATTR_FILE_NAME};
use clap::{Args, Parser, Subcommand};
use std::io::{IsTerminal, Write};

#[path = "arbor_cli/grpc.rs"]
mod grpc_cli;
use std::path::{Path, PathBuf};
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
    /// Lists a directory's children, page by page (ListChildren), or with
    /// --recursive its whole subtree in pre-order (GetSubTreePage),
    /// following each page's continuation to the end.
    Ls {
        #[command(flatten)]
        tree: TreeArgs,
        /// The directory by path (a/b/c); the tree's root when empty.
        #[arg(long, conflicts_with = "parent")]
        path: Option<String>,
        /// The directory by node id.
        #[arg(long)]
        parent: Option<u64>,
        #[arg(long, value_enum, default_value_t = OrderArg::Name)]
        order: OrderArg,
        /// Nodes per page (the node caps it at limits.max_list_page_nodes).
        #[arg(long, default_value_t = 1000)]
        page: u32,
        /// The whole subtree, the directory first, parents before children.
        #[arg(long)]
        recursive: bool,
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
        /// Tries again until the node answers, for at most this long (a
        /// script waiting for a node it just started).
        #[arg(long, value_parser = humantime::parse_duration)]
        wait: Option<Duration>,
    },
    /// Says, per container, whether the replica at --addr can leave it:
    /// every op it stamped there is held by every remaining member, and
    /// every op it holds there by one of them. Exits 0 only when every
    /// container is drained.
    Drain {
        /// The leaving replica.
        #[command(flatten)]
        server: ServerArgs,
        /// Container id (64 hex digits), repeatable.
        #[arg(long = "cid", required = true)]
        cids: Vec<String>,
        /// HOST:PORT of a replica that stays, repeatable.
        #[arg(long = "member", required = true)]
        members: Vec<String>,
    },
    /// Makes development certificates (a cluster CA, nodes, clients).
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Calls a node's gRPC front (tree.TreeService), signing each request.
    #[command(subcommand)]
    Grpc(grpc_cli::GrpcCommand),
}

/// The order of `arbor ls`.
#[derive(Clone, Copy, clap::ValueEnum)]
enum OrderArg {
    /// By name (nodes without a FileName first), then id.
    Name,
    /// By id.
    Id,
}

impl From<OrderArg> for ListOrder {
    fn from(order: OrderArg) -> Self {
        match order {
            OrderArg::Name => ListOrder::Name,
            OrderArg::Id => ListOrder::Id,
        }
    }
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Creates DIR/ca.crt and DIR/ca.key.
    #[command(name = "create-ca")]
    Ca {
        #[command(flatten)]
        common: CertArgs,
    },
    /// Creates DIR/node-ID.crt and .key naming arbor://CLUSTER/replica/ID,
    /// signed by the CA in DIR.
    #[command(name = "create-node")]
    Node {
        #[command(flatten)]
        common: CertArgs,
        #[arg(long)]
        replica_id: ReplicaId,
    },
    /// Creates DIR/client-NAME.crt and .key naming
    /// arbor://CLUSTER/client/NAME, signed by the CA in DIR.
    #[command(name = "create-client")]
    Client {
        #[command(flatten)]
        common: CertArgs,
        #[arg(long)]
        name: String,
    },
}

#[derive(Args)]
struct CertArgs {
    /// Directory of the certificates (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// The cluster the certificates belong to (node.cluster_id).
    #[arg(long, default_value = DEFAULT_CLUSTER_ID)]
    cluster_id: String,
    /// Validity from now, in days.
    #[arg(long, default_value_t = 365)]
    valid_days: u32,
}

#[derive(Args)]
struct ServerArgs {
    /// HOST:PORT of a node.
    #[arg(long)]
    addr: String,
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// PEM of the cluster CA: with --cert and --key, the call runs over
    /// mutual TLS as the client the certificate names.
    #[arg(long, requires_all = ["cert", "key"])]
    ca: Option<PathBuf>,
    #[arg(long, requires_all = ["ca", "key"])]
    cert: Option<PathBuf>,
    #[arg(long, requires_all = ["ca", "cert"])]
    key: Option<PathBuf>,
    /// Refuse the node unless it is this replica.
    #[arg(long)]
    replica: Option<ReplicaId>,
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
        Command::Certs(command) => run_certs(command),
        Command::Grpc(command) => grpc_cli::run(command).await,
        Command::Ls {
            tree,
            path,
            parent,
            order,
            page,
            recursive,
        } => {
            let listing = Listing {
                path,
                parent,
                order: order.into(),
                page,
                recursive,
            };
            run_ls(tree, listing).await
        }
        Command::Drain {
            server,
            cids,
            members,
        } => run_drain(server, cids, members).await,
        Command::Healthcheck {
            server,
            wait: Some(wait),
        } => run_healthcheck_until(server, wait).await,
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

async fn run_node(path: &Path) -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
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
    // Everything is checked before the first file is created: what
    // plaintext cannot enforce, the TLS files and their dates, the
    // database path, and the listen addresses (bound first).
    if let Some(warning) = config.plaintext_access().map_err(|e| e.to_string())? {
        tracing::warn!("{warning}");
    }
    let tls = TlsContext::for_node(&config).map_err(|e| e.to_string())?;
    let grpc_tls = grpc::tls_for(&config).map_err(|e| e.to_string())?;
    let (certificates, expiring) =
        arbor::tls::check_own_certificates(&config, tls.as_deref(), std::time::SystemTime::now())
            .map_err(|e| e.to_string())?;
    for warning in expiring {
        tracing::warn!("{warning}");
    }
    let db = &config.pilorama.path;
    check_db_path(db)?;
    let listener = tcp::listen(&config, tls.is_some())
        .await
        .map_err(|e| e.to_string())?;
    let grpc_listener = grpc::listen(&config, grpc_tls.is_some())
        .await
        .map_err(|e| e.to_string())?;
    let metrics_listener = arbor::metrics::listen(&config)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(dir) = db.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("pilorama.path: {}: {e}", dir.display()))?;
    }
    let forest = Forest::open(db, config.forest_options())
        .map_err(|e| format!("pilorama.path: {}: {e}", db.display()))?;
    let transport = Arc::new(TcpTransport::new(&config, tls.clone()));
    let service = Service::start(
        config.clone(),
        Arc::new(forest),
        arbor::system::system_env(),
        transport,
    )
    .map_err(|e| e.to_string())?;
    let server = Server::new(
        listener,
        service.clone(),
        ServerOptions::from_config(&config),
        tls,
    );
    let address = server.local_addr().map_err(|e| e.to_string())?;
    let stop = StopSignal::install()?;
    let handle = server.handle();
    let grpc = match grpc_listener {
        Some(listener) => {
            let front = grpc::Front::new(service.clone());
            let grpc = grpc::serve(&config, listener, front, grpc_tls)
                .map_err(|e| format!("grpc.listen: {e}"))?;
            Some(grpc)
        }
        None => None,
    };
    // Scripts and tests read these lines to learn the bound ports. They
    // are all out before the node's own port serves (connections wait in
    // its backlog meanwhile): once a Healthcheck is answered, a script
    // finds them.
    println!(
        "arbor: replica {} listening on {address}",
        config.node.replica_id
    );
    if let Some(grpc) = &grpc {
        println!(
            "arbor: replica {} gRPC on {}",
            config.node.replica_id, grpc.local_addr
        );
    }
    if let Some(listener) = metrics_listener {
        let metrics_address = listener.local_addr().map_err(|e| e.to_string())?;
        let sources = arbor::metrics::Sources {
            service: service.clone(),
            tcp: handle.clone(),
            grpc: grpc.as_ref().map(|grpc| grpc.handle()),
            certificates,
        };
        let registry = Arc::new(arbor::metrics::registry(sources));
        let timeout = config.limits.handshake_timeout;
        tokio::spawn(arbor::metrics::serve(listener, registry, timeout));
        println!(
            "arbor: replica {} metrics on http://{metrics_address}/metrics",
            config.node.replica_id
        );
    }
    tokio::spawn(server.run());
    tracing::info!(%address, replica = config.node.replica_id, "serving");
    let signal = stop.wait().await;
    tracing::info!(signal, "stopping");
    if let Some(grpc) = &grpc {
        grpc.handle().stop();
    }
    let stopped = stop_gracefully(&config, &service, &handle).await;
    if let Some(grpc) = grpc {
        // A client that stops reading a stream would hold the stop forever.
        let grace = stop_grace(&config);
        if tokio::time::timeout(grace, grpc.shutdown()).await.is_err() {
            tracing::warn!(
                ?grace,
                "gRPC calls still in flight after the grace; dropped"
            );
        }
    }
    stopped
}

/// How long a stop may wait for what is in flight.
fn stop_grace(config: &Config) -> Duration {
    (config.tree.replication_timeout * 4).max(Duration::from_secs(10))
}

/// Stops taking connections, lets busy ones answer, commits every queued
/// write and persists the replication cursors; bounded in time.
async fn stop_gracefully(
    config: &Config,
    service: &Service,
    handle: &tcp::ServerHandle,
) -> Result<(), String> {
    let grace = stop_grace(config);
    handle.stop();
    let stop = async {
        let report = service.shutdown_gracefully().await;
        handle.closed().await;
        report
    };
    match tokio::time::timeout(grace, stop).await {
        Ok(Ok(report)) => {
            tracing::info!(cursors = report.cursors_persisted, "stopped");
            Ok(())
        }
        Ok(Err(error)) => Err(format!("stopping: {error}")),
        Err(_) => Err(format!("stopping took longer than {grace:?}")),
    }
}

/// SIGTERM or SIGINT, installed before the node says it serves.
struct StopSignal {
    term: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignal {
    fn install() -> Result<Self, String> {
        use tokio::signal::unix::{signal, SignalKind};
        let install = |kind| signal(kind).map_err(|e| format!("signal handler: {e}"));
        Ok(Self {
            term: install(SignalKind::terminate())?,
            interrupt: install(SignalKind::interrupt())?,
        })
    }

    async fn wait(mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}

/// The database path must be a file, in a directory that is or can be
/// made: found out before the listener is bound or anything is created.
fn check_db_path(db: &Path) -> Result<(), String> {
    let bad = |path: &Path, why: &str| Err(format!("pilorama.path: {}: {why}", path.display()));
    if db.is_dir() {
        return bad(db, "is a directory");
    }
    let mut ancestor = db.parent();
    while let Some(dir) = ancestor.filter(|d| !d.as_os_str().is_empty()) {
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => return Ok(()),
            Ok(_) => return bad(dir, "is not a directory"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ancestor = dir.parent(),
            Err(e) => return bad(dir, &e.to_string()),
        }
    }
    Ok(())
}

fn run_certs(command: CertsCommand) -> Result<(), String> {
    let written = match command {
        CertsCommand::Ca { common } => {
            let validity = Validity::days_from_now(common.valid_days);
            certs::write_ca(&common.dir, &common.cluster_id, validity)
        }
        CertsCommand::Node { common, replica_id } => {
            let identity = CertIdentity::Replica {
                cluster_id: common.cluster_id.clone(),
                replica_id,
            };
            certs::write_issued(
                &common.dir,
                &identity,
                Validity::days_from_now(common.valid_days),
            )
        }
        CertsCommand::Client { common, name } => {
            let identity = CertIdentity::Client {
                cluster_id: common.cluster_id.clone(),
                name,
            };
            certs::write_issued(
                &common.dir,
                &identity,
                Validity::days_from_now(common.valid_days),
            )
        }
    };
    let path = written.map_err(|e| e.to_string())?;
    println!("{}", path.display());
    Ok(())
}

async fn run_client(command: Command) -> Result<(), String> {
    let (server, request) = client_request(command)?;
    let dialer = server.dialer()?;
    let call = async {
        let mut connection = Connection::open(&server.addr, server.replica, &dialer).await?;
        connection.call(&request).await
    };
    let response = tokio::time::timeout(server.timeout, call)
        .await
        .map_err(|_| "request timed out".to_string())?
        .map_err(|e| e.to_string())?;
    // A path that names no node is an error for a script, not an empty
    // answer.
    if let (Request::GetNodeByPath { path, .. }, Response::Nodes(nodes)) = (&request, &response) {
        if nodes.is_empty() {
            return Err(format!("{}: not found", path.join("/")));
        }
    }
    print_response(response)
}

/// `arbor drain`: reads what the leaver and each remaining member hold in
/// each container and prints `arbor::drain::judge`'s answer per container.
async fn run_drain(
    server: ServerArgs,
    cids: Vec<String>,
    members: Vec<String>,
) -> Result<(), String> {
    let cids = cids
        .iter()
        .map(|hex| parse_cid(hex))
        .collect::<Result<Vec<_>, _>>()?;
    let dialer = server.dialer()?;
    let timeout = server.timeout;
    let open = |address: String, expect: Option<ReplicaId>| {
        let dialer = dialer.clone();
        async move {
            let open = Connection::open(&address, expect, &dialer);
            let mut connection = tokio::time::timeout(timeout, open)
                .await
                .map_err(|_| format!("{address}: connecting timed out"))?
                .map_err(|e| format!("{address}: {e}"))?;
            let health = tokio::time::timeout(timeout, connection.call(&Request::Healthcheck))
                .await
                .map_err(|_| format!("{address}: Healthcheck timed out"))?
                .map_err(|e| format!("{address}: {e}"))?;
            match health {
                Response::Health { replica_id, .. } => Ok((address, replica_id, connection)),
                Response::Error(error) => Err(format!("{address}: {error}")),
                other => Err(format!("{address}: unexpected answer {other:?}")),
            }
        }
    };
    let (leaver_address, leaver, mut leaver_connection) =
        open(server.addr.clone(), server.replica).await?;
    let mut stay = Vec::new();
    for address in members {
        let (address, replica, connection) = open(address, None).await?;
        if replica == leaver {
            return Err(format!(
                "{address} is replica {leaver}, the leaving one ({leaver_address})"
            ));
        }
        stay.push((address, replica, connection));
    }
    let mut all_drained = true;
    for cid in cids {
        let held = held_ops(&leaver_address, &mut leaver_connection, cid, timeout).await?;
        let mut remaining = Vec::new();
        for (address, replica, connection) in &mut stay {
            remaining.push((*replica, held_ops(address, connection, cid, timeout).await?));
        }
        let report = arbor::drain::judge(cid, leaver, &held, &remaining);
        println!("{report}");
        all_drained &= report.done();
    }
    if all_drained {
        Ok(())
    } else {
        Err(format!(
            "replica {leaver} is not drained: do not take it out of the containers yet"
        ))
    }
}

/// What the replica at `address` holds in `cid`, each call answered
/// within `timeout`.
async fn held_ops(
    address: &str,
    connection: &mut Connection,
    cid: ContainerId,
    timeout: Duration,
) -> Result<arbor::drain::HeldOps, String> {
    arbor::drain::held_ops(connection, cid, timeout)
        .await
        .map_err(|e| format!("{address}: {e}"))
}

/// `arbor healthcheck --wait`: calls until the node answers `Health` or
/// `wait` has passed, a tenth of a second between tries.
async fn run_healthcheck_until(server: ServerArgs, wait: Duration) -> Result<(), String> {
    let dialer = server.dialer()?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let call = async {
            let mut connection = Connection::open(&server.addr, server.replica, &dialer).await?;
            connection.call(&Request::Healthcheck).await
        };
        let error = match tokio::time::timeout(server.timeout, call).await {
            Ok(Ok(response @ Response::Health { .. })) => return print_response(response),
            Ok(Ok(Response::Error(error))) | Ok(Err(error)) => error.to_string(),
            Ok(Ok(other)) => format!("unexpected answer {other:?}"),
            Err(_) => "request timed out".to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "{}: no answer within {}: {error}",
                server.addr,
                humantime::format_duration(wait)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What `arbor ls` lists.
struct Listing {
    path: Option<String>,
    parent: Option<u64>,
    order: ListOrder,
    page: u32,
    recursive: bool,
}

/// Prints every page of a listing on one connection, each call within
/// the timeout.
async fn run_ls(tree: TreeArgs, listing: Listing) -> Result<(), String> {
    let (server, tree) = tree.split()?;
    let dialer = server.dialer()?;
    let timeout = server.timeout;
    let open = Connection::open(&server.addr, server.replica, &dialer);
    let mut connection = tokio::time::timeout(timeout, open)
        .await
        .map_err(|_| "connecting timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let mut call = async |request: Request| {
        tokio::time::timeout(timeout, connection.call(&request))
            .await
            .map_err(|_| "request timed out".to_string())?
            .map_err(|e| e.to_string())
    };
    let parent = match (&listing.path, listing.parent) {
        (Some(path), _) if !split_path(path).is_empty() => {
            let lookup = Request::GetNodeByPath {
                tree: tree.clone(),
                attr: ATTR_FILE_NAME.to_string(),
                path: split_path(path),
                attributes: Vec::new(),
                latest_only: false,
                all_attributes: true,
            };
            match call(lookup).await? {
                // The directory path lookups take: the smallest id.
                Response::Nodes(nodes) => nodes
                    .iter()
                    .filter(|n| n.meta.is_internal())
                    .map(|n| n.id)
                    .min()
                    .ok_or_else(|| format!("--path {path:?}: no directory there"))?,
                Response::Error(error) => return Err(error.to_string()),
                other => return Err(format!("unexpected answer {other:?}")),
            }
        }
        (_, parent) => parent.unwrap_or(arbor::ROOT),
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut after: Option<ListCursor> = None;
    loop {
        let request = if listing.recursive {
            Request::GetSubTreePage {
                tree: tree.clone(),
                root: parent,
                depth: 0,
                order: listing.order,
                after: after.take(),
                limit: listing.page,
            }
        } else {
            Request::ListChildren {
                tree: tree.clone(),
                parent,
                order: listing.order,
                after: after.take(),
                limit: listing.page,
            }
        };
        match call(request).await? {
            Response::Page { nodes, next } => {
                for node in &nodes {
                    writeln!(out, "{}", node_line(node)).map_err(|e| e.to_string())?;
                }
                match next {
                    Some(cursor) => after = Some(cursor),
                    None => break,
                }
            }
            Response::Error(error) => return Err(error.to_string()),
            other => return Err(format!("unexpected answer {other:?}")),
        }
    }
    out.flush().map_err(|e| e.to_string())
}

impl ServerArgs {
    /// Plaintext without certificates; mutual TLS, with `Hello`, as the
    /// client the certificate names otherwise.
    fn dialer(&self) -> Result<Dialer, String> {
        let mut dialer = Dialer::plaintext(self.timeout, usize::MAX >> 1);
        let (Some(ca), Some(cert), Some(key)) = (&self.ca, &self.cert, &self.key) else {
            return Ok(dialer);
        };
        let read = |flag: &str, path: &Path| {
            std::fs::read(path).map_err(|e| format!("--{flag} {}: {e}", path.display()))
        };
        let (ca, cert, key) = (read("ca", ca)?, read("cert", cert)?, read("key", key)?);
        let pem = PemFiles {
            ca: &ca,
            cert: &cert,
            key: &key,
        };
        let tls = TlsContext::from_pem(&pem).map_err(|e| format!("--{e}"))?;
        dialer.cluster_id = tls.identity().cluster_id().to_string();
        dialer.tls = Some(Arc::new(tls));
        dialer.hello = true;
        Ok(dialer)
    }
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
        Command::Healthcheck { server, .. } => (server, Request::Healthcheck),
        Command::Node { .. }
        | Command::Certs(_)
        | Command::Grpc(_)
        | Command::Ls { .. }
        | Command::Drain { .. } => {
            unreachable!("not a client command")
        }
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
        Response::AddedByPath { leaf, created, .. } => {
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
            first_height,
        } => {
            println!(
                "{} stamps, next height {next_height}, first height {first_height}",
                stamps.len()
            )
        }
        Response::Health { replica_id, .. } => println!("ok replica {replica_id}"),
        Response::Hello {
            cluster_id,
            replica_id,
        } => println!("replica {replica_id} of cluster {cluster_id}"),
        Response::Page { nodes, next } => {
            nodes.iter().for_each(print_node);
            if next.is_some() {
                println!("(more)");
            }
        }
        Response::Error(error) => return Err(error.to_string()),
    }
    Ok(())
}

fn print_node(node: &NodeInfo) {
    println!("{}", node_line(node));
}

fn node_line(node: &NodeInfo) -> String {
    let items: Vec<String> = node
        .meta
        .items
        .iter()
        .map(|kv| format!("{}={}", kv.key, String::from_utf8_lossy(&kv.value)))
        .collect();
    format!(
        "{} parent={} ts={} {}",
        node.id,
        node.parent,
        node.meta.time,
        items.join(" ")
    )
}
