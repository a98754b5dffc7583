//! `--fleet N --chaos FAULT`: one real fault, injected by the fleet's parent itself at a fixed
//! real time after its members started, and the arithmetic of the verdict that follows: when
//! admission resumed against the bound the fault's rule sets, and which failed jobs it excuses.
//!
//! The faults (what `cargo xtask chaos` runs, one each):
//!
//! - `restart`: the private `redis-server` is SIGKILLed and started again on the same port
//!   `--chaos-down-ms` later ([`DEFAULT_DOWN_MS`] by default). For this fault it keeps an
//!   append-only file fsynced once a second, so the cells come back as they were, but the
//!   members declare nothing of it (the default `Durability`): the restarted server may have
//!   lost acknowledged writes, so each cell recovers (admits nothing new) until one lease TTL
//!   after the new process started (rounded up to its next whole second, or its first call if
//!   earlier). Bound: the first admission on the restarted server comes no earlier than one TTL
//!   and at most one TTL plus [`RESTART_SLACK`] after the parent spawned the new process.
//! - `restart-fsync`: the same with a server run `--appendonly yes --appendfsync always` from
//!   the start, which every cell declares (`Durability::fsync_always`): the restart loses nothing
//!   acknowledged, so no cell recovers. Bound: the first admission at most
//!   [`LOSSLESS_RESTART_BOUND`] after the server was ready again; no job fails and no
//!   `recovering` record follows the restart.
//! - `pause`: `CLIENT PAUSE` for `--chaos-pause-ms` ([`DEFAULT_PAUSE_MS`] by default; every
//!   client's commands wait on the server). Bound: the first admission at most [`PAUSE_BOUND`]
//!   after the pause ended (counted from the moment before the command was sent, plus the pause:
//!   the earliest it can end).
//! - `kill-member`: the last member is SIGKILLed. Its leases stay held until their TTL and its
//!   waiting tickets until their liveness runs out; the other members go on. Bound: one of them
//!   admits at most [`KILL_MEMBER_BOUND`] after the kill (its own admissions left out).
//! - `kill-master`: on a private six-node Redis Cluster (`admission_testkit::redis_servers`, started by
//!   the parent for this fault), the master serving the first model's cell (its slot found with
//!   `CLUSTER KEYSLOT` and `CLUSTER NODES`) is SIGKILLed. The parent polls until a replica took
//!   the slot over (the election, 2 to 3 s with the nodes' 1 s timeout) and every node left says
//!   `cluster_state:ok` (the cluster's return). The promoted replica may have missed the old
//!   master's last writes, so each cell it now serves recovers until one TTL after the library
//!   first saw it promoted (its first call there). Bound, on those cells: the first admission at
//!   most one TTL plus [`RESTART_SLACK`] after the cluster was ok again, and no earlier than one
//!   TTL after the kill. The cells on the other masters are served throughout.
//! - `failover`: on such a cluster, `CLUSTER FAILOVER` (no `FORCE`) is sent to the replica of
//!   the master serving the first model's cell, and every cell declares one replica
//!   (`Durability::replicas = 1`: a call counts once the replica has it), so the replica has
//!   every acknowledged write when it takes over and no cell recovers. Bound: the first
//!   admission on that master's cells at most [`FAILOVER_BOUND`] after the new master answered
//!   as a master; no job fails and no `recovering` record follows.
//!
//! Every time is wall-clock milliseconds since the Unix epoch, the clock every process of the
//! machine and the server share: the parent's marks (the fault, a process spawned, a server
//! ready, a role seen) and the server's `time_ms` of each events record. The resumption is the
//! earliest `admitted` record of the cells the fault reached at or after the fault's floor (an
//! instant after which only the new server, the new master or the other members can have written
//! one: [`first_admission_after`]). A job that did not complete is excused only if its *own*
//! deadline (the deadline of the fleet-lease wait that ended it, as its member recorded it) fell
//! between the fault and that resumption; any other failed or timed-out job fails the run, as
//! does one whose end had no lease deadline, and a run after which admission never resumed.

use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use admission_testkit::redis_servers::{self, PrivateCluster};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::cells::Promise;
use crate::redis_server::{self, Endpoint, PrivateRedis};

/// How long the server stays down in a restart unless `--chaos-down-ms` says otherwise.
pub const DEFAULT_DOWN_MS: u64 = 2_000;
/// How long a `pause` pauses the server's clients unless `--chaos-pause-ms` says otherwise.
pub const DEFAULT_PAUSE_MS: u64 = 3_000;
/// After a lossy restart or failover, how much later than one lease TTL after the reference the
/// first admission may come: the recovery's end rounded up to the server's next whole second (a
/// restart), or the library's first call on the promoted replica (a failover), and the waiting
/// members asking again.
pub const RESTART_SLACK: Duration = Duration::from_secs(1);
/// After a lossless restart, the most the first admission may take once the server is ready.
pub const LOSSLESS_RESTART_BOUND: Duration = Duration::from_millis(500);
/// After a pause, the most the first admission may take once the pause ended.
pub const PAUSE_BOUND: Duration = Duration::from_millis(500);
/// After a member was killed, the most the others may take to admit again.
pub const KILL_MEMBER_BOUND: Duration = Duration::from_secs(1);
/// After a planned failover, the most the first admission may take once the new master answers.
pub const FAILOVER_BOUND: Duration = Duration::from_secs(1);
/// How long after a `kill-master` or a `failover` a replica must have taken the slot over and
/// the cluster be ok again, or the fault failed.
pub const ELECTION_LIMIT: Duration = Duration::from_secs(30);

