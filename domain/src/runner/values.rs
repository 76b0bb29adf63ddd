//! A runner lease's own values: its id and instance name, the tier and trust class it runs
//! under, the guest OS and provider kinds it may land on, the command that starts the runner,
//! the resources it is charged, the job it is assigned, and what machine actors report.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::limits::{
    RUNNER_COMMAND_ARG_MAX_BYTES, RUNNER_COMMAND_ARGS_MAX, RUNNER_MEMORY_MB_MAX, RUNNER_VCPU_MAX,
};
use crate::values::{FieldError, Problem, checked_string, uuid_type};

uuid_type!(
    /// A runner lease's id, minted by Leasehold from its tenant and the request's operation
    /// key. Its instance's name is `billet-<id as 32 hex digits>` ([`RunnerLeaseId::instance_name`]):
    /// after a crash between a launch and its record, that name is the only link from an
    /// instance back to its lease.
    RunnerLeaseId,
    stream = "runner-lease"
);

/// The prefix of every runner instance's name.
const INSTANCE_PREFIX: &str = "billet-";

impl RunnerLeaseId {
    /// The name its instance carries at the provider: `billet-<32 lower-case hex digits>`.
    pub fn instance_name(&self) -> String {
        format!("{INSTANCE_PREFIX}{}", self.0.simple())
    }

    /// The lease an instance's name encodes, if it is one of ours (exactly
    /// `billet-<32 lower-case hex digits>`; anything else is not a runner of Leasehold's).
    pub fn of_instance(name: &str) -> Option<Self> {
        let hex = name.strip_prefix(INSTANCE_PREFIX)?;
        let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if hex.len() != 32 || !hex.bytes().all(lower_hex) {
            return None;
        }
        Uuid::parse_str(hex).ok().map(Self)
    }
}

fn check_tier(value: &str) -> Result<(), Problem> {
    crate::values::fleet::check_token(value, 64)
}

checked_string!(
    /// A runner tier (`linux-4x`, `macos-m2`): the image, sizes and trust a tenant's jobs
    /// run with. Capacity limits are per tier too.
    Tier,
    check_tier
);

fn check_node_name(value: &str) -> Result<(), Problem> {
    crate::values::fleet::check_token(value, 64)
}

checked_string!(
    /// A runner node's name (a host running one provider backend), as it registers.
    RunnerNodeName,
    check_node_name
);

fn check_instance_ref(value: &str) -> Result<(), Problem> {
    const MAX: usize = 256;
    if value.is_empty() {
        return Err(Problem::Missing);
    }
    if value.len() > MAX {
        return Err(Problem::TooLong { max: MAX });
    }
    if value.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(Problem::BadFormat { expected: "printable ASCII without spaces" })
    }
}

checked_string!(
    /// The provider's own handle for an instance (a container id, an EC2 instance id):
    /// opaque to everything above the provider.
    InstanceRef,
    check_instance_ref
);

