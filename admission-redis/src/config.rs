//! The provider's configuration, checked at construction: a config that cannot work is refused
//! with the field named, and the password is a [`Secret`] that never renders.

use std::fmt;
use std::time::Duration;

use admission_core::{FairShares, Levels};
use sha2::{Digest, Sha256};

use crate::error::ConfigError;

/// A password or other credential: `Debug` and `Display` print `<redacted>`.
///
/// The only way to read it is [`Secret::expose`], which the provider calls once, when it builds
/// the connection info from parts (never from a URL string, whose rendering would carry it).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The credential itself. Keep the result out of logs and errors.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The fleet's ceilings: what every instance of one cell enforces together.
///
/// The tenant figures are the defaults; a live override ([`RedisAdmission::set_tenant_override`])
/// replaces them for one tenant.
///
/// [`RedisAdmission::set_tenant_override`]: crate::RedisAdmission::set_tenant_override
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ceilings {
    /// Bytes held by all leases of the cell at once.
    pub service_bytes: u64,
    /// Leases held in the cell at once.
    pub service_transfers: u64,
    /// Bytes held by one tenant's leases at once (default).
    pub tenant_bytes: u64,
    /// Leases held by one tenant at once (default).
    pub tenant_transfers: u64,
    /// Leases held on one backend at once.
    pub backend_transfers: u64,
}

/// TLS to Redis.
#[derive(Clone, PartialEq, Eq)]
pub struct Tls {
    /// A PEM root certificate to trust instead of the platform's roots (a private CA or a
    /// self-signed server certificate).
    pub root_cert_pem: Option<Vec<u8>>,
    /// Verify the server's certificate and host name. Turning this off is refused in tenant mode.
    pub verify: bool,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field(
                "root_cert_pem",
                &self.root_cert_pem.as_ref().map(|pem| pem.len()),
            )
            .field("verify", &self.verify)
            .finish()
    }
}

/// Traffic quotas, counted per tenant on the server's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quotas {
    /// Requests one tenant may make per server-time minute.
    pub requests_per_minute: u64,
    /// Bytes one tenant may be delivered per server-time hour.
    pub bytes_per_hour: u64,
}

/// A cell's rates: what the fleet may spend per minute, as a provider limits an organisation
/// (its tokens and requests per minute), shared by every instance.
///
/// Each is a budget that refills continuously on the server's clock at `budget` per minute (as
/// the local `TokenBucket` of `admission-accounts` does), slowed by a throttle the fleet's
/// backpressure raises ([`RedisAdmission::record_429`](crate::RedisAdmission::record_429)). A
/// lease spends its footprint in tokens and one request when it is granted, in the same call
/// that checks the in-flight ceilings; a lease that does not fit on rate alone learns the
/// instant it will. The budgets start full and never hold more than one minute's worth.
///
/// A budget that holds a whole minute's worth and refills a whole budget per minute is what a
/// provider's own bucket does, and lets up to twice the budget through in one rolling minute (a
/// full budget, then its refill). Where no rolling minute may ever see more than the budget (an
/// organisation's limit counted over every span of 60 s), set a [`Burst`]
/// ([`within_every_minute`](Rates::within_every_minute)): each level then holds at most the
/// burst and refills the rest of its budget per minute, so the most any minute can spend is the
/// burst plus the refill, the budget itself. The price is the burst's share of the steady rate;
/// the burst must hold the largest lease.
///
/// `minute` is 60 s. A simulation whose clock runs `k` times faster than the server's sets it
/// to `60 s / k`: the budgets stay what they are per simulated minute, and so does the most
/// they accumulate (multiplying the budgets by `k` instead would let `k` minutes' worth pile
/// up).
///
/// ```
/// use admission_redis::{Ceilings, RedisAdmissionConfig, Rates};
///
/// let ceilings = Ceilings {
///     service_bytes: 100_000,
///     service_transfers: 16,
///     tenant_bytes: 100_000,
///     tenant_transfers: 16,
///     backend_transfers: 16,
/// };
/// let mut config = RedisAdmissionConfig::new("127.0.0.1", 6379, "model-a", ceilings);
/// config.rates = Some(Rates::per_minute(90_000, 500));
/// assert!(config.validate().is_ok());
/// config.rates = Some(Rates::per_minute(90_000, 0));
/// assert_eq!(config.validate().unwrap_err().field(), "rates.requests_per_minute");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rates {
    /// Tokens per minute: the budget (the most a minute's refill holds) and its refill rate.
    pub tokens_per_minute: u64,
    /// Requests per minute: the request budget and its refill rate.
    pub requests_per_minute: u64,
    /// How long the budgets' minute lasts on the server's clock (60 s; see above).
    pub minute: Duration,
    /// `None`: each level holds up to a whole budget and refills a whole budget per minute.
    /// `Some(burst)`: each level holds at most the burst (and at most half its budget) and
    /// refills the rest of the budget per minute, so no rolling minute spends more than the
    /// budget.
    pub burst: Option<Burst>,
}