/// The fault a `--chaos` run injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fault {
    /// SIGKILL the private redis-server and start it again on the same port `--chaos-down-ms`
    /// later (an append-only file fsynced every second; the cells recover for one lease TTL).
    Restart,
    /// The same on a server that fsyncs every write before it answers, which the cells are told:
    /// nothing is lost, no cell recovers.
    RestartFsync,
    /// `CLIENT PAUSE` on the server for `--chaos-pause-ms`: no client's command runs meanwhile.
    Pause,
    /// SIGKILL the last member process; its leases are held until their TTL.
    KillMember,
    /// SIGKILL the master serving the first model's cell on a private six-node Redis Cluster;
    /// a replica takes over and the cells it serves recover for one lease TTL.
    KillMaster,
    /// `CLUSTER FAILOVER` to the replica of that master, every call held until one replica has
    /// it: nothing is lost, no cell recovers.
    Failover,
}

impl Fault {
    /// The name the command line spells.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Restart => "restart",
            Fault::RestartFsync => "restart-fsync",
            Fault::Pause => "pause",
            Fault::KillMember => "kill-member",
            Fault::KillMaster => "kill-master",
            Fault::Failover => "failover",
        }
    }

    /// What the fleet's server promises for this fault, as every cell declares it.
    pub fn promise(self) -> Promise {
        match self {
            Fault::RestartFsync => Promise::FsyncAlways,
            Fault::Failover => Promise::OneReplica,
            _ => Promise::Nothing,
        }
    }

    /// Whether it loses no acknowledged write: then no job may fail and no cell may recover.
    pub fn lossless(self) -> bool {
        matches!(self, Fault::RestartFsync | Fault::Failover)
    }

    /// Whether it acts on a private Redis Cluster the parent starts for it.
    pub fn on_cluster(self) -> bool {
        matches!(self, Fault::KillMaster | Fault::Failover)
    }

    /// Whether it kills the private redis-server and starts it again.
    pub fn restarts(self) -> bool {
        matches!(self, Fault::Restart | Fault::RestartFsync)
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn wall_ms() -> u64 {
    wall_us() / 1_000
}

/// Microseconds since the Unix epoch, now (0 before the epoch).
pub fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// What a fault did, on the wall clock (milliseconds), and the bound its resumption is held to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outage {
    /// The fault.
    pub fault: Fault,
    /// When it began: the moment before the fault was injected.
    pub start_ms: u64,
    /// The instant the resumption is measured from: the new server process spawned (`restart`),
    /// the server ready again (`restart-fsync`), the pause's end, the kill, the cluster ok again
    /// (`kill-master`), the new master answering (`failover`).
    pub reference_ms: u64,
    /// Admissions at or after this instant are the resumption: no record of the killed server,
    /// the paused one before its pause, or the old master can be as late.
    pub floor_ms: u64,
    /// The bound of the first admission, milliseconds after `reference_ms`: `(earliest, latest)`.
    pub bound_ms: (u64, u64),
    /// After a restart: when the server said it was ready again.
    pub ready_ms: Option<u64>,
    /// After a kill-master: when a replica was seen serving the killed master's slot; after a
    /// failover: when the replica answered as a master.
    pub elected_ms: Option<u64>,
    /// After a kill-master or a failover: when every running node said the cluster was ok.
    pub ok_ms: Option<u64>,
    /// After a kill-member: the member killed (its own admissions are not the others').
    pub killed: Option<u32>,
}

impl Outage {
    /// A restart begun at `start_ms` whose new process was spawned at `spawned_ms` and was
    /// ready at `ready_ms`. Lossy (`restart`): the cells recover until one `lease_ttl` after the
    /// process started (at the latest its next whole second), so the first admission comes one
    /// TTL to one TTL plus [`RESTART_SLACK`] after the spawn. Lossless (`restart-fsync`): at most
    /// [`LOSSLESS_RESTART_BOUND`] after the server was ready.
    pub fn restart(
        fault: Fault,
        start_ms: u64,
        spawned_ms: u64,
        ready_ms: u64,
        lease_ttl: Duration,
    ) -> Outage {
        let spawned_ms = spawned_ms.max(start_ms);
        let ready_ms = ready_ms.max(spawned_ms);
        let (reference_ms, bound_ms) = if fault.lossless() {
            (ready_ms, (0, millis(LOSSLESS_RESTART_BOUND)))
        } else {
            let ttl = millis(lease_ttl);
            (spawned_ms, (ttl, ttl.saturating_add(millis(RESTART_SLACK))))
        };
        Outage {
            fault,
            start_ms,
            reference_ms,
            floor_ms: spawned_ms,
            bound_ms,
            ready_ms: Some(ready_ms),
            elected_ms: None,
            ok_ms: None,
            killed: None,
        }
    }

    /// A `CLIENT PAUSE` of `pause` sent at `start_ms`: it ends no earlier than `pause` later,
    /// and the first admission comes at most [`PAUSE_BOUND`] after that.
    pub fn pause(start_ms: u64, pause: Duration) -> Outage {
        let end_ms = start_ms.saturating_add(millis(pause));
        Outage {
            fault: Fault::Pause,
            start_ms,
            reference_ms: end_ms,
            floor_ms: end_ms,
            bound_ms: (0, millis(PAUSE_BOUND)),
            ready_ms: None,
            elected_ms: None,
            ok_ms: None,
            killed: None,
        }
    }

    /// Member `member` SIGKILLed at `start_ms`: another member admits at most
    /// [`KILL_MEMBER_BOUND`] later.
    pub fn kill_member(start_ms: u64, member: u32) -> Outage {
        Outage {
            fault: Fault::KillMember,
            start_ms,
            reference_ms: start_ms,
            floor_ms: start_ms,
            bound_ms: (0, millis(KILL_MEMBER_BOUND)),
            ready_ms: None,
            elected_ms: None,
            ok_ms: None,
            killed: Some(member),
        }
    }

