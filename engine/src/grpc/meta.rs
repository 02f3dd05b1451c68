//! The compact binary form of a node's meta that `LogMove.meta` carries
//! (Apply, GetOpLog): the time and the item count as variable-length
//! integers, then each item's key and value, each prefixed with its
//! length as a variable-length integer.
//!
//! A variable-length integer is one byte below `0xFD`; otherwise a marker
//! byte followed by the value in little-endian: `0xFD` and 2 bytes, `0xFE`
//! and 4, `0xFF` and 8. Decoding is strict about the end of the input and
//! bounded by it: a count or a length larger than what is left is refused
//! before anything is allocated.

use crate::error::{Error, Result};
use crate::types::{KeyValue, Meta};

/// Encodes `meta`.
pub fn encode(meta: &Meta) -> Vec<u8> {
    let size: usize = meta
        .items
        .iter()
        .map(|kv| 18 + kv.key.len() + kv.value.len())
        .sum();
    let mut out = Vec::with_capacity(18 + size);
    put_varint(&mut out, meta.time);
    put_varint(&mut out, meta.items.len() as u64);
    for kv in &meta.items {
        put_varint(&mut out, kv.key.len() as u64);
        out.extend_from_slice(kv.key.as_bytes());
        put_varint(&mut out, kv.value.len() as u64);
        out.extend_from_slice(&kv.value);
    }
    out
}

/// Decodes what [`encode`] makes; anything else is `Malformed`.
pub fn decode(bytes: &[u8]) -> Result<Meta> {
    let mut input = Input { bytes };
    let time = input.varint()?;
    let count = input.varint()?;
    // Every item takes at least two bytes (two empty lengths).
    if count > (input.bytes.len() / 2) as u64 {
        return Err(malformed(format!(
            "{count} items in {} bytes",
            input.bytes.len()
        )));
    }
    let mut items = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let key = input.sized()?;
        let key = std::str::from_utf8(key)
            .map_err(|_| malformed("a key is not UTF-8".into()))?
            .to_string();
        let value = input.sized()?.to_vec();
        items.push(KeyValue { key, value });
    }
    if !input.bytes.is_empty() {
        return Err(malformed(format!("{} trailing bytes", input.bytes.len())));
    }
    Ok(Meta { time, items })
}

fn put_varint(out: &mut Vec<u8>, value: u64) {
    match value {
        0..=0xFC => out.push(value as u8),
        0xFD..=0xFFFF => {
            out.push(0xFD);
            out.extend_from_slice(&(value as u16).to_le_bytes());
        }
        0x1_0000..=0xFFFF_FFFF => {
            out.push(0xFE);
            out.extend_from_slice(&(value as u32).to_le_bytes());
        }
        _ => {
            out.push(0xFF);
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
}

fn malformed(why: String) -> Error {
    Error::Malformed(format!("LogMove meta: {why}"))
}

struct Input<'a> {
    bytes: &'a [u8],
}

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.bytes.len() {
            return Err(malformed(format!(
                "{n} bytes wanted, {} left",
                self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn varint(&mut self) -> Result<u64> {
        let marker = self.take(1)?[0];
        let width = match marker {
            0xFD => 2,
            0xFE => 4,
            0xFF => 8,
            small => return Ok(u64::from(small)),
        };
        let mut le = [0u8; 8];
        le[..width].copy_from_slice(self.take(width)?);
        Ok(u64::from_le_bytes(le))
    }

    fn sized(&mut self) -> Result<&'a [u8]> {
        let len = self.varint()?;
        let len = usize::try_from(len).map_err(|_| malformed(format!("length {len}")))?;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn integers_take_the_shortest_form() {
        let cases: [(u64, &[u8]); 6] = [
            (0, &[0x00]),
            (0xFC, &[0xFC]),
            (0xFD, &[0xFD, 0xFD, 0x00]),
            (0xFFFF, &[0xFD, 0xFF, 0xFF]),
            (0x1_0000, &[0xFE, 0x00, 0x00, 0x01, 0x00]),
            (
                0x1_0000_0000,
                &[0xFF, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00],
            ),
        ];
        for (value, bytes) in cases {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out, bytes, "{value:#x}");
            assert_eq!(Input { bytes }.varint().unwrap(), value);
        }
    }

    #[test]
    fn a_known_meta_encodes_to_known_bytes() {
        let meta = Meta {
            time: 300,
            items: vec![KeyValue::new("FileName", "a"), KeyValue::new("k", "")],
        };
        let bytes = encode(&meta);
        let mut expected = vec![0xFD, 0x2C, 0x01, 2, 8];
        expected.extend_from_slice(b"FileName");
        expected.extend_from_slice(&[1, b'a', 1, b'k', 0]);
        assert_eq!(bytes, expected);
        assert_eq!(decode(&bytes).unwrap(), meta);
    }

    #[test]
    fn damaged_input_is_refused() {
        let good = encode(&Meta {
            time: 5,
            items: vec![KeyValue::new("FileName", "x")],
        });
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        // A count far beyond the input allocates nothing.
        assert!(decode(&[0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F]).is_err());
        // A key that is not UTF-8.
        assert!(decode(&[0, 1, 1, 0xFF, 0]).is_err());
    }

    proptest! {
        #[test]
        fn every_meta_round_trips(
            time in any::<u64>(),
            items in proptest::collection::vec((".{0,20}", proptest::collection::vec(any::<u8>(), 0..300)), 0..8),
        ) {
            let meta = Meta {
                time,
                items: items.into_iter().map(|(k, v)| KeyValue::new(k, v)).collect(),
            };
            prop_assert_eq!(decode(&encode(&meta)).unwrap(), meta);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }
    }
}
