//! One error type for the whole plugin, and its mapping to CNI error codes.
//!
//! Every failure the plugin can report is a variant here. `code()` is the single place where a
//! failure becomes a CNI error code; `main` prints `{cniVersion, code, msg, details}` on stdout.
//! Kernel errors keep their errno so callers match on `ENOENT`/`EBUSY`, never on strings.

use std::fmt;

/// CNI error codes (spec 1.1.0, "Error" section) and natguard's own (>= 100).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN: u32 = 11;
    pub const NOT_READY: u32 = 50;
    /// nf_tables refused or failed a transaction.
    pub const KERNEL: u32 = 100;
    /// CHECK found the kernel state different from what the config asks for.
    pub const CHECK_FAILED: u32 = 101;
    /// A subcommand (install, adopt, ...) failed.
    pub const COMMAND: u32 = 103;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    IncompatibleVersion(String),
    #[error("{0}")]
    InvalidEnv(String),
    #[error("{0}")]
    Decode(String),
    #[error("{0}")]
    InvalidConfig(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A netlink request failed with an errno.
    #[error("{what}: {}", errno_text(*.errno))]
    Netlink { what: String, errno: i32 },
    #[error("{0}")]
    Protocol(String),
    #[error("{0}")]
    CheckFailed(String),
    #[error("{0}")]
    NotReady(String),
    /// Something stayed busy past a bounded wait (the node-wide lock); the same request may
    /// succeed later.
    #[error("{0}")]
    TryAgain(String),
    #[error("{0}")]
    Command(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    pub fn netlink(what: impl Into<String>, errno: i32) -> Self {
        Error::Netlink {
            what: what.into(),
            errno,
        }
    }

    /// The errno of a kernel failure, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Netlink { errno, .. } => Some(*errno),
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Errnos that mean "the kernel was busy, the same request may succeed later".
    pub fn is_transient(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::EBUSY | libc::ENOBUFS | libc::EINTR | libc::EAGAIN | libc::ERESTART)
        )
    }

    pub fn code(&self) -> u32 {
        match self {
            Error::IncompatibleVersion(_) => code::INCOMPATIBLE_VERSION,
            Error::InvalidEnv(_) => code::INVALID_ENV,
            Error::Decode(_) => code::DECODE,
            Error::InvalidConfig(_) => code::INVALID_CONFIG,
            Error::Io { .. } => code::IO_FAILURE,
            _ if self.is_transient() => code::TRY_AGAIN,
            Error::Netlink { .. } | Error::Protocol(_) => code::KERNEL,
            Error::CheckFailed(_) => code::CHECK_FAILED,
            Error::NotReady(_) => code::NOT_READY,
            Error::TryAgain(_) => code::TRY_AGAIN,
            Error::Command(_) => code::COMMAND,
        }
    }

    /// Adds context in front of the message, keeping the variant (and so the code).
    pub fn context(self, ctx: impl fmt::Display) -> Self {
        match self {
            Error::Netlink { what, errno } => Error::Netlink {
                what: format!("{ctx}: {what}"),
                errno,
            },
            Error::Io { what, source } => Error::Io {
                what: format!("{ctx}: {what}"),
                source,
            },
            Error::InvalidEnv(m) => Error::InvalidEnv(format!("{ctx}: {m}")),
            Error::Decode(m) => Error::Decode(format!("{ctx}: {m}")),
            Error::InvalidConfig(m) => Error::InvalidConfig(format!("{ctx}: {m}")),
            Error::Protocol(m) => Error::Protocol(format!("{ctx}: {m}")),
            Error::CheckFailed(m) => Error::CheckFailed(format!("{ctx}: {m}")),
            Error::NotReady(m) => Error::NotReady(format!("{ctx}: {m}")),
            Error::TryAgain(m) => Error::TryAgain(format!("{ctx}: {m}")),
            Error::Command(m) => Error::Command(format!("{ctx}: {m}")),
            e @ Error::IncompatibleVersion(_) => e,
        }
    }
}

/// A user string cut to `n` bytes (on a character boundary) for an error message, so replies
/// stay small whatever the input.
pub fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut cut = n;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

fn errno_text(errno: i32) -> String {
    let e = std::io::Error::from_raw_os_error(errno);
    let name = match errno {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::EBUSY => "EBUSY",
        libc::ENOBUFS => "ENOBUFS",
        libc::EINVAL => "EINVAL",
        libc::EPERM => "EPERM",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::ERESTART => "ERESTART",
        libc::EINTR => "EINTR",
        libc::EAGAIN => "EAGAIN",
        _ => "",
    };
    if name.is_empty() {
        e.to_string()
    } else {
        format!("{name} ({e})")
    }
}