/// The most a cell's rate levels hold at once when the rates hold over every rolling minute
/// ([`Rates::within_every_minute`]). Each is also capped at half its budget (a budget the
/// headers lower keeps some refill); a lease's footprint and requests must fit in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Burst {
    /// Tokens: at least the largest lease's footprint.
    pub tokens: u64,
    /// Requests: at least the most requests one lease spends (1 for a call).
    pub requests: u64,
}

impl Rates {
    /// Budgets of `tokens` and `requests` per 60-second minute.
    pub const fn per_minute(tokens: u64, requests: u64) -> Rates {
        Rates {
            tokens_per_minute: tokens,
            requests_per_minute: requests,
            minute: Duration::from_secs(60),
            burst: None,
        }
    }

    /// The same rates held over every rolling minute: each level holds at most `burst` and
    /// refills the rest of its budget per minute.
    ///
    /// ```
    /// use admission_redis::{Burst, Rates};
    ///
    /// // 100,000 tokens and 150 requests in any 60 s: at most 6,000 tokens and 4 requests at
    /// // once, refilled at 94,000 tokens and 146 requests per minute.
    /// let burst = Burst { tokens: 6_000, requests: 4 };
    /// let rates = Rates::per_minute(100_000, 150).within_every_minute(burst);
    /// assert_eq!(rates.capacity(), (6_000.0, 4.0));
    /// // A budget the headers lower to 10,000 tokens a minute keeps 5,000 of refill.
    /// let lowered = Rates::per_minute(10_000, 150).within_every_minute(burst);
    /// assert_eq!(lowered.capacity().0, 5_000.0);
    /// ```
    #[must_use]
    pub const fn within_every_minute(self, burst: Burst) -> Rates {
        Rates {
            burst: Some(burst),
            ..self
        }
    }

    /// The most each level holds at once: `(tokens, requests)`.
    pub fn capacity(&self) -> (f64, f64) {
        let (tokens, requests) = (
            self.tokens_per_minute as f64,
            self.requests_per_minute as f64,
        );
        match self.burst {
            None => (tokens, requests),
            Some(b) => (
                (b.tokens as f64).min(tokens / 2.0),
                (b.requests as f64).min(requests / 2.0),
            ),
        }
    }
}

/// What to do when the server's `maxmemory-policy` is not `noeviction` (an evicting server can
/// drop a lease's record and hand its capacity out twice).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EvictionCheck {
    /// Refuse to start ([`ConnectError::Eviction`](crate::ConnectError::Eviction)).
    #[default]
    Refuse,
    /// Start, with a warning in the log.
    Warn,
}

/// What the server promises of a write it has acknowledged, which decides what a restart or a
/// failover can lose, and so whether the cell must recover after one (see the fleet guide's
/// "Recovery"). Every instance of a cell must declare the same: it is part of the config's
/// fingerprint.
///
/// The default promises nothing: a restart may lose the last writes (an append-only file written
/// once a second, a snapshot, no persistence at all) and a promoted replica may have missed them,
/// so the cell recovers after either. A declared promise lets it skip the recovery where nothing
/// acknowledged can have been lost.
///
/// ```
/// use admission_redis::Durability;
///
/// // A server run with `--appendonly yes --appendfsync always`:
/// let fsync = Durability { fsync_always: true, ..Durability::default() };
/// // Every acknowledged write on the master's one replica too (a `WAIT 1` after each call):
/// let replicated = Durability { replicas: 1, ..Durability::default() };
/// assert_ne!(fsync, replicated);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Durability {
    /// The server appends every write to its append-only file and syncs it to disk before it
    /// answers (`appendonly yes`, `appendfsync always`), and restarts from that file: a restart
    /// loses nothing acknowledged, so a cell found after one does not recover. Checked at connect
    /// where the server allows `CONFIG GET` ([`ConnectError::Config`](crate::ConnectError::Config)
    /// on field `durability.fsync_always` when it says otherwise).
    pub fsync_always: bool,
    /// A call counts as answered only once this many replicas have its writes (a `WAIT` sent with
    /// it, bounded by half the response timeout; fewer is a failure on the connection, retried
    /// until the caller's deadline). Set it to the number of replicas that can be promoted: then
    /// a failover, planned or not, loses nothing acknowledged, and a cell on the promoted replica
    /// does not recover. 0 (the default): not waited for.
    pub replicas: u32,
}

