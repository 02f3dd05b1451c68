//! The production network: length-prefixed frames over TCP, with mutual
//! TLS when the node has certificates (`tls`).
//!
//! A frame is `[length: u32 big-endian][body]`, the body being
//! `proto::encode` output. The length is checked against the message limit
//! before anything is read, and a body is read as it arrives rather than
//! allocated from the claimed length, so a lying header costs nothing.
//! (That is why frames are not read with tokio-util's
//! `LengthDelimitedCodec`: it reserves the claimed length as soon as it
//! decodes a header, before the server's `FrameBudget` could refuse it.)
//! A malformed, truncated or oversized frame gets one error response (id 0)
//! and the connection is closed: after a bad frame the byte stream cannot be
//! trusted to be in step. Other connections are unaffected.
//!
//! `server` accepts connections and bounds what they may hold (count, idle
//! time, handshake time, bytes of partly received frames); `client` dials
//! peers, checks who answered and pools connections.

mod budget;
mod client;
mod server;

pub use budget::FrameBudget;
pub use client::{client_share, outbound_share, Connection, Dialer, TcpTransport};
pub use server::{listen, serve, Server, ServerHandle, ServerOptions, ServerStats};

use crate::error::{Error, Result};
use crate::identity::Caller;
use crate::proto::{self, Request, Response};
use crate::runtime::BoxFuture;
use crate::service::Service;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// Bytes each connection end reads from its socket at a time. A frame
/// would otherwise cost a read per piece (its header, then its body in
/// growing steps): one receive call now takes a small frame whole, and
/// whatever follows it. Fixed per connection, so bounded by the
/// connection limits.
pub const READ_BUFFER_BYTES: usize = 16 * 1024;

/// `stream` with reads served from a [`READ_BUFFER_BYTES`] buffer.
fn buffered<S: AsyncRead>(stream: S) -> BufReader<S> {
    BufReader::with_capacity(READ_BUFFER_BYTES, stream)
}

/// Answers requests; the service in production, anything in tests.
pub trait Handler: Send + Sync + 'static {
    /// Answers `request` from `caller`, as the connection authenticated it.
    fn handle<'a>(&'a self, caller: &'a Caller, request: Request) -> BoxFuture<'a, Response>;
}

impl Handler for Service {
    fn handle<'a>(&'a self, caller: &'a Caller, request: Request) -> BoxFuture<'a, Response> {
        Box::pin(Service::handle(self, caller, request))
    }
}

/// Reads one frame. `Ok(None)` is a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_bytes: usize,
) -> Result<Option<Vec<u8>>> {
    let mut header = [0u8; 4];
    let mut filled = 0;
    while filled < header.len() {
        let n = reader.read(&mut header[filled..]).await.map_err(io_error)?;
        if n == 0 {
            return match filled {
                0 => Ok(None),
                _ => Err(Error::Malformed("truncated frame header".into())),
            };
        }
        filled += n;
    }
    let length = check_length(u32::from_be_bytes(header), max_bytes)?;
    // Grows with the bytes that actually arrive, never with the claim.
    let mut body = Vec::new();
    reader
        .take(length as u64)
        .read_to_end(&mut body)
        .await
        .map_err(io_error)?;
    if body.len() != length {
        return Err(truncated(body.len(), length));
    }
    Ok(Some(body))
}

/// The length a frame header claims, if it is within the limit.
fn check_length(length: u32, max_bytes: usize) -> Result<usize> {
    let length = length as usize;
    if length > max_bytes {
        return Err(Error::TooLarge {
            what: "frame".into(),
            size: length as u64,
            limit: max_bytes as u64,
        });
    }
    Ok(length)
}

fn truncated(got: usize, length: usize) -> Error {
    Error::Malformed(format!("truncated frame: {got} of {length} bytes"))
}

/// Writes one frame made by [`encode_frame`].
pub async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, frame: &Frame) -> Result<()> {
    writer.write_all(&frame.0).await.map_err(io_error)?;
    writer.flush().await.map_err(io_error)
}

/// A whole frame: the length header, then the body.
#[derive(Debug)]
pub struct Frame(Vec<u8>);

impl Frame {
    /// The frame as sent.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Length of the body, without the header.
    pub fn body_len(&self) -> usize {
        self.0.len() - FRAME_HEADER_BYTES
    }
}

const FRAME_HEADER_BYTES: usize = 4;

/// The frame carrying `proto::encode(id, body)`, encoded in place behind
/// its header (one buffer, no copy of the body).
pub fn encode_frame<T: serde::Serialize>(id: u64, body: &T) -> Result<Frame> {
    Frame::with_header(proto::encode_after(&[0; FRAME_HEADER_BYTES], id, body))
}

impl Frame {
    /// The frame carrying `body` as it is (bytes from elsewhere, such as
    /// a frame read back).
    pub fn with_body(body: &[u8]) -> Result<Frame> {
        let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
        frame.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
        frame.extend_from_slice(body);
        Frame::with_header(frame)
    }

    /// Fills in the length header of `frame`, whose first bytes were left
    /// for it.
    fn with_header(mut frame: Vec<u8>) -> Result<Frame> {
        let body_len = frame.len() - FRAME_HEADER_BYTES;
        let length = u32::try_from(body_len).map_err(|_| Error::TooLarge {
            what: "frame".into(),
            size: body_len as u64,
            limit: u32::MAX as u64,
        })?;
        frame[..FRAME_HEADER_BYTES].copy_from_slice(&length.to_be_bytes());
        Ok(Frame(frame))
    }
}

fn io_error(e: std::io::Error) -> Error {
    Error::Network(e.to_string())
}

pub use crate::net::Stream;
