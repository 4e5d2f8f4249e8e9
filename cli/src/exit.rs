//! Exit codes beyond 0 (success), 1 (an error) and 2 (a bad command line).
//!
//! A command that must tell a script *which* failure happened returns an
//! [`Exit`]; `main` prints its message and exits with its code.

/// An error that ends the process with a specific exit code.
#[derive(Debug)]
pub(crate) struct Exit {
    /// The process's exit code (3 and above; 1 and 2 are taken).
    pub(crate) code: u8,
    message: String,
}

impl Exit {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Exit {
        Exit {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}
