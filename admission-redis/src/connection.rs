//! Connections to the server: the client built from the config's parts (TLS included), the
//! reconnecting manager every script call goes through, the dedicated connection of a blocking
//! read, and the check of the server's eviction policy.
//!
//! The password goes into `RedisConnectionInfo`, whose `Debug` redacts it, never into a URL.

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, RedisConnectionInfo};

use crate::config::{EvictionCheck, RedisAdmissionConfig};
use crate::error::ConnectError;

/// Builds the client from parts.
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
    client: &Client,
    config: &RedisAdmissionConfig,
) -> redis::RedisResult<ConnectionManager> {
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.response_timeout))
        .set_number_of_retries(config.reconnect_retries)
        .set_max_delay(config.connect_timeout);
    ConnectionManager::new_with_config(client.clone(), manager_config).await
}

/// A connection of its own for blocking reads: no response timeout (`XREAD BLOCK`).
pub(crate) async fn blocking_connection(
    client: &Client,
    config: &RedisAdmissionConfig,
) -> redis::RedisResult<MultiplexedConnection> {
    let connection_config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(None);
    client
        .get_multiplexed_async_connection_with_config(&connection_config)
        .await
}

/// Refuses (or warns about, as configured) a server that may evict keys: an evicted lease record
/// would hand its capacity out twice.
pub(crate) async fn check_eviction(
    conn: &ConnectionManager,
    config: &RedisAdmissionConfig,
) -> Result<(), ConnectError> {
    let mut conn = conn.clone();
    let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut conn)
        .await;
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
