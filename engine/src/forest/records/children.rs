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

use super::be_u64;
use super::rows::row_key_word;
use crate::error::{Error, Result};
use crate::types::*;
use redb::TableDefinition;

/// `(tree number, parent, name key, child)` -> `meta time (8, BE) ++
/// internal (1)`. The name key (see [`super::name_key`]) is `[0]` for a
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

/// A children-index row: the key's name and the value's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChildEntry<'a> {
    /// Meta time of the child (see [`super::NodeRecord::time`]).
    pub time: Timestamp,
    pub internal: bool,
    pub name_key: &'a [u8],
}

const CHILD_VALUE_BYTES: usize = 9;

/// The value of a children row, `time (8, BE) ++ internal (1)`.
pub fn encode_child_value(entry: ChildEntry<'_>) -> [u8; CHILD_VALUE_BYTES] {
    assert!(
        super::name_key_valid(entry.name_key),
        "writing a broken name key"
    );
    let mut out = [0; CHILD_VALUE_BYTES];
    out[..8].copy_from_slice(&entry.time.to_be_bytes());
    out[8] = u8::from(entry.internal);
    out
}

/// The row stored under `key` with value `bytes`.
pub fn decode_child<'a>(key: ChildKeyParts<'a>, bytes: &[u8]) -> Result<ChildEntry<'a>> {
    if bytes.len() != CHILD_VALUE_BYTES {
        return Err(Error::Malformed("children row of the wrong size".into()));
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
    })
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

    #[test]
    fn damaged_rows_are_errors() {
        let entry = ChildEntry {
            time: 9,
            internal: true,
            name_key: b"\x01a",
        };
        let value = encode_child_value(entry);
        let key = child_key(1, 2, b"\x01a", 3);
        assert_eq!(decode_child(key, &value), Ok(entry));
        assert!(decode_child(key, &value[..8]).is_err());
        let mut flag = value;
        flag[8] = 2;
        assert!(decode_child(key, &flag).is_err());
        assert!(decode_child(child_key(1, 2, b"", 3), &value).is_err());
        assert!(decode_child(child_key(1, 2, b"\x00x", 3), &value).is_err());
        // A key too short to hold its integers decodes with no name.
        assert_eq!(ChildKey::from_bytes(&[1, 2, 3]).2, b"");
    }
}