    /// A master killed (`kill-master`) or failed over (`failover`) at `start_ms`, its slot served
    /// by a replica seen at `elected_ms` (after a failover: the replica answering as a master),
    /// the cluster ok again at `ok_ms`. Lossy: the cells on the promoted replica recover until
    /// one `lease_ttl` after its first call, so the first admission there comes no earlier than
    /// one TTL after the kill and at most one TTL plus [`RESTART_SLACK`] after the cluster was
    /// ok. Lossless: at most [`FAILOVER_BOUND`] after the new master answered.
    pub fn failover(
        fault: Fault,
        start_ms: u64,
        elected_ms: u64,
        ok_ms: u64,
        lease_ttl: Duration,
    ) -> Outage {
        let elected_ms = elected_ms.max(start_ms);
        let ok_ms = ok_ms.max(elected_ms);
        let ttl = millis(lease_ttl);
        let (reference_ms, bound_ms) = if fault.lossless() {
            (elected_ms, (0, millis(FAILOVER_BOUND)))
        } else {
            (
                ok_ms,
                (
                    start_ms.saturating_add(ttl).saturating_sub(ok_ms),
                    ttl.saturating_add(millis(RESTART_SLACK)),
                ),
            )
        };
        Outage {
            fault,
            start_ms,
            reference_ms,
            floor_ms: reference_ms,
            bound_ms,
            ready_ms: None,
            elected_ms: Some(elected_ms),
            ok_ms: Some(ok_ms),
            killed: None,
        }
    }

    /// What `reference_ms` is, as the verdict says it.
    pub fn reference(&self) -> &'static str {
        match self.fault {
            Fault::Restart => "the new server process started",
            Fault::RestartFsync => "the server was ready again",
            Fault::Pause => "the pause ended",
            Fault::KillMember => "the kill",
            Fault::KillMaster => "the cluster was ok again",
            Fault::Failover => "the new master answered",
        }
    }

    /// The first admission at `first_ms` (server time, ms), as milliseconds after the
    /// reference (0 if before it: a member may admit on a server the parent has not yet seen
    /// ready), and whether that is within the bound.
    pub fn resumed(&self, first_ms: u64) -> (u64, bool) {
        let after = first_ms.saturating_sub(self.reference_ms);
        let (earliest, latest) = self.bound_ms;
        let early_enough = earliest == 0 || first_ms >= self.reference_ms.saturating_add(earliest);
        (after, early_enough && after <= latest)
    }

    /// Whether a job whose deadline was `deadline_ms` is excused: the deadline fell between the
    /// fault and the measured resumption `resumed_ms` (the first admission after the fault);
    /// without a resumption, none is.
    pub fn covers(&self, deadline_ms: u64, resumed_ms: Option<u64>) -> bool {
        resumed_ms.is_some_and(|resumed| self.start_ms <= deadline_ms && deadline_ms <= resumed)
    }

    /// After a failover, the election's time from the fault, in milliseconds.
    pub fn election_ms(&self) -> Option<u64> {
        self.elected_ms.map(|e| e.saturating_sub(self.start_ms))
    }
}

/// The longest the parent waits for the server's reply to `CLIENT PAUSE`.
const PAUSE_REPLY_WAIT: Duration = Duration::from_secs(2);

/// What a fault acts on, as the parent has it when the fault's time comes.
pub struct Targets<'a> {
    /// The fleet's private server, if it has one.
    pub server: Option<&'a mut PrivateRedis>,
    /// The fleet's private cluster, if it has one.
    pub cluster: Option<&'a mut PrivateCluster>,
    /// Where the fleet's server listens (none on a cluster).
    pub endpoint: Option<&'a Endpoint>,
    /// Each model's cell, by a key of it, in the parent's order: a `kill-master` or a `failover`
    /// acts on the master serving the first.
    pub cells: &'a [(String, String)],
    /// The member a `kill-member` kills, if it still runs: its index and process.
    pub victim: Option<(u32, &'a mut Child)>,
    /// The parent's runtime, for the `CLIENT PAUSE` call.
    pub runtime: &'a tokio::runtime::Runtime,
}

/// Where a fault is in its course.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not injected yet.
    Armed,
    /// The server is down since `start_ms` (a restart), to be started again at `until`.
    Down { until: Instant, start_ms: u64 },
    /// The master on port `old` was SIGKILLed (or, with a `target`, that replica was sent
    /// `CLUSTER FAILOVER`) at `start_ms`: waiting, until `give_up`, for a replica to serve `slot`
    /// (`elected`: seen at that wall-clock ms, on that port) and the cluster to be ok again.
    Electing {
        start_ms: u64,
        slot: u16,
        old: u16,
        target: Option<u16>,
        give_up: Instant,
        elected: Option<(u64, u16)>,
    },
    /// Injected (and, for a restart, the server is back), or it could not be.
    Over,
}

/// One fault's schedule, and what came of it: the outage it caused, or why it could not be
/// injected. The parent calls [`Injector::step`] from the loop that watches its members, so the
/// fault lands at a fixed real time after they started, whatever else happens.
pub struct Injector {
    /// The fault.
    pub fault: Fault,
    /// When to inject it.
    at: Instant,
    /// Wall-clock ms of the members' start, from which the log's times are given.
    origin_ms: u64,
    /// The cells' lease TTL: how long a recovery lasts.
    lease_ttl: Duration,
    /// How long a restarted server stays down.
    down: Duration,
    /// How long a pause lasts.
    pause: Duration,
    phase: Phase,
    /// Whether its injection was tried.
    tried: bool,
    /// The outage, once its course is over.
    pub outage: Option<Outage>,
    /// The member it killed.
    pub killed: Option<u32>,
    /// The models whose cells the fault reached, when not every one: after a `kill-master` or a
    /// `failover`, those the master served.
    pub affected: Option<Vec<String>>,
    /// Why the fault could not be injected (or the server not started again).
    pub failure: Option<String>,
}

