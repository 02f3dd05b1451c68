//! The configs of simulated replicas: `Config::default_for_test` with the
//! world's addresses and membership, and the knobs a run draws.

use arbor::config::{Config, ContainerConfig, PeerConfig};
use arbor::{Caller, ReplicaId};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Port every simulated replica listens on.
pub const SERVICE_PORT: u16 = 7000;
/// Where a replica's gRPC front listens, on its own address, when it has one.
pub const GRPC_PORT: u16 = 8080;

/// Connection slots of a simulated node, unless its run draws fewer
/// (`scenario::nemesis::wire`): every call in flight holds a pooled
/// connection, and a load run's bursts (every generator request plus the
/// replicas' pushes) go past the engine's default.
const SIM_REQUESTS_IN_FLIGHT_MAX: usize = 4096;

/// The address of the `index`-th replica (0-based).
pub fn replica_addr(index: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, index as u8 + 1)),
        SERVICE_PORT,
    )
}

/// The address of the `index`-th client (1-based) a world creates.
pub fn client_ip(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        10,
        0,
        1 + (index / 250) as u8,
        (index % 250) as u8 + 1,
    ))
}

/// Who sent a request, by the address plan above: the simulated network
/// delivers only from the address a node has, so the source address is
/// as good as a certificate here.
pub fn caller_at(from: SocketAddr) -> Caller {
    match from.ip() {
        IpAddr::V4(ip) => match ip.octets() {
            [10, 0, 0, last] if last > 0 => Caller::Peer(ReplicaId::from(last)),
            [10, 0, high, last] if high > 0 && last > 0 => {
                let index = usize::from(high - 1) * 250 + usize::from(last - 1);
                Caller::Client(format!("client-{index}"))
            }
            _ => Caller::Anonymous,
        },
        IpAddr::V6(_) => Caller::Anonymous,
    }
}

/// The tunable knobs of a simulated node's config.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Knobs {
    pub max_batch_size: usize,
    pub max_batch_delay: Duration,
    pub replication_channel_capacity: usize,
    pub replication_worker_count: usize,
    pub replication_timeout: Duration,
    pub sync_interval: Option<Duration>,
    pub max_pending_writes: usize,
    /// Ops per sync page and per push, and stamps per stamp page: small
    /// pages in simulation, so paging is exercised.
    pub sync_page_size: usize,
    /// Stamps per stamp page where they differ from `sync_page_size`: a
    /// run of missing ops then spans several op pages.
    #[serde(default)]
    pub stamp_page_size: Option<usize>,
    /// `limits.max_message_bytes` where it is drawn small (else the
    /// default), so that op pages, stamp pages, pushes and read answers
    /// meet their byte budget; `limits.max_meta_bytes` shrinks with it.
    #[serde(default)]
    pub message_bytes: Option<usize>,
    /// `limits.counter_jump_max` where it is drawn small (else the
    /// default), so that honest pushes arriving ahead of the ops between
    /// are refused and must be taken again once those arrived.
    #[serde(default)]
    pub counter_jump_max: Option<u64>,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            max_batch_size: 100,
            max_batch_delay: Duration::from_millis(5),
            replication_channel_capacity: 1000,
            replication_worker_count: 16,
            replication_timeout: Duration::from_secs(1),
            sync_interval: Some(Duration::from_secs(5)),
            max_pending_writes: 10_000,
            sync_page_size: 256,
            stamp_page_size: None,
            message_bytes: None,
            counter_jump_max: None,
        }
    }
}

impl Knobs {
    /// Sets these knobs in `config`.
    pub fn apply(&self, config: &mut Config) {
        config.tree.replication_worker_count = self.replication_worker_count;
        config.tree.replication_channel_capacity = self.replication_channel_capacity;
        config.tree.replication_timeout = self.replication_timeout;
        config.tree.sync_interval = self.sync_interval;
        config.pilorama.max_batch_delay = self.max_batch_delay;
        config.pilorama.max_batch_size = self.max_batch_size;
        config.limits.max_pending_writes = self.max_pending_writes;
        config.limits.sync_page_size = self.sync_page_size;
        config.limits.sync_stamp_page_size = self.stamp_page_size.unwrap_or(self.sync_page_size);
        if let Some(bytes) = self.message_bytes {
            config.limits.max_message_bytes = bytes;
            let budget = bytes - arbor::config::MESSAGE_OVERHEAD_BYTES;
            config.limits.max_meta_bytes = config.limits.max_meta_bytes.min(budget);
        }
        if let Some(jump) = self.counter_jump_max {
            config.limits.counter_jump_max = jump;
        }
    }
}

/// Configs for `count` replicas numbered 1..=count at `replica_addr`, every
/// container replicated on all of them.
pub fn cluster_configs(count: usize, knobs: &Knobs) -> Vec<Config> {
    cluster_configs_with(count, knobs, &[])
}

/// Like `cluster_configs`, with explicit replica sets for some containers
/// (every node learns every container's set, as from a network map).
pub fn cluster_configs_with(
    count: usize,
    knobs: &Knobs,
    containers: &[ContainerConfig],
) -> Vec<Config> {
    let ids: Vec<ReplicaId> = (1..=count as ReplicaId).collect();
    ids.iter()
        .map(|&id| node_config(id, &ids, knobs, containers.to_vec()))
        .collect()
}

/// The config of replica `id` among `all` (ids are 1-based positions).
pub fn node_config(
    id: ReplicaId,
    all: &[ReplicaId],
    knobs: &Knobs,
    containers: Vec<ContainerConfig>,
) -> Config {
    let address = |id: ReplicaId| replica_addr(usize::from(id) - 1).to_string();
    let mut config = Config::default_for_test(id);
    config.node.listen = address(id);
    config.node.peers = all
        .iter()
        .filter(|&&peer| peer != id)
        .map(|&peer| PeerConfig::new(peer, address(peer)))
        .collect();
    config.node.containers = containers;
    config.pilorama.path = format!("sim://replica-{id}").into();
    config.limits.max_connections = SIM_REQUESTS_IN_FLIGHT_MAX;
    knobs.apply(&mut config);
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's config is valid, names its peers and carries the knobs.
    #[test]
    fn node_configs_are_valid_and_carry_the_knobs() {
        let knobs = Knobs {
            sync_page_size: 3,
            sync_interval: None,
            ..Knobs::default()
        };
        let configs = cluster_configs(3, &knobs);
        for config in &configs {
            config.validate().expect("a valid config");
            assert_eq!(config.node.peers.len(), 2);
            assert_eq!(config.limits.sync_stamp_page_size, 3);
            assert_eq!(config.tree.sync_interval, None);
        }
        assert_eq!(configs[1].node.listen, "10.0.0.2:7000");
    }

    /// Every address of the plan names the node it belongs to, and nothing
    /// else is named.
    #[test]
    fn callers_are_named_by_the_address_plan() {
        for index in 0..4 {
            let expected = Caller::Peer(index as ReplicaId + 1);
            assert_eq!(caller_at(replica_addr(index)), expected);
        }
        for index in [1, 2, 249, 250, 251, 999] {
            let addr = SocketAddr::new(client_ip(index), 40_000);
            assert_eq!(caller_at(addr), Caller::Client(format!("client-{index}")));
        }
        let stranger = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 168, 0, 1)), 1);
        assert_eq!(caller_at(stranger), Caller::Anonymous);
    }
}
