//! Fuzz target `decode`: arbitrary bytes into every decoder of untrusted
//! input (network frames, stored records, encoded ops, the config file).
//! Each must return a value or a typed error, never panic, never make an
//! allocation out of proportion to the input; and every value it returns
//! must survive a round trip through its encoder unchanged.
//!
//! The first byte picks the decoder, the rest is its input.

use super::alloc::with_limit;
use arbor::config::Config;
use arbor::forest::records;
use arbor::proto::{self, Request, Response};
use arbor::{Error, Meta, Move};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// Largest frame the decoders are asked to accept, as the service's
/// `max_message_bytes` would be.
pub const FRAME_LIMIT_BYTES: usize = 64 * 1024;

/// No single allocation while decoding may exceed this: the inputs are a
/// few KiB, so anything larger means a length prefix was trusted.
pub const ALLOCATION_LIMIT_BYTES: usize = 4 << 20;

type Decoder = fn(&[u8]);

const DECODERS: &[Decoder] = &[
    |b| frame::<Request>(b),
    |b| frame::<Response>(b),
    |b| postcard_value::<Move>(b),
    |b| postcard_value::<Meta>(b),
    tree_key_record,
    tree_record,
    log_record,
    node_record,
    tcp_stream,
    config_yaml,
];

pub fn check(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let decoder = DECODERS[usize::from(selector) % DECODERS.len()];
    with_limit(ALLOCATION_LIMIT_BYTES, || decoder(bytes));
}

/// A network frame body: decoded with the size limit, re-encoded, decoded
/// again to the same envelope; the canonical encoding is a fixed point.
fn frame<T: Serialize + DeserializeOwned + PartialEq + Debug>(bytes: &[u8]) {
    let envelope = match proto::decode::<T>(bytes, FRAME_LIMIT_BYTES) {
        Ok(envelope) => envelope,
        Err(e) => return expect_input_error(&e),
    };
    let encoded = proto::encode(envelope.id, &envelope.body);
    // postcard accepts over-long varints, so the input need not be the
    // canonical encoding, but the canonical one is never longer.
    assert!(encoded.len() <= bytes.len(), "re-encoding grew the frame");
    let again = proto::decode::<T>(&encoded, FRAME_LIMIT_BYTES).expect("own encoding decodes");
    assert_eq!(again, envelope, "frame round trip changed the value");
    assert_eq!(
        proto::encode(again.id, &again.body),
        encoded,
        "encoding is not canonical"
    );
}

/// A value stored or sent as plain postcard (an op, a meta).
fn postcard_value<T: Serialize + DeserializeOwned + PartialEq + Debug>(bytes: &[u8]) {
    let Ok(value) = postcard::from_bytes::<T>(bytes) else {
        return;
    };
    let encoded = postcard::to_stdvec(&value).expect("encoding our own value");
    let again: T = postcard::from_bytes(&encoded).expect("own encoding decodes");
    assert_eq!(again, value, "postcard round trip changed the value");
}

/// Bad input must be refused as bad input, not as some internal failure.
fn expect_input_error(e: &Error) {
    assert!(
        matches!(e, Error::Malformed(_) | Error::TooLarge { .. }),
        "bad bytes gave a non-input error: {e:?}"
    );
}

/// The key of the trees table: exact bytes back.
fn tree_key_record(bytes: &[u8]) {
    match records::decode_tree_key(bytes) {
        Ok(key) => assert_eq!(records::tree_key_bytes(&key), bytes, "tree key round trip"),
        Err(e) => expect_input_error(&e),
    }
}

fn tree_record(bytes: &[u8]) {
    match records::decode_tree(bytes) {
        Ok(record) => {
            let again = records::decode_tree(&records::encode_tree(&record));
            assert_eq!(again, Ok(record), "tree record round trip");
        }
        Err(e) => expect_input_error(&e),
    }
}