impl Injector {
    /// `fault`, to be injected at `at`; `origin_ms` is the members' start (wall clock); a
    /// restart keeps the server down for `down`, a pause lasts `pause`.
    pub fn new(
        fault: Fault,
        at: Instant,
        origin_ms: u64,
        lease_ttl: Duration,
        down: Duration,
        pause: Duration,
    ) -> Injector {
        Injector {
            fault,
            at,
            origin_ms,
            lease_ttl,
            down,
            pause,
            phase: Phase::Armed,
            tried: false,
            outage: None,
            killed: None,
            affected: None,
            failure: None,
        }
    }

    /// Whether the fault was injected (or its injection tried).
    pub fn injected(&self) -> bool {
        self.tried
    }

    /// The run is stopping: a fault not yet injected never will be (one under way still ends:
    /// a killed server is started again).
    pub fn disarm(&mut self) {
        if self.phase == Phase::Armed {
            self.phase = Phase::Over;
        }
    }

    /// Whether the fault is still under way: the server is down, to be started again, or the
    /// cluster's election is awaited.
    pub fn is_down(&self) -> bool {
        matches!(self.phase, Phase::Down { .. } | Phase::Electing { .. })
    }

    /// Moves the fault on at `now`: injects it when its time has come, starts a restarted
    /// server again when its down time is over, and looks whether a replica took the slot over.
    /// Answers a line for the log when it acted.
    pub fn step(&mut self, now: Instant, targets: Targets<'_>) -> Option<String> {
        match self.phase {
            Phase::Armed if now >= self.at => Some(self.inject(targets)),
            Phase::Down { until, start_ms } if now >= until => {
                Some(self.bring_back(start_ms, targets))
            }
            Phase::Electing { .. } => self.watch_election(now, targets),
            _ => None,
        }
    }

    fn inject(&mut self, targets: Targets<'_>) -> String {
        let start_ms = wall_ms();
        let at = offset(start_ms, self.origin_ms);
        self.phase = Phase::Over;
        self.tried = true;
        match self.fault {
            Fault::Restart | Fault::RestartFsync => {
                let Some(server) = targets.server else {
                    return self.fail("there is no private redis-server to restart".into());
                };
                server.kill();
                self.phase = Phase::Down {
                    until: Instant::now() + self.down,
                    start_ms,
                };
                format!(
                    "chaos: redis-server SIGKILLed at {at}; it starts again in {} s",
                    self.down.as_secs_f64()
                )
            }
            Fault::Pause => {
                let Some(endpoint) = targets.endpoint else {
                    return self.fail("CLIENT PAUSE needs one server, not a cluster".into());
                };
                let pause = self.pause;
                // The timer is made inside the runtime, as it must be.
                let paused = targets.runtime.block_on(async {
                    tokio::time::timeout(
                        PAUSE_REPLY_WAIT,
                        redis_server::pause_clients(endpoint, pause),
                    )
                    .await
                });
                match paused {
                    Ok(Ok(())) => {
                        let outage = Outage::pause(start_ms, self.pause);
                        let line = format!(
                            "chaos: CLIENT PAUSE {} sent at {at}; the pause ends no earlier than {}",
                            millis(self.pause),
                            offset(outage.reference_ms, self.origin_ms)
                        );
                        self.outage = Some(outage);
                        line
                    }
                    Ok(Err(error)) => self.fail(format!("CLIENT PAUSE failed: {error:#}")),
                    Err(_) => self.fail(format!(
                        "CLIENT PAUSE had no reply in {} s",
                        PAUSE_REPLY_WAIT.as_secs()
                    )),
                }
            }
            Fault::KillMember => {
                let Some((index, child)) = targets.victim else {
                    return self.fail("the member to kill had already exited".into());
                };
                let _ = child.kill();
                let _ = child.wait();
                self.killed = Some(index);
                self.outage = Some(Outage::kill_member(start_ms, index));
                format!(
                    "chaos: process {index} SIGKILLed at {at}; its leases and tickets are held until their TTL, by {}",
                    offset(
                        start_ms.saturating_add(millis(self.lease_ttl)),
                        self.origin_ms
                    )
                )
            }
            Fault::KillMaster | Fault::Failover => self.move_master(targets),
        }
    }

