//! Connections to the server or the cluster: the client built from the config's parts (TLS
//! included), the reconnecting connection every call goes through, the dedicated connection of
//! a blocking read, and the check of the server's eviction policy.
//!
//! The password goes into `RedisConnectionInfo`, whose `Debug` redacts it, never into a URL.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, FromRedisValue,
    RedisConnectionInfo,
};

use crate::config::{EvictionCheck, RedisAdmissionConfig};
use crate::error::ConnectError;

/// How a cell's server is reached: one server, or a Redis Cluster (its client follows the slots,
/// MOVED replies and failovers itself).
#[derive(Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per cell, built once and never moved on a hot path"
)]
pub(crate) enum Clients {
    Server(Client),
    Cluster(ClusterClient),
}

/// The connection every call goes through: cheap to clone, reconnecting on its own.
#[derive(Clone)]
pub(crate) enum Conn {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// Sends `command` (to the node of its keys' slot, on a cluster).
    pub(crate) async fn query<T: FromRedisValue>(&self, command: &Cmd) -> redis::RedisResult<T> {
        match self {
            Conn::Server(manager) => command.query_async(&mut manager.clone()).await,
            Conn::Cluster(cluster) => command.query_async(&mut cluster.clone()).await,
        }
    }

    /// Sends `pipe` on one connection (on a cluster, to the node of its first keyed command).
    pub(crate) async fn query_pipe<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<T> {
        match self {
            Conn::Server(manager) => pipe.query_async(&mut manager.clone()).await,
            Conn::Cluster(cluster) => pipe.query_async(&mut cluster.clone()).await,
        }
    }
}

/// A connection of its own for one blocking reader.
pub(crate) enum ReadConn {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ReadConn {
    /// Sends `command` and waits for its reply, however long the command blocks.
    pub(crate) async fn query<T: FromRedisValue>(
        &mut self,
        command: &Cmd,
    ) -> redis::RedisResult<T> {
        match self {
            ReadConn::Server(conn) => command.query_async(conn).await,
            ReadConn::Cluster(conn) => command.query_async(conn).await,
        }
    }
}

/// Builds the clients from the config: one server's, or a cluster's.
pub(crate) fn clients(config: &RedisAdmissionConfig) -> redis::RedisResult<Clients> {
    if config.cluster_nodes.is_empty() {
        return build_client(config).map(Clients::Server);
    }
    cluster_builder(config, config.response_timeout)
        .build()
        .map(Clients::Cluster)
}

/// A cluster client's builder: the seed nodes, the credentials and the config's timeouts, with
/// `response_timeout` for each command.
fn cluster_builder(
    config: &RedisAdmissionConfig,
    response_timeout: Duration,
) -> ClusterClientBuilder {
    let nodes = config
        .cluster_nodes
        .iter()
        .map(|(host, port)| ConnectionAddr::Tcp(host.clone(), *port));
    let mut builder = ClusterClientBuilder::new(nodes.collect::<Vec<_>>())
        .connection_timeout(config.connect_timeout)
        .response_timeout(response_timeout)
        // A call is retried by the caller until its own deadline (see `script.rs`): the
        // cluster client's own retries (a MOVED reply, a node that went away) stay short.
        .retries(u32::try_from(config.reconnect_retries).unwrap_or(u32::MAX))
        .min_retry_wait(10)
        .max_retry_wait(u64::try_from(config.connect_timeout.as_millis()).unwrap_or(u64::MAX));
    if let Some(user) = &config.username {
        builder = builder.username(user);
    }
    if let Some(password) = &config.password {
        builder = builder.password(password.expose());
    }
    builder
}

/// Builds one server's client from parts.
pub(crate) fn build_client(config: &RedisAdmissionConfig) -> redis::RedisResult<Client> {
    let mut redis_info = RedisConnectionInfo::default().set_db(config.db);
    if let Some(user) = &config.username {
        redis_info = redis_info.set_username(user);
    }
    if let Some(password) = &config.password {
        redis_info = redis_info.set_password(password.expose());
    }
    match &config.tls {
        None => {
            let info = into_info(ConnectionAddr::Tcp(config.host.clone(), config.port))?
                .set_redis_settings(redis_info);
            Client::open(info)
        }
        Some(tls) => tls_client(config, tls, redis_info),
    }
}

/// The reconnecting connection every script call goes through: the config's connect and
/// response timeouts, and a bounded number of reconnection attempts per failure (a caller that
/// still has time retries the call itself; see `script.rs`).
pub(crate) async fn manager(
    clients: &Clients,
    config: &RedisAdmissionConfig,
) -> redis::RedisResult<Conn> {
    match clients {
        Clients::Server(client) => {
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(config.response_timeout))
                .set_number_of_retries(config.reconnect_retries)
                .set_max_delay(config.connect_timeout);
            ConnectionManager::new_with_config(client.clone(), manager_config)
                .await
                .map(Conn::Server)
        }
        Clients::Cluster(cluster) => cluster.get_async_connection().await.map(Conn::Cluster),
    }
}