impl Durability {
    /// The promise as the cell's script reads it: `f` for `fsync_always`, `r` for replicas.
    pub(crate) fn flags(&self) -> &'static str {
        match (self.fsync_always, self.replicas > 0) {
            (false, false) => "",
            (true, false) => "f",
            (false, true) => "r",
            (true, true) => "fr",
        }
    }
}

/// Tenant mode: the cell serves several organisations' data plane, so the connection must be
/// private and authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantMode {
    /// The cell id of the tenant data plane this instance serves; must equal
    /// [`RedisAdmissionConfig::cell`].
    pub data_plane_cell: String,
}

/// Everything [`RedisAdmission::connect`](crate::RedisAdmission::connect) needs.
///
/// Built with [`RedisAdmissionConfig::new`] and adjusted through its public fields; every field
/// is checked by [`validate`](RedisAdmissionConfig::validate) (which `connect` calls).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use admission_redis::{Ceilings, RedisAdmissionConfig};
///
/// let ceilings = Ceilings {
///     service_bytes: 1 << 30,
///     service_transfers: 64,
///     tenant_bytes: 256 << 20,
///     tenant_transfers: 16,
///     backend_transfers: 32,
/// };
/// let mut config = RedisAdmissionConfig::new("127.0.0.1", 6379, "uploads-eu-1", ceilings);
/// config.lease_ttl = Duration::from_secs(10);
/// config.renew_every = Duration::from_secs(3);
/// assert!(config.validate().is_ok());
///
/// config.renew_every = Duration::from_secs(4); // 4 s * 3 > 10 s: too slow to survive a lost renewal
/// let error = config.validate().unwrap_err();
/// assert_eq!(error.field(), "renew_every");
/// ```
#[derive(Clone, Debug)]
pub struct RedisAdmissionConfig {
    /// Server host name or address (with `cluster_nodes`, the first seed node's).
    pub host: String,
    /// Server port (with `cluster_nodes`, the first seed node's).
    pub port: u16,
    /// The seed nodes of a Redis Cluster (host, port), or empty for one server at `host:port`.
    /// The cluster client learns the rest of the cluster from them and follows its slots through
    /// a failover; the cell's hash tag keeps every transition in one slot. See
    /// [`RedisAdmissionConfig::cluster`].
    pub cluster_nodes: Vec<(String, u16)>,
    /// Database number.
    pub db: i64,
    /// ACL user name, if any.
    pub username: Option<String>,
    /// Password (`AUTH`), if any.
    pub password: Option<Secret>,
    /// TLS, if any.
    pub tls: Option<Tls>,
    /// Key prefix: `[A-Za-z0-9_-]{1,64}`.
    pub key_prefix: String,
    /// The cell: one set of ceilings shared by the instances that name it, and the Redis Cluster
    /// hash tag of all its keys. `[A-Za-z0-9_-]{1,64}`.
    pub cell: String,
    /// The ceilings.
    pub ceilings: Ceilings,
    /// How long a lease lives without a renewal (at least 3 s).
    pub lease_ttl: Duration,
    /// How often a held lease is renewed; three renewals must fit in one TTL.
    pub renew_every: Duration,
    /// The longest an acquisition waits for the fleet to have room.
    pub redis_wait: Duration,
    /// The outer local acquisition timeout (the process's own admission); `redis_wait` may not
    /// exceed it.
    pub local_timeout: Duration,
    /// Traffic quotas, if enabled.
    pub quotas: Option<Quotas>,
    /// The cell's rates (tokens and requests per minute), if any.
    pub rates: Option<Rates>,
    /// Records kept in the events stream: Redis trims whole nodes of the stream
    /// (`XADD MAXLEN ~`), so it keeps at least this many (once written) and at most this many
    /// plus one node (`stream-node-max-entries`, 100 records by default). Trimming one record at
    /// a time would double the cost of the append.
    pub events_max_len: u64,
    /// Most expired leases one call reaps.
    pub reap_batch: u32,
    /// Connection timeout, also the bound on a reconnection attempt.
    pub connect_timeout: Duration,
    /// Response timeout of every command (fail closed promptly).
    pub response_timeout: Duration,
    /// Reconnection attempts after a dropped connection before a command fails.
    pub reconnect_retries: usize,
    /// What to do when the server may evict keys.
    pub eviction_check: EvictionCheck,
    /// Tenant mode, if enabled.
    pub tenant_mode: Option<TenantMode>,
    /// Every key of the cell expires after this long without a call (calls refresh it, at
    /// least every tenth of this time, at most every minute, so an idle cell goes between nine
    /// tenths of this time and the whole of it after its last call),
    /// so a fleet that crashed, or stopped using a cell, leaves nothing behind for good. An idle
    /// cell that expired is created again by the next call, without its tenant overrides and
    /// quota windows. Set by the instance that creates the cell. At least a minute and at least
    /// twice the lease TTL.
    pub cell_idle_expiry: Duration,
    /// Whether a cell this instance creates may recover first, when the server may have lost a
    /// cell that held leases: it started less than a lease TTL ago (it may have restarted
    /// empty), it was promoted from a replica less than a TTL ago, or it served this cell within
    /// the last TTL and the cell vanished. Then the cell admits nothing new until one TTL after
    /// that, while holders of leases from before renew them back; on a server that has run
    /// longer than a TTL a new cell admits at once. `true` by default. Set `false` only when no
    /// lease of this cell can be running when it is created (a cell name used for the first
    /// time, a test), so that it never waits. A cell found last written by another server process
    /// recovers by the same rule whatever this says (the fleet guide's "Recovery").
    pub recover_created_cells: bool,
    /// What the server promises of an acknowledged write (nothing, by default): see
    /// [`Durability`].
    pub durability: Durability,
    /// Tenants' weights in the cell's line (none, by default: the line serves in arrival
    /// order, or by level with [`levels`](RedisAdmissionConfig::levels)). With them, waiting tenants share the cell by start-time fair queuing in what
    /// their leases hold (the footprint: bytes, or a model's tokens), each its weight's share,
    /// while a waiter keeps the head's place. Tenant ids reach Redis only as digests. The
    /// accounts [`FairShares::scarce`] names are the monitor's: a cell's cost is always the
    /// footprint, so naming any is refused. See the fair-shares guide, "Across the fleet".
    pub fair_shares: Option<FairShares>,
    /// Priority levels of the cell's line (none, by default): a waiter of a higher level goes
    /// before every waiter of a lower one, as [`LeaseRequest::level`] names it (a request
    /// naming none is the default level). A level may reserve part of the cell's
    /// `service_bytes`, `service_transfers`, `tokens_per_minute` or `requests_per_minute` (the
    /// account names [`Level::reserve`](admission_core::Level::reserve) takes here, each below
    /// its ceiling): every other level's waiter leaves it aside, always on the rates, on bytes
    /// and transfers only while the level has a waiter in the line. An exempt level leaves
    /// nothing aside.
    ///
    /// On a rate, a level also gets its reserve while a higher level's head waits for that
    /// rate: its waiters behind that head may take from the rate without leaving the head's
    /// amount aside (a *dip*; still leaving the other levels' reserves aside), as long as what
    /// the level has dipped there stays within its reserve. Every grant of the rate to another
    /// level that is not itself a dip earns the reserving levels back part of what they dipped
    /// (`amount * reserve /
    /// (capacity - reserve)` each, the capacity being what the rate holds at once), and all of
    /// it is forgotten when the line empties. So the head waits at most for its own amount,
    /// the reserves it leaves aside, and each other level's reserve once (and that level's
    /// share of what a higher level is granted there meanwhile). The counts live in
    /// the cell (its `occ` hash), shared by every instance.
    ///
    /// [`LeaseRequest::level`]: crate::LeaseRequest::level
    pub levels: Option<Levels>,
}