    /// `kill-master` and `failover`: finds the master serving the first cell's slot, SIGKILLs
    /// it (or sends its replica `CLUSTER FAILOVER`), and starts waiting for the election.
    fn move_master(&mut self, targets: Targets<'_>) -> String {
        let Some(cluster) = targets.cluster else {
            return self.fail("there is no private Redis Cluster to fail a master over".into());
        };
        let Some((model, key)) = targets.cells.first() else {
            return self.fail("the fleet has no cell".into());
        };
        let Some(slot) = cluster.keyslot(key) else {
            return self.fail(format!("CLUSTER KEYSLOT {key} had no answer"));
        };
        let Some(nodes) = cluster.view() else {
            return self.fail("CLUSTER NODES had no answer".into());
        };
        let Some(master) = redis_servers::master_of_slot(&nodes, slot) else {
            return self.fail(format!("no master serves slot {slot} before the fault"));
        };
        // The cells the same master serves go through the same failover.
        let affected: Vec<String> = targets
            .cells
            .iter()
            .filter(|(_, key)| cluster.keyslot(key).is_some_and(|s| master.serves(s)))
            .map(|(model, _)| model.clone())
            .collect();
        let (target, what) = if self.fault == Fault::Failover {
            // The master's replica, as the master lists it (one `CLUSTER NODES` line each).
            let replica = redis_servers::query::<Vec<String>>(
                master.port,
                redis::cmd("CLUSTER").arg("REPLICAS").arg(&master.id),
            )
            .map(|lines| redis_servers::parse_nodes(&lines.join("\n")))
            .and_then(|replicas| replicas.into_iter().find(|r| !r.failing));
            let Some(replica) = replica else {
                return self.fail(format!(
                    "the master of slot {slot}, {}, lists no replica",
                    master.address()
                ));
            };
            let start_ms = wall_ms();
            let sent =
                redis_servers::query::<String>(replica.port, redis::cmd("CLUSTER").arg("FAILOVER"));
            if sent.as_deref() != Some("OK") {
                return self.fail(format!(
                    "CLUSTER FAILOVER on {} answered {sent:?}",
                    replica.address()
                ));
            }
            self.phase = Phase::Electing {
                start_ms,
                slot,
                old: master.port,
                target: Some(replica.port),
                give_up: Instant::now() + ELECTION_LIMIT,
                elected: None,
            };
            (
                Some(replica.port),
                format!(
                    "CLUSTER FAILOVER sent to its replica {} at {}",
                    replica.address(),
                    offset(start_ms, self.origin_ms)
                ),
            )
        } else {
            let start_ms = wall_ms();
            if !cluster.kill(master.port) {
                return self.fail(format!(
                    "the master of slot {slot}, {}, is no running node of the private cluster",
                    master.address()
                ));
            }
            self.phase = Phase::Electing {
                start_ms,
                slot,
                old: master.port,
                target: None,
                give_up: Instant::now() + ELECTION_LIMIT,
                elected: None,
            };
            (
                None,
                format!("SIGKILLed at {}", offset(start_ms, self.origin_ms)),
            )
        };
        let line = format!(
            "chaos: master {} (slot {slot}, {model}'s cell; cells on it: {}): {what}; waiting for {} to take over",
            master.address(),
            affected.join(", "),
            target.map_or_else(
                || "a replica".to_owned(),
                |port| format!("127.0.0.1:{port}")
            )
        );
        self.affected = Some(affected);
        line
    }

    /// While an election is awaited: whether a replica serves the slot now (after a failover:
    /// whether the replica answers as a master), and once one does, whether every running node
    /// says the cluster is ok; then the outage.
    fn watch_election(&mut self, now: Instant, targets: Targets<'_>) -> Option<String> {
        let Phase::Electing {
            start_ms,
            slot,
            old,
            target,
            give_up,
            elected,
        } = self.phase
        else {
            return None;
        };
        let Some(cluster) = targets.cluster else {
            self.phase = Phase::Over;
            return Some(self.fail("the private Redis Cluster is gone".into()));
        };
        let elected = elected.or_else(|| match target {
            Some(port) => {
                redis_servers::query::<String>(port, redis::cmd("INFO").arg("replication"))
                    .filter(|info| redis_servers::info_field(info, "role") == Some("master"))
                    .map(|_| (wall_ms(), port))
            }
            None => {
                let nodes = cluster.view()?;
                let master = redis_servers::master_of_slot(&nodes, slot)?;
                (master.port != old).then(|| (wall_ms(), master.port))
            }
        });
        let serving = |by: u16| {
            cluster.view().is_some_and(|nodes| {
                redis_servers::master_of_slot(&nodes, slot).is_some_and(|m| m.port == by)
            })
        };
        if let Some((elected_ms, by)) = elected
            && serving(by)
            && cluster.all_ok()
        {
            let outage =
                Outage::failover(self.fault, start_ms, elected_ms, wall_ms(), self.lease_ttl);
            let line = format!(
                "chaos: failover: 127.0.0.1:{by} {} at {}, {} ms after the fault; the cluster was ok again at {}; {}",
                if self.fault == Fault::Failover {
                    "answered as the master"
                } else {
                    "took the slot over"
                },
                offset(outage.elected_ms.unwrap_or(elected_ms), self.origin_ms),
                outage.election_ms().unwrap_or(0),
                offset(outage.ok_ms.unwrap_or(elected_ms), self.origin_ms),
                if self.fault.lossless() {
                    "every acknowledged write reached it: the cells admit at once".to_owned()
                } else {
                    format!(
                        "the cells on it recover (admit nothing new) until one lease TTL after its first call, about {}",
                        offset(
                            elected_ms.saturating_add(millis(self.lease_ttl)),
                            self.origin_ms
                        )
                    )
                }
            );
            self.outage = Some(outage);
            self.phase = Phase::Over;
            return Some(line);
        }
        if now >= give_up {
            self.phase = Phase::Over;
            return Some(self.fail(match elected {
                Some(_) => format!(
                    "a replica took slot {slot} over, but the cluster was not ok again within {} s of the fault",
                    ELECTION_LIMIT.as_secs()
                ),
                None => format!(
                    "no replica took slot {slot} over within {} s of the fault",
                    ELECTION_LIMIT.as_secs()
                ),
            }));
        }
        self.phase = Phase::Electing {
            start_ms,
            slot,
            old,
            target,
            give_up,
            elected,
        };
        None
    }

