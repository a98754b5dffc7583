//! The contract suite's backend tests, from one body: every provider of the workspace runs each
//! rule of `admission_db::contract` as a test of its own on a fresh subject ([`rule`]), and then,
//! if its verbs reach the database, `run_all_transactional` once ([`whole_suite`]). A backend
//! names its subject with [`contract_rules!`]; a subject whose server is not there (PostgreSQL
//! without `ADMISSION_PG_URL`) fails its tests, saying how to start it.

use admission_db::contract::{self, TransactionalSubject};

/// Jobs through the monitor in the shared-bound rule.
pub(crate) const JOBS: u32 = 200;

/// A subject the suite makes afresh for every rule.
pub(crate) trait Fresh: Sized {
    /// A fresh subject for `test`: a new database behind a pool larger than the bound (a
    /// failure, saying how to start it, when the backend's server is not there).
    fn fresh(test: &str) -> Self;
}

/// One rule's test: `check` on a fresh subject.
pub(crate) fn rule<S: Fresh>(test: &str, check: impl FnOnce(&S)) {
    check(&S::fresh(test));
}

/// `run_all_transactional` on fresh subjects, its shared-bound rule with `jobs` jobs.
pub(crate) fn whole_suite<S: Fresh + TransactionalSubject>(test: &str, jobs: u32) {
    contract::run_all_transactional(|| S::fresh(test), jobs);
}

/// The suite's tests for one subject type, in a module of their own:
/// - `contract_rules!(module: Subject, bound only)`: the rules for any provider (the counting
///   provider's, whose verbs reach no database);
/// - `contract_rules!(module: Subject, whole suite with JOBS)`: every rule, each a test, then
///   `run_all_transactional_runs_every_rule_on_fresh_databases` with that many jobs.
macro_rules! contract_rules {
    (@each $subject:ty: $($rule:ident $(($arg:expr))?),* $(,)?) => {
        $(
            #[test]
            fn $rule() {
                $crate::contract_suite::rule::<$subject>(stringify!($rule), |subject| {
                    admission_db::contract::$rule(subject $(, $arg)?)
                });
            }
        )*
    };
    (@any $subject:ty) => {
        $crate::contract_suite::contract_rules!(@each $subject:
            admission_is_a_release_gate_refusing_a_demand_over_the_bound,
            acquire_takes_no_permit_and_close_is_idempotent,
            a_close_after_abort_still_gives_the_connection_back,
            a_handle_from_another_provider_is_refused,
            jobs_sharing_a_bound_never_hold_more_connections_than_the_bound(
                $crate::contract_suite::JOBS
            ),
            a_job_cancelled_while_waiting_never_opens_a_connection,
        );
    };
    ($module:ident: $subject:ty, bound only) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            $crate::contract_suite::contract_rules!(@any $subject);
        }
    };
    ($module:ident: $subject:ty, whole suite with $jobs:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            $crate::contract_suite::contract_rules!(@any $subject);
            $crate::contract_suite::contract_rules!(@each $subject:
                one_handle_runs_several_transactions,
                an_uncommitted_row_is_invisible_elsewhere_until_commit,
                a_dropped_handle_never_leaves_a_transaction_open,
                a_read_only_handle_refuses_writes_and_goes_back_as_handed_out,
            );

            #[test]
            fn run_all_transactional_runs_every_rule_on_fresh_databases() {
                $crate::contract_suite::whole_suite::<$subject>(
                    "run_all_transactional_runs_every_rule_on_fresh_databases",
                    $jobs,
                );
            }
        }
    };
}

pub(crate) use contract_rules;