impl RedisAdmissionConfig {
    /// A config with the given server, cell and ceilings, and defaults for the rest: lease TTL
    /// 10 s renewed every 3 s, a Redis wait of 5 s within a local timeout of 30 s, no TLS, no
    /// password, no quotas, key prefix `admission`, 10,000 stream records, reaping 64 per call,
    /// 1 s connect and response timeouts, 2 reconnection attempts, refusing an evicting server,
    /// and a cell that expires after 24 hours without a call.
    pub fn new(
        host: impl Into<String>,
        port: u16,
        cell: impl Into<String>,
        ceilings: Ceilings,
    ) -> RedisAdmissionConfig {
        RedisAdmissionConfig {
            host: host.into(),
            port,
            cluster_nodes: Vec::new(),
            db: 0,
            username: None,
            password: None,
            tls: None,
            key_prefix: "admission".into(),
            cell: cell.into(),
            ceilings,
            lease_ttl: Duration::from_secs(10),
            renew_every: Duration::from_secs(3),
            redis_wait: Duration::from_secs(5),
            local_timeout: Duration::from_secs(30),
            quotas: None,
            rates: None,
            events_max_len: 10_000,
            reap_batch: 64,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            reconnect_retries: 2,
            eviction_check: EvictionCheck::Refuse,
            tenant_mode: None,
            cell_idle_expiry: Duration::from_secs(24 * 60 * 60),
            recover_created_cells: true,
            durability: Durability::default(),
            fair_shares: None,
            levels: None,
        }
    }