    fn bring_back(&mut self, start_ms: u64, targets: Targets<'_>) -> String {
        self.phase = Phase::Over;
        let Some(server) = targets.server else {
            return self.fail("the private redis-server is gone".into());
        };
        let spawned_ms = wall_ms();
        match server.restart() {
            Ok(()) => {
                let outage =
                    Outage::restart(self.fault, start_ms, spawned_ms, wall_ms(), self.lease_ttl);
                let ready_ms = outage.ready_ms.unwrap_or(spawned_ms);
                let line = format!(
                    "chaos: redis-server (pid {}) spawned again at {}, ready at {} (down {:.2} s); {}",
                    server.pid().unwrap_or(0),
                    offset(spawned_ms, self.origin_ms),
                    offset(ready_ms, self.origin_ms),
                    (ready_ms.saturating_sub(start_ms)) as f64 / 1_000.0,
                    if self.fault.lossless() {
                        "it fsynced every write it acknowledged: the cells admit at once".to_owned()
                    } else {
                        format!(
                            "the cells recover (admit nothing new) until one lease TTL after the process started, by {} at the latest",
                            offset(
                                spawned_ms
                                    .saturating_add(millis(self.lease_ttl))
                                    .saturating_add(millis(RESTART_SLACK)),
                                self.origin_ms
                            )
                        )
                    }
                );
                self.outage = Some(outage);
                line
            }
            Err(error) => self.fail(format!("redis-server did not start again: {error:#}")),
        }
    }

    fn fail(&mut self, why: String) -> String {
        let line = format!("chaos: FAILED: {why}");
        self.failure = Some(why);
        line
    }
}

/// `d` in whole milliseconds.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How a job that did not complete ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndKind {
    /// A wait ran out.
    TimedOut,
    /// Anything else that failed it.
    Failed,
}

/// One job that timed out or failed, as its member saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEnd {
    /// The agent's name.
    pub job: String,
    /// Timed out or failed.
    pub kind: EndKind,
    /// When the job's fleet-lease wait that ended it would have run out, wall-clock
    /// milliseconds; `None` when the job ended otherwise (its own monitor, the call).
    pub deadline_ms: Option<u64>,
    /// The failure's message, if it failed.
    pub error: Option<String>,
}

/// The failed jobs of a run, judged against its outage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Judged {
    /// Jobs that timed out or failed.
    pub failed: u64,
    /// Of those, jobs that timed out.
    pub timed_out: u64,
    /// Of those, jobs whose own deadline fell between the fault and the resumption.
    pub inside: u64,
    /// The others, with the member that ran each: each fails the run.
    pub outside: Vec<(u32, JobEnd)>,
}

/// Sorts the failed jobs of every member into excused (their deadline between the fault and the
/// resumption `resumed_ms`, see [`Outage::covers`]) and not; with no outage, none is excused.
pub fn judge<'a>(
    ends: impl IntoIterator<Item = (u32, &'a JobEnd)>,
    outage: Option<&Outage>,
    resumed_ms: Option<u64>,
) -> Judged {
    let mut judged = Judged::default();
    for (member, end) in ends {
        judged.failed += 1;
        if end.kind == EndKind::TimedOut {
            judged.timed_out += 1;
        }
        let excused = match (outage, end.deadline_ms) {
            (Some(outage), Some(deadline)) => outage.covers(deadline, resumed_ms),
            _ => false,
        };
        if excused {
            judged.inside += 1;
        } else {
            judged.outside.push((member, end.clone()));
        }
    }
    judged
}

/// The server time of the first admission at or after `floor_ms`: the earliest `admitted`
/// record among `records` (kind, server `time_ms`), in any order, whose time is not before it.
pub fn first_admission_after<'a>(
    records: impl IntoIterator<Item = (&'a str, u64)>,
    floor_ms: u64,
) -> Option<u64> {
    records
        .into_iter()
        .filter(|&(kind, time_ms)| kind == "admitted" && time_ms >= floor_ms)
        .map(|(_, time_ms)| time_ms)
        .min()
}

/// The `recovering` records among `records` (kind, server `time_ms`, outcome) at or after
/// `from_ms`: each one's time and outcome (`created`, `restarted`, `promoted`).
pub fn recoveries_after<'a>(
    records: impl IntoIterator<Item = (&'a str, u64, &'a str)>,
    from_ms: u64,
) -> Vec<(u64, String)> {
    records
        .into_iter()
        .filter(|&(kind, time_ms, _)| kind == "recovering" && time_ms >= from_ms)
        .map(|(_, time_ms, outcome)| (time_ms, outcome.to_owned()))
        .collect()
}

/// The resumption across cells: the earliest of each cell's [`first_admission_after`] the floor
/// (`None` for a cell that admitted none).
pub fn resumed_at(firsts: impl IntoIterator<Item = Option<u64>>) -> Option<u64> {
    firsts.into_iter().flatten().min()
}
/// One lease as a member held it by its own clock: `[acquired_us, released_us, tokens]`, from
/// the moment `acquire` returned to the moment `release` was called (wall-clock microseconds).
/// Redis held the lease at least that long, so leases that overlap here overlapped on Redis.
pub type Hold = [u64; 3];

/// The most tokens and the most leases held at once across `holds`. A lease that starts at the
/// very microsecond another ends counts as overlapping it (on the server it did: the one was
/// admitted before the microsecond, the other released after it).
pub fn peak_held(holds: &[Hold]) -> (u64, u64) {
    // (time, 0 = starts before 1 = ends at the same time, tokens)
    let mut edges: Vec<(u64, u8, u64)> = Vec::with_capacity(holds.len() * 2);
    for &[start, end, tokens] in holds {
        edges.push((start, 0, tokens));
        edges.push((end.max(start), 1, tokens));
    }
    edges.sort_unstable();
    let (mut tokens, mut leases, mut peak_tokens, mut peak_leases) = (0u64, 0u64, 0u64, 0u64);
    for (_, edge, amount) in edges {
        if edge == 0 {
            tokens += amount;
            leases += 1;
            peak_tokens = peak_tokens.max(tokens);
            peak_leases = peak_leases.max(leases);
        } else {
            tokens = tokens.saturating_sub(amount);
            leases = leases.saturating_sub(1);
        }
    }
    (peak_tokens, peak_leases)
}

