//! The account-author interface: what a limit implements ([`Account`](crate::Account) and the
//! [`Ask`](crate::Ask) / [`Answer`](crate::Answer) it answers, [`WakeSlot`](crate::WakeSlot),
//! the [`Gate`](crate::Gate) and the [`GateView`](crate::GateView) it reads) and the one piece of
//! thread state the two sides share (`account::mute`).
//!
//! The engine (`monitor`) depends on this module, never the reverse: nothing here names the
//! monitor, its line or its evaluator (the test `the_contract_module_never_names_the_engine`
//! reads these files to keep it so). Time comes from [`clock`](crate::Clock), amounts from
//! [`Amount`](crate::Amount); both sit beside this module, below the engine.

pub(crate) mod account;
pub(crate) mod gate;