    /// As [`new`](RedisAdmissionConfig::new), for a cell on a Redis Cluster reached through
    /// `nodes` (one is enough; each is tried in turn to learn the cluster).
    ///
    /// ```
    /// use admission_redis::{Ceilings, RedisAdmissionConfig};
    ///
    /// let ceilings = Ceilings {
    ///     service_bytes: 1 << 30,
    ///     service_transfers: 64,
    ///     tenant_bytes: 256 << 20,
    ///     tenant_transfers: 16,
    ///     backend_transfers: 32,
    /// };
    /// let nodes = [("10.0.0.1", 7000), ("10.0.0.2", 7000)];
    /// let config = RedisAdmissionConfig::cluster(nodes, "uploads-eu-1", ceilings);
    /// assert_eq!((config.host.as_str(), config.port), ("10.0.0.1", 7000));
    /// assert_eq!(config.cluster_nodes.len(), 2);
    /// assert!(config.validate().is_ok());
    /// ```
    pub fn cluster<H: Into<String>>(
        nodes: impl IntoIterator<Item = (H, u16)>,
        cell: impl Into<String>,
        ceilings: Ceilings,
    ) -> RedisAdmissionConfig {
        let nodes: Vec<(String, u16)> = nodes.into_iter().map(|(h, p)| (h.into(), p)).collect();
        let (host, port) = nodes.first().cloned().unwrap_or_default();
        let mut config = RedisAdmissionConfig::new(host, port, cell, ceilings);
        config.cluster_nodes = nodes;
        config
    }