/// A connection of its own for blocking reads of at most `block`: no response timeout on one
/// server (`XREAD BLOCK`); on a cluster, whose client always has one, the block plus a response
/// time.
pub(crate) async fn blocking_connection(
    clients: &Clients,
    config: &RedisAdmissionConfig,
    block: Duration,
) -> redis::RedisResult<ReadConn> {
    match clients {
        Clients::Server(client) => {
            let connection_config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(None);
            client
                .get_multiplexed_async_connection_with_config(&connection_config)
                .await
                .map(ReadConn::Server)
        }
        Clients::Cluster(_) => cluster_builder(config, block + config.response_timeout)
            .build()?
            .get_async_connection()
            .await
            .map(ReadConn::Cluster),
    }
}

/// Refuses (or warns about, as configured) a server that may evict keys: an evicted lease record
/// would hand its capacity out twice.
pub(crate) async fn check_eviction(
    conn: &Conn,
    config: &RedisAdmissionConfig,
) -> Result<(), ConnectError> {
    let mut command = redis::cmd("CONFIG");
    command.arg("GET").arg("maxmemory-policy");
    let reply: redis::RedisResult<Vec<String>> = conn.query(&command).await;
    match reply {
        Ok(pair) => {
            let policy = pair.get(1).cloned().unwrap_or_default();
            if policy == "noeviction" {
                return Ok(());
            }
            match config.eviction_check {
                EvictionCheck::Refuse => Err(ConnectError::Eviction { policy }),
                EvictionCheck::Warn => {
                    tracing::warn!(
                        policy = %policy,
                        "admission-redis: the server may evict keys; a lost lease record would hand its capacity out twice"
                    );
                    Ok(())
                }
            }
        }
        // Managed services often disable CONFIG: say so, and go on.
        Err(error) => {
            tracing::warn!(%error, "admission-redis: could not read maxmemory-policy; make sure it is noeviction");
            Ok(())
        }
    }
}

/// Refuses a declared [`Durability::fsync_always`](crate::Durability::fsync_always) that the
/// server contradicts (`appendonly` not `yes`, or `appendfsync` not `always`): the cell would
/// skip a recovery that a restart needs. A server that refuses `CONFIG GET` (managed services
/// often do) is taken at the config's word, with a warning.
pub(crate) async fn check_durability(
    conn: &Conn,
    config: &RedisAdmissionConfig,
) -> Result<(), ConnectError> {
    if !config.durability.fsync_always {
        return Ok(());
    }
    let mut command = redis::cmd("CONFIG");
    command.arg("GET").arg("appendonly").arg("appendfsync");
    let reply: redis::RedisResult<Vec<String>> = conn.query(&command).await;
    match reply {
        Ok(pairs) => {
            let value = |name: &str| {
                pairs
                    .chunks(2)
                    .find(|pair| pair[0] == name)
                    .and_then(|pair| pair.get(1).cloned())
                    .unwrap_or_default()
            };
            let (appendonly, appendfsync) = (value("appendonly"), value("appendfsync"));
            if appendonly == "yes" && appendfsync == "always" {
                return Ok(());
            }
            Err(ConnectError::Config(crate::error::ConfigError::new(
                "durability.fsync_always",
                format!(
                    "is declared, but the server runs with appendonly {appendonly:?} and \
                     appendfsync {appendfsync:?}: a restart could lose acknowledged writes, and \
                     the cell would skip the recovery that guards against it (run the server with \
                     appendonly yes and appendfsync always, or leave it undeclared)"
                ),
            )))
        }
        Err(error) => {
            tracing::warn!(%error, "admission-redis: could not read appendonly and appendfsync; durability.fsync_always is taken as declared");
            Ok(())
        }
    }
}

fn into_info(addr: ConnectionAddr) -> redis::RedisResult<ConnectionInfo> {
    redis::IntoConnectionInfo::into_connection_info(addr)
}

#[cfg(feature = "tls")]
fn tls_client(
    config: &RedisAdmissionConfig,
    tls: &crate::config::Tls,
    redis_info: RedisConnectionInfo,
) -> redis::RedisResult<Client> {
    let addr = ConnectionAddr::TcpTls {
        host: config.host.clone(),
        port: config.port,
        insecure: !tls.verify,
        tls_params: None,
    };
    let info = into_info(addr)?.set_redis_settings(redis_info);
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: tls.root_cert_pem.clone(),
    };
    Client::build_with_tls(info, certs)
}

#[cfg(not(feature = "tls"))]
fn tls_client(
    _config: &RedisAdmissionConfig,
    _tls: &crate::config::Tls,
    _redis_info: RedisConnectionInfo,
) -> redis::RedisResult<Client> {
    Err(redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "TLS is configured but admission-redis was built without its `tls` feature",
    )))
}
