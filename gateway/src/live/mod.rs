//! Live events for subscriptions: one [`hub::Hub`] per process tails the log and broadcasts
//! what it reads; each subscription's [`feed::Feed`] delivers every event after its cursor,
//! in log order, exactly once, reading the log itself whenever the hub cannot vouch for the
//! next events (at the start, after falling behind, after a gap).

pub mod feed;
pub mod hub;