/// A log record, and the helpers that work on its encoded form without
/// decoding it: they must agree with the decoder.
fn log_record(bytes: &[u8]) {
    let record = match records::decode_log(bytes) {
        Ok(record) => record,
        Err(e) => {
            expect_input_error(&e);
            return;
        }
    };
    let body = &record.body;
    let encoded = records::encode_log(body.parent, body.child, &body.items, record.tail);
    assert_eq!(
        records::decode_log(&encoded),
        Ok(record.clone()),
        "log record round trip"
    );
    let body_len = records::log_body_len(bytes).expect("a decodable record has a body");
    let body_bytes = records::encode_op_body(body.parent, body.child, &body.items);
    let canonical_len = records::log_body_len(&encoded).expect("own encoding has a body");
    assert_eq!(
        canonical_len,
        body_bytes.len(),
        "body length of the canonical encoding"
    );
    assert!(body_len <= bytes.len());
    let tail = records::LogTail {
        height: record.tail.height.wrapping_add(1),
        undo: record.tail.undo,
    };
    let replaced = records::replace_log_tail(bytes, tail).expect("a decodable record");
    let decoded = records::decode_log(&replaced).expect("a replaced tail decodes");
    assert_eq!(
        decoded.body, record.body,
        "replacing the tail changed the op"
    );
    assert_eq!(decoded.tail, tail, "the tail was not replaced");
}

/// The hand-encoded node record: exact bytes back.
fn node_record(bytes: &[u8]) {
    match records::decode_node(bytes) {
        Ok(record) => {
            assert_eq!(
                records::encode_node(&record),
                bytes,
                "node record round trip"
            );
            assert_eq!(records::node_parent(bytes), Ok(record.parent));
        }
        Err(e) => expect_input_error(&e),
    }
}

/// A TCP byte stream: length-prefixed frames, each body a request, until
/// a clean end or the first error (after which the server closes the
/// connection). Every frame read writes back to the same bytes.
fn tcp_stream(bytes: &[u8]) {
    let mut reader = bytes;
    // Bounded by the input: every frame consumes at least its header.
    loop {
        let read = arbor::tcp::read_frame(&mut reader, FRAME_LIMIT_BYTES);
        let body = match futures::executor::block_on(read) {
            Ok(Some(body)) => body,
            Ok(None) => return,
            Err(e) => return expect_input_error(&e),
        };
        assert!(
            body.len() <= FRAME_LIMIT_BYTES,
            "frame above the limit accepted"
        );
        let mut written = Vec::new();
        let framed = arbor::tcp::Frame::with_body(&body).expect("a body within the limit frames");
        futures::executor::block_on(arbor::tcp::write_frame(&mut written, &framed))
            .expect("writing to memory");
        let again = futures::executor::block_on(arbor::tcp::read_frame(
            &mut written.as_slice(),
            FRAME_LIMIT_BYTES,
        ));
        assert_eq!(again, Ok(Some(body.clone())), "frame round trip");
        frame::<Request>(&body);
    }
}

/// The config file: a config or `Error::Config`, never a panic. There is no
/// encoder to round-trip through, so the check is that parsing is a pure
/// function of the text and that what it accepts passes validation.
fn config_yaml(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    match Config::from_yaml_str(text) {
        Ok(config) => {
            assert_eq!(
                config.validate(),
                Ok(()),
                "an accepted config fails validation"
            );
            assert_eq!(
                Config::from_yaml_str(text),
                Ok(config),
                "parsing is not deterministic"
            );
        }
        Err(Error::Config(_)) => {}
        Err(e) => panic!("a bad config gave a non-config error: {e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed corpus must reach the accepting branches too, or the
    /// round-trip checks above would never run on it.
    #[test]
    fn the_corpus_config_is_accepted() {
        let file = include_bytes!("../../../fuzz/corpus/decode/config-design-example.yaml");
        assert_eq!(
            usize::from(file[0]) % DECODERS.len(),
            9,
            "selects config_yaml"
        );
        let text = std::str::from_utf8(&file[1..]).expect("UTF-8");
        let config = Config::from_yaml_str(text).expect("the example config parses");
        assert_eq!(config.node.peers.len(), 1);
        config_yaml(&file[1..]);
    }

    #[test]
    fn a_valid_frame_round_trips() {
        let frame = proto::encode(7, &Request::Healthcheck);
        let mut stream = Vec::new();
        stream.extend_from_slice(&(frame.len() as u32).to_be_bytes());
        stream.extend_from_slice(&frame);
        tcp_stream(&stream);
        let decoded = proto::decode::<Request>(&frame, FRAME_LIMIT_BYTES).expect("decodes");
        assert_eq!(decoded.body, Request::Healthcheck);
    }
}
