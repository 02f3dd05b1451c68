//! Input checks: pure functions of a request and the limits, called by the
//! service on arrival and by the forest before a batch touches storage, so
//! that both refuse the same inputs with the same typed errors
//! (docs/design.md §4). Nothing here reads state: whether a tree or a node
//! exists is for the forest to say.

use crate::error::{Error, Result};
use crate::forest::WriteOp;
use crate::types::*;

/// Longest tree id, in bytes.
pub const MAX_TREE_ID_BYTES: usize = 1024;

/// The bounds an input is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputLimits {
    /// Largest meta of one node (see [`Meta::size_bytes`]).
    pub max_meta_bytes: usize,
    /// Longest path, in components.
    pub max_path_len: usize,
}

pub fn too_large(what: &str, size: usize, limit: usize) -> Error {
    Error::TooLarge {
        what: what.into(),
        size: size as u64,
        limit: limit as u64,
    }
}

/// A tree id short enough to be named in one message.
pub fn tree_id(tree: &TreeKey) -> Result<()> {
    if tree.tree.len() > MAX_TREE_ID_BYTES {
        return Err(too_large("tree id", tree.tree.len(), MAX_TREE_ID_BYTES));
    }
    Ok(())
}

/// The size `Meta::size_bytes` gives these items, without copying them.
pub fn items_size_bytes(items: &[KeyValue]) -> usize {
    items
        .iter()
        .map(|kv| kv.key.len() + kv.value.len() + 8)
        .sum()
}

/// A meta no larger than one node may carry.
pub fn items(items: &[KeyValue], limits: InputLimits) -> Result<()> {
    meta_size(items_size_bytes(items), limits)
}

fn meta_size(size: usize, limits: InputLimits) -> Result<()> {
    if size > limits.max_meta_bytes {
        return Err(too_large("meta", size, limits.max_meta_bytes));
    }
    Ok(())
}

/// A path a lookup or AddByPath may walk: the path attribute, at least one
/// component, at most `max_path_len` of them, each one a directory meta
/// that fits, and all of them together no larger than one meta (so a
/// request naming a path stays within one message).
pub fn path(attr: &str, path: &[String], limits: InputLimits) -> Result<()> {
    if attr != ATTR_FILE_NAME {
        return Err(Error::UnsupportedAttribute(attr.to_string()));
    }
    if path.is_empty() {
        return Err(Error::EmptyPath);
    }
    if path.len() > limits.max_path_len {
        return Err(too_large("path", path.len(), limits.max_path_len));
    }
    for component in path {
        meta_size(ATTR_FILE_NAME.len() + component.len() + 8, limits)?;
    }
    let bytes: usize = path.iter().map(String::len).sum();
    if bytes > limits.max_meta_bytes {
        return Err(too_large("path bytes", bytes, limits.max_meta_bytes));
    }
    Ok(())
}

/// A node a local write may move or remove: neither ROOT nor TRASH.
pub fn movable(node: NodeId) -> Result<()> {
    match node {
        ROOT => Err(Error::RootImmutable),
        TRASH => Err(Error::InvalidOp("TRASH is not a node".into())),
        _ => Ok(()),
    }
}

/// A replicated op: a timestamp a local op could have made (counter in
/// `1..=COUNTER_MAX`), a real node as its child, a meta that fits.
pub fn replicated(op: &Move, limits: InputLimits) -> Result<()> {
    let ts = op.ts();
    let counter = timestamp_counter(ts);
    if counter == 0 || counter > COUNTER_MAX {
        return Err(Error::InvalidOp(format!("timestamp {ts} out of range")));
    }
    if op.child == ROOT || op.child == TRASH {
        return Err(Error::InvalidOp(format!("child {} is reserved", op.child)));
    }
    items(&op.meta.items, limits)
}

/// Everything about one write that can be refused without storage.
pub fn write(tree: &TreeKey, op: &WriteOp, limits: InputLimits) -> Result<()> {
    tree_id(tree)?;
    match op {
        WriteOp::Move {
            child, items: meta, ..
        } => {
            if let Some(child) = child {
                movable(*child)?;
            }
            items(meta, limits)
        }
        WriteOp::AddByPath {
            attr,
            path: components,
            items: meta,
        } => {
            path(attr, components, limits)?;
            items(meta, limits)
        }
        WriteOp::Remove { node } => movable(*node),
        WriteOp::Apply { op } | WriteOp::Pulled { op } => replicated(op, limits),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: InputLimits = InputLimits {
        max_meta_bytes: 64,
        max_path_len: 3,
    };

    fn names(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    fn op(ts: Timestamp, child: NodeId) -> Move {
        Move {
            parent: ROOT,
            child,
            meta: Meta {
                time: ts,
                items: Vec::new(),
            },
        }
    }

    #[test]
    fn sizes_are_measured_like_meta() {
        let kvs = vec![
            KeyValue::new("ab", vec![1, 2, 3]),
            KeyValue::new("", vec![]),
        ];
        let meta = Meta {
            time: 0,
            items: kvs.clone(),
        };
        assert_eq!(items_size_bytes(&kvs), meta.size_bytes());
        assert!(items(&[KeyValue::new("k", vec![0; 55])], LIMITS).is_ok());
        assert!(items(&[KeyValue::new("k", vec![0; 56])], LIMITS).is_err());
    }

    #[test]
    fn paths_are_bounded() {
        let ok = |p: &[&str]| path(ATTR_FILE_NAME, &names(p), LIMITS);
        assert!(ok(&["a", "b", "c"]).is_ok());
        assert_eq!(ok(&[]), Err(Error::EmptyPath));
        assert!(
            matches!(ok(&["a", "b", "c", "d"]), Err(Error::TooLarge { what, .. }) if what == "path")
        );
        let long = "x".repeat(50);
        assert!(matches!(ok(&[&long]), Err(Error::TooLarge { what, .. }) if what == "meta"));
        let part = "x".repeat(30);
        assert!(
            matches!(ok(&[&part, &part, &part]), Err(Error::TooLarge { what, .. }) if what == "path bytes")
        );
        assert!(matches!(
            path("Size", &names(&["a"]), LIMITS),
            Err(Error::UnsupportedAttribute(_))
        ));
    }

    #[test]
    fn replicated_ops_need_a_real_timestamp_and_child() {
        assert!(replicated(&op(make_timestamp(1, 1), 5), LIMITS).is_ok());
        for bad in [op(0, 5), op(5, 5), op(u64::MAX, 5)] {
            assert!(matches!(replicated(&bad, LIMITS), Err(Error::InvalidOp(_))));
        }
        for child in [ROOT, TRASH] {
            let bad = op(make_timestamp(1, 1), child);
            assert!(matches!(replicated(&bad, LIMITS), Err(Error::InvalidOp(_))));
        }
    }

    #[test]
    fn local_writes_never_move_root_or_trash() {
        let tree = TreeKey::new(ContainerId([1; 32]), "t");
        let remove = |node| write(&tree, &WriteOp::Remove { node }, LIMITS);
        assert_eq!(remove(ROOT), Err(Error::RootImmutable));
        assert!(matches!(remove(TRASH), Err(Error::InvalidOp(_))));
        assert!(remove(7).is_ok());
        let long = TreeKey::new(ContainerId([1; 32]), "t".repeat(MAX_TREE_ID_BYTES + 1));
        assert!(matches!(
            write(&long, &WriteOp::Remove { node: 7 }, LIMITS),
            Err(Error::TooLarge { .. })
        ));
    }
}