/// `ms` as seconds after `origin_ms`, `+1.23 s` (negative before it).
pub fn offset(ms: u64, origin_ms: u64) -> String {
    let seconds = (ms as f64 - origin_ms as f64) / 1_000.0;
    format!("{seconds:+.2} s")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(job: &str, kind: EndKind, deadline_ms: Option<u64>) -> JobEnd {
        JobEnd {
            job: job.into(),
            kind,
            deadline_ms,
            error: None,
        }
    }

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn only_deadlines_between_the_fault_and_the_resumption_are_excused() {
        let outage = Outage::pause(10_000, Duration::from_secs(3));
        // Admission resumed at 13,040: no allowance after it.
        let resumed = Some(13_040);
        assert!(!outage.covers(9_999, resumed));
        assert!(outage.covers(10_000, resumed));
        assert!(outage.covers(13_040, resumed));
        assert!(!outage.covers(13_041, resumed));
        // Admission never resumed: nothing is excused (and the run fails for it).
        assert!(!outage.covers(10_500, None));

        let ends = [
            (0, end("a", EndKind::TimedOut, Some(9_000))), // before the fault
            (0, end("b", EndKind::TimedOut, Some(10_500))), // inside
            (1, end("c", EndKind::Failed, Some(13_040))),  // at the resumption
            (1, end("d", EndKind::Failed, Some(16_000))),  // failed early, deadline long after
            (2, end("e", EndKind::Failed, None)),          // not a lease wait
            (3, end("f", EndKind::TimedOut, Some(13_041))), // 1 ms after the resumption
        ];
        let judged = judge(ends.iter().map(|(m, e)| (*m, e)), Some(&outage), resumed);
        assert_eq!(judged.failed, 6);
        assert_eq!(judged.timed_out, 3);
        assert_eq!(judged.inside, 2);
        let outside: Vec<(u32, &str)> = judged
            .outside
            .iter()
            .map(|(m, e)| (*m, e.job.as_str()))
            .collect();
        assert_eq!(outside, [(0, "a"), (1, "d"), (2, "e"), (3, "f")]);

        // Without an outage, or without a resumption, nothing is excused.
        let judged = judge(ends.iter().map(|(m, e)| (*m, e)), None, resumed);
        assert_eq!(
            (judged.failed, judged.inside, judged.outside.len()),
            (6, 0, 6)
        );
        let judged = judge(ends.iter().map(|(m, e)| (*m, e)), Some(&outage), None);
        assert_eq!((judged.inside, judged.outside.len()), (0, 6));
        assert_eq!(judge([], Some(&outage), resumed), Judged::default());
    }

    #[test]
    fn a_lossy_restart_resumes_one_ttl_to_one_ttl_and_a_second_after_the_new_process() {
        // Killed at 10 s, spawned again at 12.01 s, ready at 12.03 s.
        let outage = Outage::restart(Fault::Restart, 10_000, 12_010, 12_030, TTL);
        assert_eq!(
            (outage.reference_ms, outage.floor_ms, outage.bound_ms),
            (12_010, 12_010, (10_000, 11_000))
        );
        assert_eq!(outage.reference(), "the new server process started");
        // Before the recovery could have ended: out of bound (the recovery was cut short).
        assert_eq!(outage.resumed(22_009), (9_999, false));
        assert_eq!(outage.resumed(22_010), (10_000, true));
        assert_eq!(outage.resumed(23_010), (11_000, true));
        assert_eq!(outage.resumed(23_011), (11_001, false));
        assert_eq!(outage.ready_ms, Some(12_030));
    }

    #[test]
    fn a_lossless_restart_resumes_within_half_a_second_of_the_server_being_ready() {
        let outage = Outage::restart(Fault::RestartFsync, 10_000, 12_010, 12_030, TTL);
        assert_eq!(
            (outage.reference_ms, outage.floor_ms, outage.bound_ms),
            (12_030, 12_010, (0, 500))
        );
        assert_eq!(outage.resumed(12_031), (1, true));
        // An admission between the spawn and the parent reading the ready line counts as 0 ms.
        assert_eq!(outage.resumed(12_020), (0, true));
        assert_eq!(outage.resumed(12_530), (500, true));
        assert_eq!(outage.resumed(12_531), (501, false));
        // Times seen out of order are clamped: no spawn before the kill, no ready before it.
        let odd = Outage::restart(Fault::RestartFsync, 10_000, 9_000, 8_000, TTL);
        assert_eq!((odd.floor_ms, odd.ready_ms), (10_000, Some(10_000)));
    }

    #[test]
    fn a_pause_and_a_killed_member_are_bound_from_the_pauses_end_and_the_kill() {
        let pause = Outage::pause(10_000, Duration::from_secs(3));
        assert_eq!(
            (pause.reference_ms, pause.floor_ms, pause.bound_ms),
            (13_000, 13_000, (0, 500))
        );
        assert_eq!(pause.resumed(13_500), (500, true));
        assert_eq!(pause.resumed(13_501), (501, false));
        let kill = Outage::kill_member(10_000, 3);
        assert_eq!(
            (kill.reference_ms, kill.bound_ms, kill.killed),
            (10_000, (0, 1_000), Some(3))
        );
        assert_eq!(kill.resumed(11_000), (1_000, true));
        assert_eq!(kill.resumed(11_001), (1_001, false));
        assert_eq!(kill.reference(), "the kill");
    }

    #[test]
    fn a_failovers_bound_depends_on_what_the_replica_may_have_missed() {
        // Killed at 10 s, the slot served by a replica at 12.1 s, the cluster ok at 12.15 s.
        let killed = Outage::failover(Fault::KillMaster, 10_000, 12_100, 12_150, TTL);
        assert_eq!(
            killed,
            Outage {
                fault: Fault::KillMaster,
                start_ms: 10_000,
                reference_ms: 12_150,
                floor_ms: 12_150,
                bound_ms: (7_850, 11_000),
                ready_ms: None,
                elected_ms: Some(12_100),
                ok_ms: Some(12_150),
                killed: None,
            }
        );
        assert_eq!(killed.election_ms(), Some(2_100));
        // No earlier than one TTL after the kill, at most a TTL and a second after the return.
        assert!(!killed.resumed(19_999).1);
        assert!(killed.resumed(20_000).1);
        assert_eq!(killed.resumed(23_150), (11_000, true));
        assert!(!killed.resumed(23_151).1);

        // A planned failover that lost nothing: within a second of the new master answering.
        let planned = Outage::failover(Fault::Failover, 10_000, 10_300, 10_350, TTL);
        assert_eq!(
            (planned.reference_ms, planned.floor_ms, planned.bound_ms),
            (10_300, 10_300, (0, 1_000))
        );
        assert_eq!(planned.reference(), "the new master answered");
        assert_eq!(planned.resumed(11_300), (1_000, true));
        assert!(!planned.resumed(11_301).1);
        // Times seen out of order are clamped.
        let odd = Outage::failover(Fault::KillMaster, 10_000, 9_000, 8_000, TTL);
        assert_eq!(
            (odd.elected_ms, odd.ok_ms, odd.election_ms()),
            (Some(10_000), Some(10_000), Some(0))
        );
        // Other faults have no election.
        assert_eq!(Outage::pause(0, TTL).election_ms(), None);
    }

    #[test]
    fn the_first_admission_is_the_earliest_admitted_record_at_or_after_the_floor() {
        let records = [
            ("admitted", 11_990), // before the floor
            ("queued", 12_000),
            ("completed", 12_003),
            ("admitted", 12_040),
            ("admitted", 12_007), // out of order: still the earliest
            ("expired", 12_001),
            ("admitted", 12_100),
        ];
        assert_eq!(first_admission_after(records, 12_000), Some(12_007));
        // At the very millisecond of the floor counts.
        assert_eq!(
            first_admission_after([("admitted", 12_000), ("admitted", 12_001)], 12_000),
            Some(12_000)
        );
        assert_eq!(first_admission_after(records, 12_101), None);
        assert_eq!(first_admission_after([("queued", 13_000)], 12_000), None);
        assert_eq!(first_admission_after([], 12_000), None);

        // Across cells: the earliest of their firsts; cells with none ignored.
        assert_eq!(resumed_at([Some(12_040), None, Some(12_012)]), Some(12_012));
        assert_eq!(resumed_at([None, None]), None);
        assert_eq!(resumed_at([]), None);
    }

    #[test]
    fn recoveries_are_the_recovering_records_after_the_fault() {
        let records = [
            ("recovering", 9_000, "created"),
            ("admitted", 12_000, ""),
            ("recovering", 12_010, "restarted"),
            ("recovering", 12_020, "promoted"),
        ];
        assert_eq!(
            recoveries_after(records, 10_000),
            [
                (12_010, "restarted".to_owned()),
                (12_020, "promoted".to_owned())
            ]
        );
        assert!(recoveries_after(records, 12_021).is_empty());
    }

    #[test]
    fn held_peaks_add_overlapping_leases_and_count_touching_ones_as_overlapping() {
        assert_eq!(peak_held(&[]), (0, 0));
        // 100..200 (5,000 tokens), 150..300 (3,000), 300..400 (4,000): the last starts the
        // microsecond the second ends, so they overlap; the first ended before either.
        let holds = [[100, 200, 5_000], [150, 300, 3_000], [300, 400, 4_000]];
        assert_eq!(peak_held(&holds), (8_000, 2));
        assert_eq!(peak_held(&[[0, 10, 7], [10, 20, 7], [10, 30, 7]]), (21, 3));
        // Disjoint leases never add up; an end before its start is read as a point.
        assert_eq!(peak_held(&[[0, 9, 7], [10, 20, 8], [30, 25, 9]]), (9, 1));
    }

    #[test]
    fn faults_name_their_promise_and_offsets_are_signed_seconds() {
        assert_eq!(offset(12_346, 10_000), "+2.35 s");
        assert_eq!(offset(9_500, 10_000), "-0.50 s");
        let names: Vec<&str> = Fault::value_variants().iter().map(|f| f.name()).collect();
        assert_eq!(
            names,
            [
                "restart",
                "restart-fsync",
                "pause",
                "kill-member",
                "kill-master",
                "failover"
            ]
        );
        // The command line spells each as its name.
        for fault in Fault::value_variants() {
            assert_eq!(
                fault.to_possible_value().map(|v| v.get_name().to_owned()),
                Some(fault.name().to_owned())
            );
        }
        let lossless: Vec<Fault> = Fault::value_variants()
            .iter()
            .copied()
            .filter(|f| f.lossless())
            .collect();
        assert_eq!(lossless, [Fault::RestartFsync, Fault::Failover]);
        assert_eq!(Fault::RestartFsync.promise(), Promise::FsyncAlways);
        assert_eq!(Fault::Failover.promise(), Promise::OneReplica);
        assert_eq!(Fault::Restart.promise(), Promise::Nothing);
        assert_eq!(Fault::KillMaster.promise(), Promise::Nothing);
    }
}
