//! The children index ([`CHILDREN`]): which nodes hang under a parent, by
//! name. Its own b-tree, ordered by `(tree number, parent, name key,
//! child)`.
//!
//! Ordered by name rather than by a hash of it: a hash sends every new
//! child to a random leaf of its parent's range, so a batch of creations
//! under one big directory dirtied (and a commit wrote) one 4 KiB leaf per
//! op. In name order, children created in name order (numbered uploads,
//! dated keys, a directory copied in listing order) land side by side at
//! the end of the range and share leaves; names in random order cost what
//! hashed ones did. Listing a parent comes out in name order, the order
//! object stores list keys in.
//!
//! Each row holds its node's meta: a listing in name order reads the
//! metas of a page from the leaves it walks, where a point read of each
//! node's op in the log (keyed by timestamp, so scattered over the file
//! for names not created in order) cost a page read per node once the
//! log outgrew the page cache. The log row of the op a node's meta comes
//! from then leaves its items out ([`super::LogView::at_node`]): each
//! meta is stored once.

use super::be_u64;
use crate::error::{Error, Result};
use crate::types::*;
use redb::TableDefinition;

/// `(tree number, parent, name key, child)` -> `meta time (8, BE) ++
/// internal (1) ++ items` (see [`encode_child_value`]). The name key (see [`super::name_key`]) is `[0]` for a
/// node without `FileName` and `[1] ++ value` otherwise. One range serves
/// "children of p" (prefix `(tree, p)`) and path lookup (prefix `(tree, p,
/// name)`); within one name rows are in child order, so the smallest id of
/// a duplicated directory comes first.
pub const CHILDREN: TableDefinition<ChildKey, &[u8]> = TableDefinition::new("children");

/// The parts of a [`CHILDREN`] key: `(tree number, parent, name key,
/// child)`.
pub type ChildKeyParts<'a> = (u64, NodeId, &'a [u8], NodeId);

/// Key type of [`CHILDREN`]: stored as `tree (8) ++ parent (8) ++ child
/// (8) ++ name key`, integers little-endian, and ordered by tree, parent,
/// name (bytewise), then child.
#[derive(Debug)]
pub struct ChildKey;

/// Bytes before the name in an encoded key.
const CHILD_KEY_HEAD: usize = 24;

/// Integer `i` of an encoded key (little-endian). Written to stay cheap in
/// builds with debug assertions too (the fuzz targets'): one bounds check.
/// Millions of calls per second: every key comparison inside a b-tree page
/// comes here.
fn row_key_word(bytes: &[u8], i: usize) -> u64 {
    let word: &[u8; 8] = bytes[8 * i..8 * i + 8]
        .try_into()
        .expect("8 bytes make a word");
    u64::from_le_bytes(*word)
}

/// The four parts of an encoded key. redb hands back only keys this type
/// encoded; a shorter one is damage that the name check after every read
/// reports (the name comes out empty, which no name key is).
fn parts(bytes: &[u8]) -> ChildKeyParts<'_> {
    if bytes.len() < CHILD_KEY_HEAD {
        return (0, 0, &[], 0);
    }
    (
        row_key_word(bytes, 0),
        row_key_word(bytes, 1),
        &bytes[CHILD_KEY_HEAD..],
        row_key_word(bytes, 2),
    )
}

impl redb::Value for ChildKey {
    type SelfType<'a> = ChildKeyParts<'a>;
    type AsBytes<'a> = Vec<u8>;

    fn fixed_width() -> Option<usize> {
        None
    }

    fn from_bytes<'a>(data: &'a [u8]) -> ChildKeyParts<'a>
    where
        Self: 'a,
    {
        parts(data)
    }

    fn as_bytes<'a, 'b: 'a>(value: &'a ChildKeyParts<'b>) -> Vec<u8>
    where
        Self: 'b,
    {
        let (tree, parent, name, child) = *value;
        let mut out = Vec::with_capacity(CHILD_KEY_HEAD + name.len());
        for w in [tree, parent, child] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(name);
        out
    }

    fn type_name() -> redb::TypeName {
        redb::TypeName::new("arbor::ChildKey")
    }
}

