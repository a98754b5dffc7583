//! [`LeaseRequest`]: what one acquisition asks the cell for, checked before it leaves, and the
//! digest under which tenant and backend ids reach Redis.

use sha2::{Digest, Sha256};

use crate::config::{MAX_EXACT, hex};
use crate::error::{Dimension, NeverReason};

/// One request for a fleet lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The lease id, unique while held: 1 to 128 of `[A-Za-z0-9_.:-]`.
    pub id: String,
    /// The tenant (hashed with SHA-256 before it reaches Redis).
    pub tenant: String,
    /// The physical backend (hashed likewise).
    pub backend: String,
    /// Bytes the transfer may hold in memory at once.
    pub footprint: u64,
    /// A bounded operation label, 1 to 32 of `[a-z0-9_]` (`upload`, `download`, ...).
    pub operation: String,
    /// What the lease spends of the cell's requests per minute ([`Rates`](crate::Rates)) when it
    /// is granted: 1 for one call (the default), more for a slice of the rate that several calls
    /// will spend ([`RateSlices`](crate::RateSlices)). Ignored by a cell without rates.
    pub requests: u64,
    /// The priority level the request waits at, by name, in a cell configured with
    /// [`levels`](crate::RedisAdmissionConfig::levels) (`None`: the default level). A name the
    /// cell does not know is refused before any call ([`NeverReason::UnknownLevel`]).
    pub level: Option<String>,
}

impl LeaseRequest {
    /// A request.
    pub fn new(
        id: impl Into<String>,
        tenant: impl Into<String>,
        backend: impl Into<String>,
        footprint: u64,
        operation: impl Into<String>,
    ) -> LeaseRequest {
        LeaseRequest {
            id: id.into(),
            tenant: tenant.into(),
            backend: backend.into(),
            footprint,
            operation: operation.into(),
            requests: 1,
            level: None,
        }
    }

    /// The same request spending `requests` of the cell's requests per minute instead of 1.
    #[must_use]
    pub fn with_requests(mut self, requests: u64) -> LeaseRequest {
        self.requests = requests;
        self
    }

    /// The same request at the priority level named `level`.
    #[must_use]
    pub fn with_level(mut self, level: impl Into<String>) -> LeaseRequest {
        self.level = Some(level.into());
        self
    }

    /// Why the request can never be admitted by a cell whose service byte ceiling is
    /// `service_bytes`, whatever the cell holds, if it cannot; checked before any call.
    pub(crate) fn check(&self, service_bytes: u64) -> Result<(), NeverReason> {
        let id_ok = (1..=128).contains(&self.id.len())
            && self
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b));
        if !id_ok {
            return Err(NeverReason::BadId(self.id.clone()));
        }
        let op_ok = (1..=32).contains(&self.operation.len())
            && self
                .operation
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !op_ok {
            return Err(NeverReason::BadOperation(self.operation.clone()));
        }
        if self.footprint == 0 {
            return Err(NeverReason::EmptyFootprint);
        }
        if self.requests == 0 || self.requests > MAX_EXACT {
            return Err(NeverReason::NoRequests);
        }
        if self.footprint > MAX_EXACT {
            return Err(NeverReason::OverCeiling {
                dimension: Dimension::ServiceBytes,
                asked: self.footprint,
                ceiling: service_bytes,
            });
        }
        Ok(())
    }

    /// What the request adds to `dimension`.
    pub(crate) fn asked_on(&self, dimension: Dimension) -> u64 {
        match dimension {
            Dimension::ServiceBytes | Dimension::TenantBytes | Dimension::TokensPerMinute => {
                self.footprint
            }
            Dimension::RequestsPerMinute => self.requests,
            _ => 1,
        }
    }
}

/// The SHA-256 hex digest under which a tenant or backend id appears in keys and events.
pub fn hashed_id(id: &str) -> String {
    hex(&Sha256::digest(id.as_bytes()))
}
