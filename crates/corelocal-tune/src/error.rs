//! Errors and exit codes.

use std::fmt;
use std::process::ExitCode;

/// Why a `tune` command stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TuneError {
    /// Bad input: flags, plan or snapshot contents, unknown NIC, offline CPU (exit code 2).
    /// Nothing was changed.
    Input(String),
    /// The host refused or the result differs from what was asked (exit code 1).
    Failed(String),
}

impl TuneError {
    /// A bad-input error.
    pub fn input(msg: impl Into<String>) -> Self {
        TuneError::Input(msg.into())
    }

    /// An operational failure.
    pub fn failed(msg: impl Into<String>) -> Self {
        TuneError::Failed(msg.into())
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            TuneError::Input(_) => ExitCode::from(2),
            TuneError::Failed(_) => ExitCode::from(1),
        }
    }
}

impl fmt::Display for TuneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TuneError::Input(m) | TuneError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for TuneError {}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, TuneError>;
