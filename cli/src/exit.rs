//! The exit codes a script can branch on (docs/operations.md has the
//! table; `cli/tests/exit_codes.rs` tests each).
//!
//! A command that knows which failure happened returns an [`Exit`];
//! [`code`] classifies the rest by the errors in their chain, so an
//! unreachable cluster is 3 whichever command met it.

use tessel::client::ClientError;
use tessel_kv::KvError;

/// An error not otherwise classified.
pub(crate) const FAILURE: u8 = 1;
/// Bad input: the command line (clap's usage code), a job spec, an id
/// that names nothing, a TLS folder that cannot be read.
pub(crate) const BAD_INPUT: u8 = 2;
/// The cluster did not answer, or refused our certificate.
pub(crate) const UNREACHABLE: u8 = 3;
/// `cluster status`: the replicas agree on no leader.
pub(crate) const NO_LEADER: u8 = 4;
/// The job ended Failed.
pub(crate) const JOB_FAILED: u8 = 5;
/// The job was cancelled.
pub(crate) const JOB_CANCELLED: u8 = 6;
/// A wait with a deadline ran out (`submit --wait --timeout`, `kv get
/// --timeout-ms`).
pub(crate) const TIMEOUT: u8 = 7;

/// An error that ends the process with a specific exit code.
#[derive(Debug)]
pub(crate) struct Exit {
    /// The process's exit code.
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

    /// Bad input, said by `e`.
    pub(crate) fn bad_input(e: impl std::fmt::Display) -> Exit {
        Exit::new(BAD_INPUT, format!("{e:#}"))
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

/// The exit code for `e`: an [`Exit`]'s own, else by the first error in
/// its chain that says what happened.
pub(crate) fn code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(x) = cause.downcast_ref::<Exit>() {
            return x.code;
        }
        if let Some(c) = cause.downcast_ref::<ClientError>() {
            match c {
                ClientError::NoSuchJob(_)
                | ClientError::NoSuchArray { .. }
                | ClientError::Spec(_)
                | ClientError::TooLarge { .. } => return BAD_INPUT,
                _ => continue,
            }
        }
        if let Some(k) = cause.downcast_ref::<KvError>() {
            return of_kv(k);
        }
        if cause.downcast_ref::<tessel::job::JobSpecError>().is_some() {
            return BAD_INPUT;
        }
    }
    FAILURE
}

fn of_kv(e: &KvError) -> u8 {
    match e {
        KvError::Unavailable(_) | KvError::PermissionDenied(_) => UNREACHABLE,
        KvError::DeadlineExceeded { .. } => TIMEOUT,
        KvError::InvalidArgument(_) => BAD_INPUT,
        _ => FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_the_first_telling_cause() {
        let e =
            anyhow::Error::new(KvError::Unavailable("no leader".into())).context("listing jobs");
        assert_eq!(code(&e), UNREACHABLE);
        let e = anyhow::Error::new(ClientError::NoSuchJob("x.1".into()));
        assert_eq!(code(&e), BAD_INPUT);
        let e = anyhow::Error::new(Exit::new(JOB_FAILED, "failed")).context("waiting");
        assert_eq!(code(&e), JOB_FAILED);
        assert_eq!(code(&anyhow::anyhow!("something else")), FAILURE);
        let e = anyhow::Error::new(KvError::NotFound(b"k".to_vec()));
        assert_eq!(code(&e), FAILURE);
        let e = anyhow::Error::new(KvError::DeadlineExceeded {
            what: "get".into(),
            after: std::time::Duration::from_millis(300),
        });
        assert_eq!(code(&e), TIMEOUT);
    }
}
