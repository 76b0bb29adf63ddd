//! Host agents: the HTTP contract of fuse's host agent (`docs/fuse-host-agent-protocol.md`),
//! spoken by Leasehold's client (`agent.rs`) and by `leasehold backend-sim --host-agent`, and
//! the wire shapes both share (`wire.rs`), and the artifact grant one agent shows another
//! (`grant.rs`).

pub mod agent;
pub mod grant;
pub mod wire;

pub use agent::{AgentError, AgentTarget, Deleted, Exported, HostAgentClient};
