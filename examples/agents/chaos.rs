//! `--fleet N --chaos FAULT`: one real fault, injected by the fleet's parent itself at a fixed
//! real time after its members started, and the arithmetic of the verdict that follows.
//!
//! The faults (what `cargo xtask chaos` runs, one each):
//!
//! - `restart`: the private `redis-server` is SIGKILLed and started again on the same port
//!   `--chaos-down-ms` later ([`DEFAULT_DOWN_MS`] by default). For this fault it runs with an
//!   append-only file (fsync every second; a killed process loses nothing it acknowledged, the
//!   page cache survives it), so the cells come back as they were. The restarted server is
//!   another process, so each cell recovers for one lease TTL after its first call (it admits
//!   nothing new while the members renew their leases back): the outage lasts until then.
//! - `pause`: `CLIENT PAUSE` for `--chaos-pause-ms` ([`DEFAULT_PAUSE_MS`] by default; every
//!   client's commands wait on the server).
//! - `kill-member`: the last member is SIGKILLed. Its leases stay held until their TTL and its
//!   waiting tickets until their liveness runs out (one TTL too; a ticket the line grants
//!   before then gets a lease that expires with that liveness), so the outage is the TTL.
//! - `kill-master`: on a private six-node Redis Cluster (`admission_redis::test_util`, started by
//!   the parent for this fault), the master serving the first model's cell (its slot found with
//!   `CLUSTER KEYSLOT` and `CLUSTER NODES`) is SIGKILLed. The parent polls until a replica took
//!   the slot over (the election, 2 to 3 s with the nodes' 1 s timeout) and every node left says
//!   `cluster_state:ok` (the cluster's return). The promoted replica is another process, so each
//!   cell it now serves recovers for one lease TTL: the outage lasts from the kill to the
//!   election plus one TTL ([`Outage::failover`]). The cells on the other masters are served
//!   throughout.
//!
//! The outage is the window of wall-clock time (milliseconds since the Unix epoch, the clock
//! every process of the machine shares) during which the fleet could not be served: from the
//! fault to the server's answer again (restart: its "ready" line, plus the cells' recovery of one
//! TTL; pause: the pause's end, timed from the command's reply), to the dead member's TTL, or to
//! the election plus the promoted replica's recovery of one TTL. A job that did not complete is
//! excused only if its *own* deadline (the deadline of the fleet-lease wait that ended it, as its
//! member recorded it) fell inside that window, or within [`RECONNECT_ALLOWANCE`] after it; any
//! other failed or timed-out job fails the run, as does one whose end had no lease deadline.
//!
//! After a restart, a pause or a failover the verdict also gives the time from the server's
//! return (its "ready" line, the pause's end, the cluster ok again) to the first admission after
//! it: the earliest `admitted` record of the cells' events streams (after a failover, of the
//! cells the killed master served) whose server time is at or after the return
//! ([`first_admission_after`]); after a restart or a failover, that is the recovery's price.
//! After a failover it also gives the election's time, from the kill.
//! Both are wall-clock milliseconds of this machine, which the server and the processes share.

use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use admission_redis::test_util::{self, PrivateCluster};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::redis_server::{self, Endpoint, PrivateRedis};

/// How long the server stays down in a `restart` unless `--chaos-down-ms` says otherwise.
pub const DEFAULT_DOWN_MS: u64 = 2_000;
/// How long a `pause` pauses the server's clients unless `--chaos-pause-ms` says otherwise.
pub const DEFAULT_PAUSE_MS: u64 = 3_000;
/// After the server answers again, the time a client may need to notice and reconnect: a job
/// whose deadline fell this soon after the outage is excused too.
pub const RECONNECT_ALLOWANCE: Duration = Duration::from_millis(500);
/// How long after a `kill-master` a replica must have taken the slot over and the cluster be ok
/// again, or the fault failed.
pub const ELECTION_LIMIT: Duration = Duration::from_secs(30);

/// The fault a `--chaos` run injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fault {
    /// SIGKILL the private redis-server and start it again on the same port `--chaos-down-ms`
    /// later (it keeps an append-only file for this).
    Restart,
    /// `CLIENT PAUSE` on the server for `--chaos-pause-ms`: no client's command runs meanwhile.
    Pause,
    /// SIGKILL the last member process; its leases are held until their TTL.
    KillMember,
    /// SIGKILL the master serving the first model's cell on a private six-node Redis Cluster;
    /// a replica takes over and the cell recovers for one lease TTL.
    KillMaster,
}

impl Fault {
    /// The name the command line spells.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Restart => "restart",
            Fault::Pause => "pause",
            Fault::KillMember => "kill-member",
            Fault::KillMaster => "kill-master",
        }
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