impl redb::Key for ChildKey {
    fn compare(left: &[u8], right: &[u8]) -> std::cmp::Ordering {
        let (lt, lp, ln, lc) = parts(left);
        let (rt, rp, rn, rc) = parts(right);
        (lt, lp, ln, lc).cmp(&(rt, rp, rn, rc))
    }
}

/// Bytes of an encoded key.
pub fn child_key_len(key: ChildKeyParts<'_>) -> usize {
    CHILD_KEY_HEAD + key.2.len()
}

/// Key of the children-index row of `child`, named `name_key`, under
/// `parent`.
pub fn child_key(tree: u64, parent: NodeId, name_key: &[u8], child: NodeId) -> ChildKeyParts<'_> {
    (tree, parent, name_key, child)
}

/// Above every name key (they start with 0 or 1).
const NAME_KEY_ABOVE: &[u8] = &[2];

/// Every children-index row of `parent`.
pub fn children_range(
    tree: u64,
    parent: NodeId,
) -> std::ops::RangeInclusive<ChildKeyParts<'static>> {
    (tree, parent, &[][..], 0)..=(tree, parent, NAME_KEY_ABOVE, u64::MAX)
}

/// Every children-index row of `parent` named `name_key`.
pub fn children_named_range(
    tree: u64,
    parent: NodeId,
    name_key: &[u8],
) -> std::ops::RangeInclusive<ChildKeyParts<'_>> {
    (tree, parent, name_key, 0)..=(tree, parent, name_key, u64::MAX)
}

/// Every children-index row of one tree.
pub fn tree_children(tree: u64) -> std::ops::RangeInclusive<ChildKeyParts<'static>> {
    (tree, 0, &[][..], 0)..=(tree, u64::MAX, NAME_KEY_ABOVE, u64::MAX)
}

/// A children-index row: the key's name and the value's fields; its
/// items are still encoded (see [`child_items`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildEntry<'a> {
    /// Meta time of the child (see [`super::NodeRecord::time`]).
    pub time: Timestamp,
    pub internal: bool,
    pub name_key: &'a [u8],
    /// The meta's items, encoded as [`encode_child_value`] writes them.
    pub items: &'a [u8],
}

/// Bytes of a children row's value before its items.
const CHILD_VALUE_HEAD: usize = 9;

/// The value of a children row: `time (8, BE) ++ internal (1) ++ items`,
/// the node's meta, so that a listing in name order reads each node's
/// meta from the rows it walks anyway (docs/design.md §5). The items are
/// `count (varint) ++ named (varint) ++ item*`, each item `key length
/// (varint) ++ key ++ value length (varint) ++ value`. `named` is 0, or
/// `i + 1` when item `i` is the `FileName` the key's name key holds: that
/// item is left out (its key and value are known). The name key of a meta
/// comes from its first `FileName` item ([`super::name_key`]), so `named`
/// names that one.
pub fn encode_child_value(out: &mut Vec<u8>, time: Timestamp, internal: bool, items: &[KeyValue]) {
    out.clear();
    out.extend_from_slice(&time.to_be_bytes());
    out.push(u8::from(internal));
    let named = items.iter().position(|kv| kv.key == ATTR_FILE_NAME);
    put_varint(out, items.len() as u64);
    put_varint(out, named.map_or(0, |i| i as u64 + 1));
    for (i, kv) in items.iter().enumerate() {
        if Some(i) == named {
            continue;
        }
        put_varint(out, kv.key.len() as u64);
        out.extend_from_slice(kv.key.as_bytes());
        put_varint(out, kv.value.len() as u64);
        out.extend_from_slice(&kv.value);
    }
}

/// The row stored under `key` with value `bytes`; its items are checked
/// when decoded ([`child_items`]).
pub fn decode_child<'a>(key: ChildKeyParts<'a>, bytes: &'a [u8]) -> Result<ChildEntry<'a>> {
    if bytes.len() < CHILD_VALUE_HEAD {
        return Err(Error::Malformed("children row too short".into()));
    }
    let internal = match bytes[8] {
        0 => false,
        1 => true,
        other => return Err(Error::Malformed(format!("children row flag {other}"))),
    };
    let name_key = key.2;
    if !super::name_key_valid(name_key) {
        return Err(Error::Malformed("children row name key".into()));
    }
    Ok(ChildEntry {
        time: be_u64(&bytes[..8]),
        internal,
        name_key,
        items: &bytes[CHILD_VALUE_HEAD..],
    })
}

