//! Setting up a data channel (sans-IO).
//!
//! Payloads between hosts travel over TCP data channels: sealed records
//! with [`Encryption::On`] ([`crate::seal`]), raw bytes with
//! [`Encryption::Off`]. Either way a TCP connection carries transfers only
//! once a peer holding a cluster certificate has asked for it over mutual
//! TLS (the QUIC connection):
//!
//! 1. The sender opens a stream on its QUIC connection and writes the
//!    marker of its setting ([`REQUEST_MARKER`] or [`SEALED_REQUEST_MARKER`],
//!    where a header's length would be), then a frame: `u32` big-endian
//!    length (≤ [`MAX_FRAME`]) and the postcard [`ChannelRequest`] (its rank
//!    and job).
//! 2. The receiver answers a [`ChannelAnswer`] frame: a grant (its TCP port
//!    and a fresh random token) or a refusal with its reason (another job,
//!    or the other setting).
//! 3. The sender connects to that port and writes the token; the receiver
//!    answers one byte, `0` (a sealed record with encryption on), and the
//!    connection is a channel bound to the rank and job of the request
//!    (endpoint invariant 11). A sealed channel's keys are exported from
//!    the QUIC connection's TLS session with the token as context.
//!
//! Invariants:
//! 1. Decoding never panics and never allocates more than the frame.
//! 2. A token is [`TOKEN_LEN`] bytes from the system's random source; it
//!    travels only inside mutual TLS until the sender presents it.

use serde::{Deserialize, Serialize};

use crate::error::{Result, TransferError};
use crate::header::{length_prefixed, prefixed_len};

/// What replaces a header's length on a stream that asks for a plain
/// channel (a header's length is at most 4096, so no transfer starts this
/// way).
pub const REQUEST_MARKER: u32 = u32::MAX;
/// The same, for a sealed channel.
pub const SEALED_REQUEST_MARKER: u32 = u32::MAX - 1;
/// Largest request or answer frame.
pub const MAX_FRAME: usize = 2048;
/// Bytes of a channel's token.
pub const TOKEN_LEN: usize = 32;
/// Longest job name in a request, and reason in a refusal.
const MAX_TEXT: usize = 1024;

/// Whether a job's bulk bytes are encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encryption {
    /// Set-up over mutual TLS, bulk bytes over TCP in AES-128-GCM records
    /// keyed from that session (the default).
    #[default]
    On,
    /// Set-up over mutual TLS, bulk bytes over plain TCP (a trusted
    /// network only: see the README's threat model).
    Off,
}

impl Encryption {
    /// `on` or `off`.
    pub fn name(self) -> &'static str {
        match self {
            Encryption::On => "on",
            Encryption::Off => "off",
        }
    }

    /// Whether the bulk bytes are encrypted.
    pub fn is_on(self) -> bool {
        self == Encryption::On
    }

    /// The `path` label of the metrics of payloads on a channel of this
    /// setting.
    pub fn channel_path(self) -> &'static str {
        match self {
            Encryption::On => "sealed",
            Encryption::Off => "tcp",
        }
    }

    /// The marker of a request for a channel of this setting.
    pub fn request_marker(self) -> u32 {
        match self {
            Encryption::On => SEALED_REQUEST_MARKER,
            Encryption::Off => REQUEST_MARKER,
        }
    }

    /// The setting a stream's first four bytes ask a channel for, if they
    /// are a request's marker.
    pub fn requested(prefix: [u8; 4]) -> Option<Encryption> {
        match u32::from_be_bytes(prefix) {
            SEALED_REQUEST_MARKER => Some(Encryption::On),
            REQUEST_MARKER => Some(Encryption::Off),
            _ => None,
        }
    }
}

impl std::fmt::Display for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Encryption {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Encryption, String> {
        match s {
            "on" => Ok(Encryption::On),
            "off" => Ok(Encryption::Off),
            _ => Err(format!("transfer encryption is `on` or `off`, not `{s}`")),
        }
    }
}

/// A sender asks for a data channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelRequest {
    /// The sender's rank: the only sender the channel carries.
    pub from: u32,
    /// The job (attempt) both endpoints must serve.
    pub job: String,
}

/// The receiver's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChannelAnswer {
    /// Connect to this TCP port and present the token.
    Grant {
        /// The receiver's data port.
        port: u16,
        /// Valid once, for a short while.
        token: [u8; TOKEN_LEN],
    },
    /// No channel, and why.
    Refused(String),
}

fn frame<T: Serialize>(value: &T) -> Vec<u8> {
    length_prefixed(&postcard::to_allocvec(value).expect("channel frames always encode"))
}