/// The window a fault kept the fleet from being served, wall-clock milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outage {
    /// The fault.
    pub fault: Fault,
    /// When it began (the moment before the fault was injected).
    pub start_ms: u64,
    /// When the fleet could be served again (after a restart or a failover: once the cells
    /// recovered).
    pub end_ms: u64,
    /// When the server answered again (a restart, a pause) or the cluster was ok again (a
    /// failover), or `end_ms`.
    pub returned_ms: u64,
    /// After a failover: when a replica was seen serving the killed master's slot.
    pub elected_ms: Option<u64>,
}

impl Outage {
    /// Whether a job whose deadline was `deadline_ms` is excused: the deadline fell inside the
    /// window or within `allowance` after it.
    pub fn covers(&self, deadline_ms: u64, allowance: Duration) -> bool {
        self.start_ms <= deadline_ms && deadline_ms <= self.end_ms.saturating_add(millis(allowance))
    }

    /// The outage of a master killed at `start_ms` whose slot a replica was seen serving at
    /// `elected_ms`, the cluster ok again at `ok_ms`: it lasts to the election plus one
    /// `lease_ttl` (the cells' recovery on the promoted replica, which admits nothing new), and
    /// the cluster returned when it was ok again.
    pub fn failover(start_ms: u64, elected_ms: u64, ok_ms: u64, lease_ttl: Duration) -> Outage {
        let elected_ms = elected_ms.max(start_ms);
        Outage {
            fault: Fault::KillMaster,
            start_ms,
            end_ms: elected_ms.saturating_add(millis(lease_ttl)),
            returned_ms: ok_ms.max(elected_ms),
            elected_ms: Some(elected_ms),
        }
    }