/// The items of a children row, in order, the named `FileName` put back
/// from the row's name key. `Malformed` for bytes [`encode_child_value`]
/// does not write.
pub fn child_items(entry: &ChildEntry<'_>) -> Result<Vec<KeyValue>> {
    let mut out = Vec::new();
    child_items_into(entry, &mut out)?;
    Ok(out)
}

/// [`child_items`] appended to `out`.
pub fn child_items_into(entry: &ChildEntry<'_>, out: &mut Vec<KeyValue>) -> Result<()> {
    let bad = |what: &str| Error::Malformed(format!("children row items: {what}"));
    let mut rest = entry.items;
    let count = take_varint(&mut rest).ok_or_else(|| bad("count"))?;
    let named = take_varint(&mut rest).ok_or_else(|| bad("name position"))?;
    // Every item but the named one takes at least two bytes.
    if count > rest.len() as u64 / 2 + 1 || named > count {
        return Err(bad("count"));
    }
    let named = named.checked_sub(1);
    if named.is_some() && entry.name_key.first() != Some(&1) {
        return Err(bad("a named item without a name"));
    }
    out.reserve(count as usize);
    for i in 0..count {
        if Some(i) == named {
            out.push(KeyValue {
                key: ATTR_FILE_NAME.into(),
                value: entry.name_key[1..].to_vec(),
            });
            continue;
        }
        let key = take_field(&mut rest).ok_or_else(|| bad("key cut short"))?;
        let key = std::str::from_utf8(key).map_err(|_| bad("key is not UTF-8"))?;
        if key == ATTR_FILE_NAME && named.is_none_or(|n| i < n) {
            return Err(bad("the name item stored in full"));
        }
        let value = take_field(&mut rest).ok_or_else(|| bad("value cut short"))?;
        out.push(KeyValue {
            key: key.into(),
            value: value.to_vec(),
        });
    }
    if !rest.is_empty() {
        return Err(bad("trailing bytes"));
    }
    Ok(())
}

/// Appends `v` as an LEB128 varint.
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Takes an LEB128 varint off the front of `bytes`: `None` when it is cut
/// short or longer than a `u64` (or not minimal: one value, one encoding).
fn take_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        let part = u64::from(byte & 0x7f);
        if i == 9 && byte > 1 {
            return None;
        }
        value |= part << (7 * i);
        if byte & 0x80 == 0 {
            if byte == 0 && i > 0 {
                return None;
            }
            *bytes = &bytes[i + 1..];
            return Some(value);
        }
    }
    None
}