/// The body's length of a frame whose length prefix is `prefix`.
pub fn frame_len(prefix: [u8; 4]) -> Result<usize> {
    prefixed_len(prefix, MAX_FRAME, "a channel frame")
}

fn decode<'a, T: Deserialize<'a>>(what: &str, body: &'a [u8]) -> Result<T> {
    if body.len() > MAX_FRAME {
        return Err(TransferError::InvalidHeader(format!(
            "a {what} of {} bytes, over {MAX_FRAME}",
            body.len()
        )));
    }
    postcard::from_bytes(body)
        .map_err(|e| TransferError::InvalidHeader(format!("a {what} that does not decode: {e}")))
}

fn check_text(what: &str, s: &str) -> Result<()> {
    if s.len() > MAX_TEXT {
        return Err(TransferError::InvalidHeader(format!(
            "{what} of {} bytes, over {MAX_TEXT}",
            s.len()
        )));
    }
    Ok(())
}

impl ChannelRequest {
    /// The marker of a channel of setting `encryption`, and the frame.
    pub fn encode(&self, encryption: Encryption) -> Vec<u8> {
        let mut out = encryption.request_marker().to_be_bytes().to_vec();
        out.extend(frame(self));
        out
    }

    /// A frame's body, checked (invariant 1).
    pub fn decode(body: &[u8]) -> Result<ChannelRequest> {
        let r: ChannelRequest = decode("channel request", body)?;
        check_text("a job name", &r.job)?;
        Ok(r)
    }
}

impl ChannelAnswer {
    /// The frame.
    pub fn encode(&self) -> Vec<u8> {
        frame(self)
    }

    /// A frame's body, checked (invariant 1).
    pub fn decode(body: &[u8]) -> Result<ChannelAnswer> {
        let a: ChannelAnswer = decode("channel answer", body)?;
        if let ChannelAnswer::Refused(why) = &a {
            check_text("a refusal", why)?;
        }
        Ok(a)
    }
}

/// A fresh token (invariant 2).
pub(crate) fn new_token() -> Result<[u8; TOKEN_LEN]> {
    use ring::rand::SecureRandom;
    let mut token = [0u8; TOKEN_LEN];
    ring::rand::SystemRandom::new()
        .fill(&mut token)
        .map_err(|_| TransferError::Tls("the system's random source failed".into()))?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_round_trip() {
        let r = ChannelRequest {
            from: 3,
            job: "train/2".into(),
        };
        let bytes = r.encode(Encryption::Off);
        assert_eq!(bytes[..4], REQUEST_MARKER.to_be_bytes());
        assert_eq!(
            Encryption::requested(bytes[..4].try_into().unwrap()),
            Some(Encryption::Off)
        );
        let sealed = r.encode(Encryption::On);
        assert_eq!(
            Encryption::requested(sealed[..4].try_into().unwrap()),
            Some(Encryption::On)
        );
        assert_eq!(sealed[4..], bytes[4..]);
        assert_eq!(Encryption::requested(4096u32.to_be_bytes()), None);
        let n = frame_len(bytes[4..8].try_into().unwrap()).unwrap();
        assert_eq!(ChannelRequest::decode(&bytes[8..8 + n]).unwrap(), r);
        for a in [
            ChannelAnswer::Grant {
                port: 4000,
                token: new_token().unwrap(),
            },
            ChannelAnswer::Refused("no".into()),
        ] {
            let bytes = a.encode();
            let n = frame_len(bytes[..4].try_into().unwrap()).unwrap();
            assert_eq!(ChannelAnswer::decode(&bytes[4..4 + n]).unwrap(), a);
        }
    }

    #[test]
    fn oversized_and_garbled_frames_are_refused() {
        assert!(frame_len(0u32.to_be_bytes()).is_err());
        assert!(frame_len((MAX_FRAME as u32 + 1).to_be_bytes()).is_err());
        assert!(frame_len(REQUEST_MARKER.to_be_bytes()).is_err());
        let long = ChannelRequest {
            from: 0,
            job: "j".repeat(MAX_TEXT + 1),
        };
        assert!(ChannelRequest::decode(&long.encode(Encryption::On)[8..]).is_err());
        assert!(ChannelAnswer::decode(&[7, 1, 2]).is_err());
        assert!(ChannelRequest::decode(&[]).is_err());
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(new_token().unwrap(), new_token().unwrap());
    }

    #[test]
    fn settings_parse_by_name() {
        assert_eq!("off".parse::<Encryption>().unwrap(), Encryption::Off);
        assert_eq!("on".parse::<Encryption>().unwrap(), Encryption::On);
        assert!("plain".parse::<Encryption>().is_err());
        assert_eq!(Encryption::default(), Encryption::On);
    }
}
