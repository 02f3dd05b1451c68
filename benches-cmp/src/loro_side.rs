//! Loro's movable tree in memory: no file and no durability, the CRDT's
//! own cost. Loro has no lookup by name, so directories are found through
//! a map beside the document (the index a gateway on Loro would keep);
//! each batch ends with a commit of the document's transaction.

use crate::measure::{timed, Row};
use crate::workload::Object;
use loro::{LoroDoc, LoroTree, TreeID};
use std::collections::HashMap;

/// Directories by (parent, name); `None` is the forest's root level.
type Dirs = HashMap<(Option<TreeID>, String), TreeID>;

fn create(tree: &LoroTree, parent: Option<TreeID>, items: &[(String, String)]) -> TreeID {
    let node = tree.create(parent).expect("tree node created");
    let meta = tree.get_meta(node).expect("node meta");
    for (k, v) in items {
        meta.insert(k, v.as_str()).expect("meta field set");
    }
    node
}

fn add_by_path(tree: &LoroTree, dirs: &mut Dirs, object: &Object) {
    let mut parent = None;
    for name in &object.dirs {
        let key = (parent, name.clone());
        let node = match dirs.get(&key) {
            Some(&node) => node,
            None => {
                let items = [(crate::workload::FILE_NAME.to_string(), name.clone())];
                let node = create(tree, parent, &items);
                dirs.insert(key, node);
                node
            }
        };
        parent = Some(node);
    }
    create(tree, parent, &object.meta);
}

pub fn run(objects: &[Object], batch: usize) -> Row {
    let doc = LoroDoc::new();
    let tree = doc.get_tree("bench");
    let mut dirs = Dirs::new();
    let mut commits = 0;
    let (elapsed, cpu) = timed(objects.len(), batch, |first, len| {
        for object in &objects[first..first + len] {
            add_by_path(&tree, &mut dirs, object);
        }
        doc.commit();
        commits += 1;
    });
    Row {
        name: format!("Loro movable tree, in memory, batch {batch}"),
        ops: objects.len(),
        commits,
        elapsed,
        cpu,
        written_bytes: None,
        syncs: None,
        checkpoints: None,
    }
}