    /// Checks every field; the error names the first that cannot work.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field and saying why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.ceilings;
        if let Some(account) = self
            .fair_shares
            .as_ref()
            .and_then(|f| f.iter_scarce().next())
        {
            return Err(ConfigError::new(
                "fair_shares",
                format!(
                    "names the scarce account {account:?}: a cell's cost is the lease's footprint, \
                     so a cell's fair shares name none"
                ),
            ));
        }
        if let Some(levels) = &self.levels {
            if levels.is_empty() {
                return Err(ConfigError::new("levels", "declares no level"));
            }
            for level in levels.iter() {
                for (account, amount) in level.iter_reserves() {
                    let ceiling = match account {
                        "service_bytes" => Some(c.service_bytes),
                        "service_transfers" => Some(c.service_transfers),
                        // The most the rates hold at once (their burst, where one is set).
                        "tokens_per_minute" => self.rates.map(|r| r.capacity().0 as u64),
                        "requests_per_minute" => self.rates.map(|r| r.capacity().1 as u64),
                        _ => {
                            return Err(ConfigError::new(
                                "levels",
                                format!(
                                    "level `{}` reserves {account:?}: a cell's levels reserve \
                                     service_bytes, service_transfers, tokens_per_minute or \
                                     requests_per_minute",
                                    level.name()
                                ),
                            ));
                        }
                    };
                    let Some(ceiling) = ceiling else {
                        return Err(ConfigError::new(
                            "levels",
                            format!(
                                "level `{}` reserves {account}, and the cell has no rates",
                                level.name()
                            ),
                        ));
                    };
                    if amount.primary() >= ceiling {
                        return Err(ConfigError::new(
                            "levels",
                            format!(
                                "level `{}` reserves {} of {account}, its ceiling {ceiling}: \
                                 nothing would be left for the other levels",
                                level.name(),
                                amount.primary()
                            ),
                        ));
                    }
                    // What every other level (not exempt) leaves aside must leave it something.
                    for other in levels.iter().filter(|l| !l.is_exempt()) {
                        let kept: u64 = levels
                            .iter()
                            .filter(|l| l.name() != other.name())
                            .map(|l| l.reserved(account).primary())
                            .sum();
                        if kept >= ceiling {
                            return Err(ConfigError::new(
                                "levels",
                                format!(
                                    "the other levels reserve {kept} of {account} beside level \
                                     `{}`, its ceiling {ceiling}: nothing would be left for it",
                                    other.name()
                                ),
                            ));
                        }
                    }
                }
            }
        }
        check_id("key_prefix", &self.key_prefix)?;
        check_id("cell", &self.cell)?;
        if self.host.is_empty() {
            return Err(ConfigError::new("host", "is empty"));
        }
        if let Some((host, port)) = self
            .cluster_nodes
            .iter()
            .find(|(host, port)| host.is_empty() || *port == 0)
        {
            return Err(ConfigError::new(
                "cluster_nodes",
                format!("has the node {host:?}:{port}: a node needs a host and a port"),
            ));
        }
        if !self.cluster_nodes.is_empty() && self.db != 0 {
            return Err(ConfigError::new(
                "db",
                format!("is {}: a Redis Cluster has only database 0", self.db),
            ));
        }
        if !self.cluster_nodes.is_empty() && self.tls.is_some() {
            return Err(ConfigError::new(
                "tls",
                "is set with cluster_nodes: TLS to a Redis Cluster is not supported yet",
            ));
        }
        for (field, value) in [
            ("ceilings.service_bytes", c.service_bytes),
            ("ceilings.service_transfers", c.service_transfers),
            ("ceilings.tenant_bytes", c.tenant_bytes),
            ("ceilings.tenant_transfers", c.tenant_transfers),
            ("ceilings.backend_transfers", c.backend_transfers),
        ] {
            if value == 0 {
                return Err(ConfigError::new(
                    field,
                    "is 0: nothing could ever be admitted",
                ));
            }
            // Lua keeps numbers as doubles: stay where every integer is exact.
            if value > MAX_EXACT {
                return Err(ConfigError::new(field, format!("is {value}, over 2^53")));
            }
        }
        if c.service_bytes < c.service_transfers {
            return Err(ConfigError::new(
                "ceilings.service_bytes",
                format!(
                    "{} is under the {} service transfers it must hold: every transfer holds at \
                     least one byte, so the transfer ceiling could never be reached",
                    c.service_bytes, c.service_transfers
                ),
            ));
        }
        if c.tenant_bytes > c.service_bytes {
            return Err(ConfigError::new(
                "ceilings.tenant_bytes",
                format!(
                    "{} is over the service's {} bytes",
                    c.tenant_bytes, c.service_bytes
                ),
            ));
        }
        if c.tenant_transfers > c.service_transfers {
            return Err(ConfigError::new(
                "ceilings.tenant_transfers",
                format!(
                    "{} is over the service's {} transfers",
                    c.tenant_transfers, c.service_transfers
                ),
            ));
        }
        if c.backend_transfers > c.service_transfers {
            return Err(ConfigError::new(
                "ceilings.backend_transfers",
                format!(
                    "{} is over the service's {} transfers",
                    c.backend_transfers, c.service_transfers
                ),
            ));
        }
        if self.lease_ttl < Duration::from_secs(3) {
            return Err(ConfigError::new(
                "lease_ttl",
                format!("{:?} is under the 3 s minimum", self.lease_ttl),
            ));
        }
        if self.renew_every.is_zero() || self.renew_every.saturating_mul(3) > self.lease_ttl {
            return Err(ConfigError::new(
                "renew_every",
                format!(
                    "{:?} * 3 is over the lease TTL of {:?}: a lease must survive two lost renewals",
                    self.renew_every, self.lease_ttl
                ),
            ));
        }
        if self.redis_wait > self.local_timeout {
            return Err(ConfigError::new(
                "redis_wait",
                format!(
                    "{:?} is longer than the local timeout of {:?}",
                    self.redis_wait, self.local_timeout
                ),
            ));
        }
        if self.events_max_len == 0 {
            return Err(ConfigError::new("events_max_len", "is 0"));
        }
        if self.reap_batch == 0 {
            return Err(ConfigError::new(
                "reap_batch",
                "is 0: expired leases would never be reaped",
            ));
        }
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            let field = if self.connect_timeout.is_zero() {
                "connect_timeout"
            } else {
                "response_timeout"
            };
            return Err(ConfigError::new(field, "is 0"));
        }
        // A renewal that meets a dead connection spends a connection attempt and a response
        // time; it must still end before the next one is due, or two lost renewals would not
        // leave a third before the TTL.
        let call = self.connect_timeout.saturating_add(self.response_timeout);
        if call > self.renew_every {
            let field = if self.connect_timeout > self.response_timeout {
                "connect_timeout"
            } else {
                "response_timeout"
            };
            return Err(ConfigError::new(
                field,
                format!(
                    "connect_timeout {:?} + response_timeout {:?} = {call:?} is over renew_every \
                     {:?}: a renewal that meets a dead connection must end before the next is due",
                    self.connect_timeout, self.response_timeout, self.renew_every
                ),
            ));
        }
        let floor = Duration::from_secs(60).max(self.lease_ttl.saturating_mul(2));
        if self.cell_idle_expiry < floor {
            return Err(ConfigError::new(
                "cell_idle_expiry",
                format!(
                    "{:?} is under {floor:?} (a minute, and twice the lease TTL): a cell in use \
                     must never expire between two calls",
                    self.cell_idle_expiry
                ),
            ));
        }
        if let Some(q) = &self.quotas {
            if q.requests_per_minute == 0 {
                return Err(ConfigError::new("quotas.requests_per_minute", "is 0"));
            }
            if q.bytes_per_hour == 0 || q.bytes_per_hour > MAX_EXACT {
                return Err(ConfigError::new(
                    "quotas.bytes_per_hour",
                    "is 0 or over 2^53",
                ));
            }
        }
        if let Some(r) = &self.rates {
            for (field, value) in [
                ("rates.tokens_per_minute", r.tokens_per_minute),
                ("rates.requests_per_minute", r.requests_per_minute),
            ] {
                if value == 0 || value > MAX_EXACT {
                    return Err(ConfigError::new(
                        field,
                        format!("is {value}: must be positive and at most 2^53"),
                    ));
                }
            }
            if r.minute < Duration::from_millis(1) || r.minute > Duration::from_secs(3600) {
                return Err(ConfigError::new(
                    "rates.minute",
                    format!("is {:?}: must be within 1 ms..=1 h", r.minute),
                ));
            }
            if let Some(b) = r.burst {
                for (field, value, budget) in [
                    ("rates.burst.tokens", b.tokens, r.tokens_per_minute),
                    ("rates.burst.requests", b.requests, r.requests_per_minute),
                ] {
                    if value == 0 || value > budget / 2 {
                        return Err(ConfigError::new(
                            field,
                            format!(
                                "is {value}: must be at least 1 and at most half the budget \
                                 ({budget} a minute), so that the level refills"
                            ),
                        ));
                    }
                }
            }
        }
        if let Some(tenant) = &self.tenant_mode {
            match &self.tls {
                None => return Err(ConfigError::new("tls", "tenant mode requires TLS")),
                Some(tls) if !tls.verify => {
                    return Err(ConfigError::new(
                        "tls.verify",
                        "tenant mode requires certificate verification",
                    ));
                }
                Some(_) => {}
            }
            if self.password.is_none() {
                return Err(ConfigError::new(
                    "password",
                    "tenant mode requires authentication",
                ));
            }
            if tenant.data_plane_cell != self.cell {
                return Err(ConfigError::new(
                    "tenant_mode.data_plane_cell",
                    format!(
                        "{:?} does not match the cell {:?}",
                        tenant.data_plane_cell, self.cell
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A digest of everything two instances of one cell must agree on (the ceilings, the quotas,
    /// the rates as configured, the stream's bound and the lease TTL, which a lease granted from
    /// the line to another instance's waiter gets). Stored in Redis by the first instance; another with a different
    /// digest is refused at connect.
    pub fn fingerprint(&self) -> String {
        let c = &self.ceilings;
        let q = self
            .quotas
            .map(|q| (q.requests_per_minute, q.bytes_per_hour))
            .unwrap_or((0, 0));
        let rates = self.rates.map_or(String::new(), |r| {
            let burst = r
                .burst
                .map_or(String::new(), |b| format!(":{}:{}", b.tokens, b.requests));
            format!(
                "|rates:{}:{}:{}{burst}",
                r.tokens_per_minute,
                r.requests_per_minute,
                r.minute.as_millis()
            )
        });
        // Only a declared promise enters the digest, so that a cell created before durability
        // could be declared keeps its fingerprint.
        let durability = match self.durability {
            Durability {
                fsync_always: false,
                replicas: 0,
            } => String::new(),
            d => format!("|durability:{}:{}", d.fsync_always, d.replicas),
        };
        let text = format!(
            "v2|{}|{}|{}|{}|{}|{}|{}|{}|{}{rates}{durability}{}",
            c.service_bytes,
            c.service_transfers,
            c.tenant_bytes,
            c.tenant_transfers,
            c.backend_transfers,
            q.0,
            q.1,
            self.events_max_len,
            self.lease_ttl.as_millis(),
            self.line_fingerprint(),
        );
        hex(&Sha256::digest(text.as_bytes()))[..16].to_string()
    }
}

impl RedisAdmissionConfig {
    /// The fair line's part of the fingerprint: empty without one, so that a cell created
    /// before fair lines keeps its fingerprint.
    fn line_fingerprint(&self) -> String {
        if self.fair_shares.is_none() && self.levels.is_none() {
            return String::new();
        }
        let mut text = String::from("|line");
        if let Some(shares) = &self.fair_shares {
            text.push_str(&format!(":{}", shares.weight_of(None)));
            for (tenant, weight) in shares.iter() {
                text.push_str(&format!(":{}={weight}", crate::request::hashed_id(tenant)));
            }
        }
        if let Some(levels) = &self.levels {
            // Each name with its length, so that no two lists of names read alike.
            let names: Vec<String> = levels
                .iter()
                .map(|l| format!("{}:{}", l.name().len(), l.name()))
                .collect();
            text.push_str(&format!("|levels:{}", names.join(",")));
            if let Some(rank) = levels.rank_of(None) {
                text.push_str(&format!(":{rank}"));
            }
            let reserves = self.level_reserves();
            if !reserves.is_empty() {
                text.push_str(&format!("|reserves:{reserves}"));
            }
        }
        text
    }

    /// The levels' reserves and exemptions as the script reads them (`lease.lua`, init's ARGV
    /// 19): `rank:dimension:amount` and `rank:e`, joined by commas (dimensions as the script
    /// numbers them: 1 service bytes, 2 service transfers, 6 tokens, 7 requests per minute).
    pub(crate) fn level_reserves(&self) -> String {
        let Some(levels) = &self.levels else {
            return String::new();
        };
        let mut parts = Vec::new();
        for (rank, level) in levels.iter().enumerate() {
            if level.is_exempt() {
                parts.push(format!("{rank}:e"));
            }
            for (account, amount) in level.iter_reserves() {
                let dimension = match account {
                    "service_bytes" => 1,
                    "service_transfers" => 2,
                    "tokens_per_minute" => 6,
                    "requests_per_minute" => 7,
                    // Refused by `validate`.
                    _ => continue,
                };
                if !amount.is_zero() {
                    parts.push(format!("{rank}:{dimension}:{}", amount.primary()));
                }
            }
        }
        parts.join(",")
    }

    /// The level a request naming `level` waits at in the cell's line (0 the highest), or the
    /// levels' names when there is no such level (`none` in a cell without levels, where a
    /// request naming none waits at 0).
    pub(crate) fn rank_of(&self, level: Option<&str>) -> Result<usize, String> {
        let Some(levels) = &self.levels else {
            return level.map_or(Ok(0), |_| Err("none".to_owned()));
        };
        levels.rank_of(level).ok_or_else(|| {
            let names: Vec<&str> = levels.iter().map(|l| l.name()).collect();
            names.join(", ")
        })
    }
}

/// The largest integer a Lua number (a double) holds exactly.
pub(crate) const MAX_EXACT: u64 = 1 << 53;

fn check_id(field: &'static str, value: &str) -> Result<(), ConfigError> {
    let ok = (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            format!("{value:?} is not 1 to 64 of [A-Za-z0-9_-]"),
        ))
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}