/// Declares a closed set of lower-case names read from outside input, refusing anything
/// else with the field's name.
macro_rules! named_set {
    ($(#[$doc:meta])* $name:ident, $expected:literal { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// Every value.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)+];

            /// Its name, the one spelling events, read models and clients use.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }

            /// The value named `text`.
            ///
            /// # Errors
            /// [`FieldError`] naming `field` when `text` names none.
            pub fn parse(field: &str, text: &str) -> Result<Self, FieldError> {
                Self::ALL.iter().copied().find(|value| value.name() == text).ok_or_else(|| {
                    FieldError::new(field, Problem::BadFormat { expected: $expected })
                })
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named_set!(
    /// Whose code a job runs, which decides where it may run. There is no "unknown": an
    /// unclassified job is refused when it is read (rule 19), so it can never be routed
    /// somewhere weak by omission.
    TrustClass, "one of untrusted, trusted" {
        /// Code from outside the tenant's trust (a fork's pull request).
        Untrusted = "untrusted",
        /// The tenant's own code.
        Trusted = "trusted",
    }
);

named_set!(
    /// The guest OS a runner runs.
    GuestOs, "one of linux, macos, windows" {
        /// Linux.
        Linux = "linux",
        /// macOS: counted against the tenant's macOS slots too.
        Macos = "macos",
        /// Windows.
        Windows = "windows",
    }
);

named_set!(
    /// The kind of backend a runner node launches instances with.
    ProviderKind, "one of docker, ec2, firecracker, tart" {
        /// Containers on the node's Docker daemon (shares the host kernel).
        Docker = "docker",
        /// EC2 instances.
        Ec2 = "ec2",
        /// Firecracker microVMs.
        Firecracker = "firecracker",
        /// Tart macOS VMs.
        Tart = "tart",
    }
);

named_set!(
    /// How a job's runner ended.
    Outcome, "one of done, failed" {
        /// The job ran to its end.
        Done = "done",
        /// It did not.
        Failed = "failed",
    }
);

named_set!(
    /// What a provider's destroy proved: the compute asked to go (`requested`, still
    /// charged), or confirmed gone (`stopped`). An accepted request is not proof, and neither
    /// is an absence the provider's own API may be wrong about.
    Teardown, "one of requested, stopped" {
        /// Asked to go; it may still run.
        Requested = "requested",
        /// Confirmed gone.
        Stopped = "stopped",
    }
);

/// The argv that starts the runner inside the instance: at least one argument (an empty
/// command starts an instance that does nothing and "succeeds", so it is refused), none
/// empty, within the limits. Not a credential: the registration travels apart from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct StartCommand(Vec<String>);

impl StartCommand {
    /// Checks an argv.
    ///
    /// # Errors
    /// [`FieldError`] naming `field` (or the offending argument's index beneath it).
    pub fn parse(field: &str, args: Vec<String>) -> Result<Self, FieldError> {
        if args.is_empty() {
            return Err(FieldError::new(field, Problem::Missing));
        }
        if args.len() > RUNNER_COMMAND_ARGS_MAX {
            return Err(FieldError::new(field, Problem::TooLong { max: RUNNER_COMMAND_ARGS_MAX }));
        }
        for (index, arg) in args.iter().enumerate() {
            let problem = if arg.is_empty() {
                Some(Problem::Missing)
            } else if arg.len() > RUNNER_COMMAND_ARG_MAX_BYTES {
                Some(Problem::TooLong { max: RUNNER_COMMAND_ARG_MAX_BYTES })
            } else if arg.chars().any(char::is_control) {
                Some(Problem::BadFormat { expected: "text without control characters" })
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(FieldError::new(format!("{field}[{index}]"), problem));
            }
        }
        Ok(Self(args))
    }

    /// The arguments.
    pub fn args(&self) -> &[String] {
        &self.0
    }
}

impl TryFrom<Vec<String>> for StartCommand {
    type Error = FieldError;
    fn try_from(args: Vec<String>) -> Result<Self, FieldError> {
        Self::parse("command", args)
    }
}

impl From<StartCommand> for Vec<String> {
    fn from(command: StartCommand) -> Self {
        command.0
    }
}

/// What a runner lease is charged: its vCPUs and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerResources {
    /// vCPUs, 1 to [`RUNNER_VCPU_MAX`].
    pub vcpu: u32,
    /// Memory in MiB, 1 to [`RUNNER_MEMORY_MB_MAX`].
    pub memory_mb: u64,
}

impl RunnerResources {
    /// Checks the sizes.
    ///
    /// # Errors
    /// [`FieldError`] naming `vcpu` or `memoryMb` beneath `field`.
    pub fn new(field: &str, vcpu: u32, memory_mb: u64) -> Result<Self, FieldError> {
        if !(1..=RUNNER_VCPU_MAX).contains(&vcpu) {
            let problem = Problem::OutOfRange { min: 1, max: u64::from(RUNNER_VCPU_MAX) };
            return Err(FieldError::new(format!("{field}.vcpu"), problem));
        }
        if !(1..=RUNNER_MEMORY_MB_MAX).contains(&memory_mb) {
            let problem = Problem::OutOfRange { min: 1, max: RUNNER_MEMORY_MB_MAX };
            return Err(FieldError::new(format!("{field}.memoryMb"), problem));
        }
        Ok(Self { vcpu, memory_mb })
    }
}

uuid_type!(
    /// A CI job's request (the queued job a runner is leased for).
    JobRequestId
);

/// The job a runner lease is assigned: the queued request and its workflow run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobRef {
    /// The request.
    pub request: JobRequestId,
    /// The workflow run it belongs to.
    pub run: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_name_encodes_its_lease_and_only_ours_decode() {
        let lease = RunnerLeaseId(Uuid::from_u128(0xabc));
        let name = lease.instance_name();
        assert_eq!(name, "billet-00000000000000000000000000000abc");
        assert_eq!(RunnerLeaseId::of_instance(&name), Some(lease));
        for other in [
            "billet-00000000-0000-0000-0000-000000000abc",
            "billet-00000000000000000000000000000ABC",
            "billet-0000000000000000000000000000abc",
            "other-00000000000000000000000000000abc",
            "billet-",
        ] {
            assert_eq!(RunnerLeaseId::of_instance(other), None, "{other}");
        }
    }

    #[test]
    fn an_unknown_trust_class_and_an_empty_command_are_refused() {
        assert_eq!(TrustClass::parse("trust", "trusted"), Ok(TrustClass::Trusted));
        for text in ["unknown", "", "TRUSTED", "semi"] {
            let error = TrustClass::parse("trust", text).expect_err(text);
            assert_eq!(error.field, "trust");
        }
        let error = StartCommand::parse("command", Vec::new()).expect_err("empty");
        assert_eq!(error, FieldError::new("command", Problem::Missing));
        let error = StartCommand::parse("command", vec!["run.sh".into(), String::new()]);
        assert_eq!(error.expect_err("an empty argument").field, "command[1]");
        let json = serde_json::json!([]);
        assert!(serde_json::from_value::<StartCommand>(json).is_err(), "not even when stored");
    }

    #[test]
    fn resources_are_bounded() {
        assert!(RunnerResources::new("r", 0, 1024).is_err());
        assert!(RunnerResources::new("r", 4, 0).is_err());
        assert_eq!(RunnerResources::new("r", 4, 8192).map(|r| r.vcpu), Ok(4));
    }
}
