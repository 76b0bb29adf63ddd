//! The event log's conformance suite, against a real PostgreSQL.

mod archive;
mod atomicity;
mod chain;
mod concurrency;
mod epoch;
mod gaps;
mod group;
mod heads;
mod idempotency;
mod ledger_order;
mod order;
mod outages;
mod paging;
mod relay;
mod seals;
mod shape;
mod snapshots;
mod validation;