    /// After a failover, the election's time from the kill, in milliseconds.
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
    /// Each model's cell, by a key of it, in the parent's order: a `kill-master` kills the
    /// master serving the first.
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
    /// The master on port `killed` was SIGKILLed at `start_ms`: waiting, until `give_up`, for a
    /// replica to serve `slot` (`elected`: seen at that wall-clock ms, on that port) and the
    /// cluster to be ok again.
    Electing {
        start_ms: u64,
        slot: u16,
        killed: u16,
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
    /// The cells' lease TTL: how long a killed member's leases stay held.
    lease_ttl: Duration,
    /// How long a restarted server stays down.
    down: Duration,
    /// How long a pause lasts.
    pause: Duration,
    phase: Phase,
    /// Whether its injection was tried.
    tried: bool,
    /// The outage, once its end is known.
    pub outage: Option<Outage>,
    /// The member it killed.
    pub killed: Option<u32>,
    /// The models whose cells the fault reached, when not every one: after a `kill-master`,
    /// those the killed master served.
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
    /// server again when its down time is over, and looks whether a killed master's slot was
    /// taken over. Answers a line for the log when it acted.
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
            Fault::Restart => {
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
                        let end_ms = wall_ms().saturating_add(millis(self.pause));
                        self.outage = Some(Outage {
                            fault: self.fault,
                            start_ms,
                            end_ms,
                            returned_ms: end_ms,
                            elected_ms: None,
                        });
                        format!(
                            "chaos: CLIENT PAUSE {} sent at {at}; the pause ends by {}",
                            millis(self.pause),
                            offset(end_ms, self.origin_ms)
                        )
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
                let end_ms = start_ms.saturating_add(millis(self.lease_ttl));
                self.outage = Some(Outage {
                    fault: self.fault,
                    start_ms,
                    end_ms,
                    returned_ms: end_ms,
                    elected_ms: None,
                });
                format!(
                    "chaos: process {index} SIGKILLed at {at}; its leases and tickets are held until their TTL, by {}",
                    offset(end_ms, self.origin_ms)
                )
            }
            Fault::KillMaster => self.kill_master(targets),
        }
    }

    /// `kill-master`: finds the master serving the first cell's slot, SIGKILLs it, and starts
    /// waiting for the election.
    fn kill_master(&mut self, targets: Targets<'_>) -> String {
        let Some(cluster) = targets.cluster else {
            return self.fail("there is no private Redis Cluster to kill a master of".into());
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
        let Some(master) = test_util::master_of_slot(&nodes, slot) else {
            return self.fail(format!("no master serves slot {slot} before the kill"));
        };
        // The cells the same master serves go through the same failover.
        let affected: Vec<String> = targets
            .cells
            .iter()
            .filter(|(_, key)| cluster.keyslot(key).is_some_and(|s| master.serves(s)))
            .map(|(model, _)| model.clone())
            .collect();
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
            killed: master.port,
            give_up: Instant::now() + ELECTION_LIMIT,
            elected: None,
        };
        let line = format!(
            "chaos: master {} (slot {slot}, {model}'s cell; cells on it: {}) SIGKILLed at {}; waiting for a replica to take over",
            master.address(),
            affected.join(", "),
            offset(start_ms, self.origin_ms)
        );
        self.affected = Some(affected);
        line
    }

    /// While a killed master's election is awaited: whether a replica serves its slot now, and
    /// once one does, whether every node left says the cluster is ok; then the outage.
    fn watch_election(&mut self, now: Instant, targets: Targets<'_>) -> Option<String> {
        let Phase::Electing {
            start_ms,
            slot,
            killed,
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
        let elected = elected.or_else(|| {
            let nodes = cluster.view()?;
            let master = test_util::master_of_slot(&nodes, slot)?;
            (master.port != killed).then(|| (wall_ms(), master.port))
        });
        if let Some((elected_ms, by)) = elected
            && cluster.all_ok()
        {
            let outage = Outage::failover(start_ms, elected_ms, wall_ms(), self.lease_ttl);
            let line = format!(
                "chaos: failover: 127.0.0.1:{by} took slot {slot} over at {}, {} ms after the kill; the cluster was ok again at {}; the cells on it recover (admit nothing new) until about {}",
                offset(outage.elected_ms.unwrap_or(elected_ms), self.origin_ms),
                outage.election_ms().unwrap_or(0),
                offset(outage.returned_ms, self.origin_ms),
                offset(outage.end_ms, self.origin_ms)
            );
            self.outage = Some(outage);
            self.phase = Phase::Over;
            return Some(line);
        }
        if now >= give_up {
            self.phase = Phase::Over;
            return Some(self.fail(match elected {
                Some(_) => format!(
                    "a replica took slot {slot} over, but the cluster was not ok again within {} s of the kill",
                    ELECTION_LIMIT.as_secs()
                ),
                None => format!(
                    "no replica took slot {slot} over within {} s of the kill",
                    ELECTION_LIMIT.as_secs()
                ),
            }));
        }
        self.phase = Phase::Electing {
            start_ms,
            slot,
            killed,
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
        match server.restart() {
            Ok(()) => {
                let ready_ms = wall_ms();
                // A restarted server makes every cell recover: nothing new is admitted for one
                // lease TTL after its first call, so the outage a job sees lasts that long more.
                let end_ms = ready_ms.saturating_add(millis(self.lease_ttl));
                self.outage = Some(Outage {
                    fault: self.fault,
                    start_ms,
                    end_ms,
                    returned_ms: ready_ms,
                    elected_ms: None,
                });
                format!(
                    "chaos: redis-server ready again at {} (down {:.2} s); the cells recover (admit nothing new) until about {}",
                    offset(ready_ms, self.origin_ms),
                    (ready_ms.saturating_sub(start_ms)) as f64 / 1_000.0,
                    offset(end_ms, self.origin_ms)
                )
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
    /// Of those, jobs whose own deadline fell inside the outage (or its allowance).
    pub inside: u64,
    /// The others, with the member that ran each: each fails the run.
    pub outside: Vec<(u32, JobEnd)>,
}

/// Sorts the failed jobs of every member into excused (their deadline inside `outage`, or within
/// `allowance` after it) and not; with no outage, none is excused.
pub fn judge<'a>(
    ends: impl IntoIterator<Item = (u32, &'a JobEnd)>,
    outage: Option<&Outage>,
    allowance: Duration,
) -> Judged {
    let mut judged = Judged::default();
    for (member, end) in ends {
        judged.failed += 1;
        if end.kind == EndKind::TimedOut {
            judged.timed_out += 1;
        }
        let excused = match (outage, end.deadline_ms) {
            (Some(outage), Some(deadline)) => outage.covers(deadline, allowance),
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

/// The server time of the first admission at or after `end_ms`: the earliest `admitted` record
/// among `records` (kind, server `time_ms`), in any order, whose time is not before `end_ms`.
pub fn first_admission_after<'a>(
    records: impl IntoIterator<Item = (&'a str, u64)>,
    end_ms: u64,
) -> Option<u64> {
    records
        .into_iter()
        .filter(|&(kind, time_ms)| kind == "admitted" && time_ms >= end_ms)
        .map(|(_, time_ms)| time_ms)
        .min()
}

/// Milliseconds from the outage's end to the first admission after it, across cells: `firsts`
/// holds each cell's [`first_admission_after`] the end (`None` for a cell that admitted none).
pub fn since_return(firsts: impl IntoIterator<Item = Option<u64>>, end_ms: u64) -> Option<u64> {
    firsts
        .into_iter()
        .flatten()
        .min()
        .map(|first| first.saturating_sub(end_ms))
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

    #[test]
    fn only_deadlines_inside_the_outage_or_its_allowance_are_excused() {
        let outage = Outage {
            fault: Fault::Restart,
            start_ms: 10_000,
            end_ms: 12_050,
            returned_ms: 12_050,
            elected_ms: None,
        };
        let allowance = Duration::from_millis(500);
        assert!(!outage.covers(9_999, allowance));
        assert!(outage.covers(10_000, allowance));
        assert!(outage.covers(12_050, allowance));
        assert!(outage.covers(12_550, allowance));
        assert!(!outage.covers(12_551, allowance));

        let ends = [
            (0, end("a", EndKind::TimedOut, Some(9_000))), // before the fault
            (0, end("b", EndKind::TimedOut, Some(10_500))), // inside
            (1, end("c", EndKind::Failed, Some(12_400))),  // inside the allowance
            (1, end("d", EndKind::Failed, Some(16_000))),  // failed early, deadline long after
            (2, end("e", EndKind::Failed, None)),          // not a lease wait
            (3, end("f", EndKind::TimedOut, Some(12_551))), // 1 ms past the allowance
        ];
        let judged = judge(ends.iter().map(|(m, e)| (*m, e)), Some(&outage), allowance);
        assert_eq!(judged.failed, 6);
        assert_eq!(judged.timed_out, 3);
        assert_eq!(judged.inside, 2);
        let outside: Vec<(u32, &str)> = judged
            .outside
            .iter()
            .map(|(m, e)| (*m, e.job.as_str()))
            .collect();
        assert_eq!(outside, [(0, "a"), (1, "d"), (2, "e"), (3, "f")]);

        // Without an outage nothing is excused.
        let judged = judge(ends.iter().map(|(m, e)| (*m, e)), None, allowance);
        assert_eq!(
            (judged.failed, judged.inside, judged.outside.len()),
            (6, 0, 6)
        );
        assert_eq!(judge([], Some(&outage), allowance), Judged::default());
    }

    #[test]
    fn the_first_admission_is_the_earliest_admitted_record_at_or_after_the_return() {
        let records = [
            ("admitted", 11_990), // before the return
            ("queued", 12_000),
            ("completed", 12_003),
            ("admitted", 12_040),
            ("admitted", 12_007), // out of order: still the earliest
            ("expired", 12_001),
            ("admitted", 12_100),
        ];
        assert_eq!(first_admission_after(records, 12_000), Some(12_007));
        // At the very millisecond of the return counts.
        assert_eq!(
            first_admission_after([("admitted", 12_000), ("admitted", 12_001)], 12_000),
            Some(12_000)
        );
        assert_eq!(first_admission_after(records, 12_101), None);
        assert_eq!(first_admission_after([("queued", 13_000)], 12_000), None);
        assert_eq!(first_admission_after([], 12_000), None);

        // Across cells: the earliest of their firsts, less the return; cells with none ignored.
        assert_eq!(
            since_return([Some(12_040), None, Some(12_012)], 12_000),
            Some(12)
        );
        assert_eq!(since_return([Some(12_000)], 12_000), Some(0));
        assert_eq!(since_return([None, None], 12_000), None);
        assert_eq!(since_return([], 12_000), None);
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
    fn offsets_are_signed_seconds() {
        assert_eq!(offset(12_346, 10_000), "+2.35 s");
        assert_eq!(offset(9_500, 10_000), "-0.50 s");
        assert_eq!(Fault::KillMember.name(), "kill-member");
        assert_eq!(Fault::KillMaster.name(), "kill-master");
    }

    #[test]
    fn a_failovers_outage_lasts_to_the_election_plus_one_ttl() {
        let ttl = Duration::from_secs(10);
        // Killed at 10 s, the slot served by a replica at 12.1 s, the cluster ok at 12.15 s.
        let outage = Outage::failover(10_000, 12_100, 12_150, ttl);
        assert_eq!(
            outage,
            Outage {
                fault: Fault::KillMaster,
                start_ms: 10_000,
                end_ms: 22_100,
                returned_ms: 12_150,
                elected_ms: Some(12_100),
            }
        );
        assert_eq!(outage.election_ms(), Some(2_100));
        // A job whose wait ended in the recovery, or just after it, is excused; later, not.
        let allowance = RECONNECT_ALLOWANCE;
        assert!(outage.covers(10_000, allowance));
        assert!(outage.covers(22_100, allowance));
        assert!(outage.covers(22_600, allowance));
        assert!(!outage.covers(22_601, allowance));
        assert!(!outage.covers(9_999, allowance));
        // Times seen out of order are clamped: no election before the kill, no return before it.
        let odd = Outage::failover(10_000, 9_000, 8_000, ttl);
        assert_eq!(
            (odd.end_ms, odd.returned_ms, odd.election_ms()),
            (20_000, 10_000, Some(0))
        );
        // Other faults have no election.
        let restart = Outage {
            fault: Fault::Restart,
            start_ms: 0,
            end_ms: 1,
            returned_ms: 1,
            elected_ms: None,
        };
        assert_eq!(restart.election_ms(), None);
    }
}