/// Takes `length (varint) ++ bytes` off the front of `bytes`.
fn take_field<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = take_varint(bytes)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|&len| len <= bytes.len())?;
    let (field, rest) = bytes.split_at(len);
    *bytes = rest;
    Some(field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Key, Value};

    #[test]
    fn keys_round_trip_and_order_by_tree_parent_name_then_child() {
        let names: [&[u8]; 6] = [b"\x00", b"\x01", b"\x01a", b"\x01ab", b"\x01b", b"\x01\xff"];
        let mut parts = Vec::new();
        for tree in [0, 5, u64::MAX] {
            for parent in [ROOT, 42, TRASH] {
                for name in names {
                    for child in [0, 7, u64::MAX] {
                        parts.push((tree, parent, name, child));
                    }
                }
            }
        }
        for x in &parts {
            let bytes = ChildKey::as_bytes(x);
            assert_eq!(ChildKey::from_bytes(&bytes), *x);
            for y in &parts {
                let order = ChildKey::compare(&bytes, &ChildKey::as_bytes(y));
                assert_eq!(order, x.cmp(y), "{x:?} {y:?}");
            }
        }
    }

    #[test]
    fn one_parents_rows_form_one_range_and_names_sort_bytewise() {
        let t = 5;
        for parent in [ROOT, 42, TRASH] {
            let all = children_range(t, parent);
            let named = children_named_range(t, parent, b"\x01x");
            assert!(all.contains(named.start()) && all.contains(named.end()));
            assert!(child_key(t, parent, b"\x01x", 1) < child_key(t, parent, b"\x01x", 2));
            assert!(child_key(t, parent, b"\x01x", u64::MAX) < child_key(t, parent, b"\x01y", 0));
            // Numbered names created in order follow each other.
            assert!(
                child_key(t, parent, b"\x01object-17", 9)
                    < child_key(t, parent, b"\x01object-18", 1)
            );
            assert!(all.contains(&child_key(t, parent, b"\x00", 0)));
            assert!(all.contains(&child_key(t, parent, b"\x01\xff\xff", u64::MAX)));
            assert!(!all.contains(&child_key(t, parent.wrapping_add(1), b"\x00", 0)));
            assert!(tree_children(t).contains(all.start()) && tree_children(t).contains(all.end()));
        }
        assert!(!tree_children(t).contains(&child_key(t + 1, ROOT, b"\x00", 0)));
        assert!(!tree_children(t).contains(&child_key(t - 1, TRASH, b"\x01", 0)));
    }

    fn items_of(pairs: &[(&str, &[u8])]) -> Vec<KeyValue> {
        pairs.iter().map(|(k, v)| KeyValue::new(*k, *v)).collect()
    }

    /// Every meta comes back whole, the name taken from the key; the name
    /// is not stored twice.
    #[test]
    fn values_round_trip_and_leave_the_name_to_the_key() {
        let metas = [
            items_of(&[]),
            items_of(&[(ATTR_FILE_NAME, b"dir")]),
            items_of(&[
                ("Size", b"12"),
                (ATTR_FILE_NAME, b"a.bin"),
                (ATTR_FILE_NAME, b"b"),
            ]),
            items_of(&[("", b""), ("k", &[0xff; 200])]),
        ];
        let mut value = Vec::new();
        for items in &metas {
            let name = super::super::name_key(items);
            encode_child_value(&mut value, 7, items.len() == 1, items);
            let key = child_key(1, 2, &name, 3);
            let entry = decode_child(key, &value).unwrap();
            assert_eq!((entry.time, entry.internal), (7, items.len() == 1));
            assert_eq!(child_items(&entry).unwrap(), *items);
            if let Some(kv) = items.iter().find(|kv| kv.key == ATTR_FILE_NAME) {
                let stored = value.windows(kv.value.len()).filter(|w| *w == kv.value);
                assert_eq!(stored.count(), 0, "the name is stored in the key only");
            }
        }
    }

    #[test]
    fn damaged_rows_are_errors() {
        let items = items_of(&[(ATTR_FILE_NAME, b"a"), ("k", b"v")]);
        let mut value = Vec::new();
        encode_child_value(&mut value, 9, false, &items);
        let key = child_key(1, 2, b"\x01a", 3);
        assert_eq!(
            child_items(&decode_child(key, &value).unwrap()).unwrap(),
            items
        );
        assert!(decode_child(key, &value[..8]).is_err());
        let mut flag = value.clone();
        flag[8] = 2;
        assert!(decode_child(key, &flag).is_err());
        assert!(decode_child(child_key(1, 2, b"", 3), &value).is_err());
        assert!(decode_child(child_key(1, 2, b"\x00x", 3), &value).is_err());
        // A named item under a key without a name.
        let unnamed = decode_child(child_key(1, 2, b"\x00", 3), &value).unwrap();
        assert!(child_items(&unnamed).is_err());
        // Every cut is an error, never a panic; so is a byte too many.
        for cut in CHILD_VALUE_HEAD..value.len() {
            let entry = decode_child(key, &value[..cut]).unwrap();
            assert!(child_items(&entry).is_err(), "cut at {cut}");
        }
        let mut longer = value.clone();
        longer.push(0);
        assert!(child_items(&decode_child(key, &longer).unwrap()).is_err());
        // Varints: cut short, too long, not minimal.
        for bad in [&[0x80][..], &[0xff; 11], &[0x81, 0x00]] {
            assert_eq!(take_varint(&mut &bad[..]), None, "{bad:?}");
        }
        for v in [0, 1, 127, 128, 300, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut rest = out.as_slice();
            assert_eq!(take_varint(&mut rest), Some(v));
            assert!(rest.is_empty());
        }
    }
}
