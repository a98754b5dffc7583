//! The events stream, read back as typed records (schema `admission-event-v1`).

use std::collections::HashMap;

use crate::coordinator::RedisAdmission;
use crate::error::Unavailable;
use crate::script::Occupancy;

/// One record of the cell's events stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetEvent {
    /// The stream record id (`ms-seq`).
    pub id: String,
    /// The schema version (`admission-event-v1`).
    pub schema: String,
    /// `admitted`, `queued`, `timed_out`, `completed`, `interrupted`, `failed`, `expired` or
    /// `policy_changed`.
    pub kind: String,
    /// Server time of the transition, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The lease id (empty for a policy change).
    pub lease: String,
    /// The fencing token (0 where none applies).
    pub token: u64,
    /// SHA-256 of the tenant id.
    pub tenant: String,
    /// SHA-256 of the backend id (empty for a policy change).
    pub backend: String,
    /// The footprint in bytes.
    pub footprint: u64,
    /// The operation label.
    pub operation: String,
    /// The outcome label.
    pub outcome: String,
    /// The policy version in force.
    pub policy_version: u64,
    /// Occupancy after the transition.
    pub occupancy: Occupancy,
    /// In a cell with fair shares or levels, the level of the lease or waiter (`queued`,
    /// `admitted`, `timed_out`), by rank in the config's
    /// [`levels`](crate::RedisAdmissionConfig::levels), 0 the highest (0 for every record of
    /// a cell with fair shares and no levels); `None` in another cell and for other records.
    pub level: Option<u32>,
}

impl FleetEvent {
    fn from_fields(id: String, fields: &HashMap<String, redis::Value>) -> FleetEvent {
        let text = |name: &str| -> String {
            fields
                .get(name)
                .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                .unwrap_or_default()
        };
        let int = |name: &str| -> u64 { text(name).parse().unwrap_or(0) };
        let occupancy: Vec<u64> = text("occupancy")
            .split(' ')
            .map(|n| n.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| occupancy.get(i).copied().unwrap_or(0);
        FleetEvent {
            id,
            schema: text("v"),
            kind: text("kind"),
            time_ms: int("time_ms"),
            lease: text("lease"),
            token: int("token"),
            tenant: text("tenant"),
            backend: text("backend"),
            footprint: int("footprint"),
            operation: text("operation"),
            outcome: text("outcome"),
            policy_version: int("policy"),
            occupancy: Occupancy {
                service_bytes: at(0),
                service_transfers: at(1),
                tenant_bytes: at(2),
                tenant_transfers: at(3),
                backend_transfers: at(4),
            },
            level: fields.get("level").and_then(|_| text("level").parse().ok()),
        }
    }
}

/// Every record of the cell's stream still kept (at most the config's `events_max_len`), oldest
/// first.
///
/// # Errors
///
/// [`Unavailable`] when Redis did not answer within the lease TTL (a failure on the connection is
/// retried until then).
pub async fn read_events(admission: &RedisAdmission) -> Result<Vec<FleetEvent>, Unavailable> {
    let cell = &admission.inner.cell;
    let deadline = tokio::time::Instant::now() + cell.config.lease_ttl;
    let records = cell.read_stream(deadline).await?;
    Ok(records
        .into_iter()
        .map(|record| FleetEvent::from_fields(record.id, &record.map))
        .collect())
}
