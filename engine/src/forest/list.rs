//! Paged listings: the children of one node, and a subtree in pre-order,
//! a page at a time, in name order or id order, whatever the size of the
//! directory (docs/design.md §4).
//!
//! Each page opens its own read snapshot, so a slow reader pins nothing
//! between pages, and holds no more than the page itself plus one entry
//! per level of the tree it stands in. A page ends with a
//! [`ListCursor`]: the last node it gave, the parent it hung under, its
//! name key (name order) and a digest of the path from the listing's root
//! to that parent. The next page finds its place again from those alone:
//!
//! - the parent's path is rebuilt by parent pointers (one point read per
//!   level) and must still give the digest, or the page is refused with
//!   [`Error::CursorRefused`]: the place the listing stood in moved or
//!   left the subtree, and any continuation would skip or repeat nodes
//!   that never moved;
//! - if the last node still hangs there (same parent, same name in name
//!   order), the walk goes on with its first child (depth allowing);
//! - otherwise, moved or removed, the walk goes on with the first sibling
//!   after its old place `(name key, id)` (id order: after its id), then
//!   climbs as pre-order does.
//!
//! So a node that keeps its path from the root through the whole listing
//! is listed exactly once, in order, or the listing is refused; a node
//! that moves while the listing passes may be listed twice or not at all.
//! A children listing stands in one directory, whose path does not
//! matter: it is never refused for moves.
//!
//! Name order is the children index's own order, `(name key, id)`: each
//! directory is read as a range from the cursor on, O(log n) to find the
//! place and O(1) a node after that, each node's meta read from the row
//! the range gives (the children index holds it). Id order has no index: each directory
//! level a page visits is scanned whole for the smallest ids after the
//! place, keeping only as many as the page can still take (a heap of at
//! most the page's node count). A page of a directory of n children then
//! costs O(n log page) instead of O(page), and listing it whole
//! O(n² / page): the price of not keeping a second index that every write
//! would pay for (docs/design.md §4).

use super::query::AnswerBounds;
use super::records::*;
use super::{read, Forest, TreeRead};
use crate::error::{Error, Result};
use crate::types::*;
use serde::{Deserialize, Serialize};
use std::collections::{BinaryHeap, VecDeque};
use std::ops::Bound;

/// The order a listing gives each node's children in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ListOrder {
    /// Ascending id, as `get_subtree` answers.
    Id,
    /// Ascending name key (see [`name_key`]: nodes without a `FileName`
    /// first, then names bytewise), ties by ascending id: the children
    /// index's order, what an object store lists keys in.
    Name,
}

/// What a listing lists; a cursor continues only the listing it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Scope {
    Children { parent: NodeId },
    Subtree { root: NodeId, depth: u32 },
}

/// Where a page of a listing ended (see the module comment). Opaque to
/// callers, who hand it back for the next page; [`ListCursor::to_bytes`]
/// and [`ListCursor::from_bytes`] carry it as a token. Its size does not
/// grow with the listing: a few integers and one name key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListCursor {
    scope: Scope,
    order: ListOrder,
    /// The last node the page gave.
    last: NodeId,
    /// Its parent then (the root itself when the root came last).
    parent: NodeId,
    /// Its name key then, in name order; empty in id order.
    #[serde(with = "serde_bytes")]
    name_key: Vec<u8>,
    /// [`path_step`] over the path from the root's child down to
    /// `parent` (0 for the root).
    path: u64,
}

/// Bytes a cursor takes in an answer besides its name key (postcard:
/// a few varints and tags).
pub const CURSOR_OVERHEAD_BYTES: usize = 64;

impl ListCursor {
    /// The cursor as a token (postcard).
    pub fn to_bytes(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("encoding a cursor cannot fail")
    }

    /// A cursor from [`ListCursor::to_bytes`]; `Malformed` otherwise.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        match postcard::take_from_bytes(bytes) {
            Ok((cursor, [])) => Ok(cursor),
            Ok(_) => Err(Error::Malformed("cursor: trailing bytes".into())),
            Err(e) => Err(Error::Malformed(format!("cursor: {e}"))),
        }
    }

    /// The last node of the page the cursor ends.
    pub fn last(&self) -> NodeId {
        self.last
    }

    /// The parent that node hung under when the page was read.
    pub fn last_parent(&self) -> NodeId {
        self.parent
    }

    /// Its name key then, in name order (empty in id order).
    pub fn last_name_key(&self) -> &[u8] {
        &self.name_key
    }
}

/// One page of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    pub nodes: Vec<NodeInfo>,
    /// Where the next page starts; `None` once the listing is complete. A
    /// page that ends on a bound always carries one, so the page after it
    /// may be empty.
    pub next: Option<ListCursor>,
}

impl Forest {
    /// One page of the children of `parent`, in `order`, after `after`
    /// (the `next` of the previous page; `None` starts the listing). The
    /// page holds at most `bounds.nodes_max` nodes and, counting each
    /// node's meta, `bounds.node_overhead_bytes` per node and the cursor,
    /// at most `bounds.bytes_max` bytes; a first node that alone exceeds
    /// it is `TooLarge`. `NodeNotFound` when the tree has no `parent`
    /// (ROOT and TRASH always exist); `CursorRefused` for a cursor of
    /// another listing.
    pub fn list_children_page(
        &self,
        tree: &TreeKey,
        parent: NodeId,
        order: ListOrder,
        after: Option<&ListCursor>,
        bounds: AnswerBounds,
    ) -> Result<ListPage> {
        let scope = Scope::Children { parent };
        check_cursor(after, scope, order)?;
        let read = self.read_tree(tree)?;
        check_exists(&read, parent)?;
        let mut walk = Walk::new(&read, order, 2, bounds)?;
        let start = match after {
            None => After::Start,
            Some(cursor) => {
                if cursor.parent != parent {
                    return Err(refused("the cursor stands under another parent"));
                }
                After::Key(cursor.name_key.clone(), cursor.last)
            }
        };
        walk.levels.push(Level::closed(parent, 2, 0, start));
        walk.run(scope)
    }

    /// One page of the subtree under `root` in pre-order (every node
    /// before its children, each node's children in `order`), down to
    /// `depth` levels (0 = all, 1 = the root alone, 2 = the root and its
    /// children, as [`Forest::get_subtree`]), after `after` (the `next`
    /// of the previous page; `None` starts with the root). ROOT and TRASH
    /// as the root come with an empty meta and themselves as parent.
    /// Bounds as [`Forest::list_children_page`]. `NodeNotFound` when the
    /// tree has no `root`; `CursorRefused` for a cursor of another
    /// listing, or one whose place moved or left the subtree since its
    /// page (see the module comment).
    pub fn get_subtree_page(
        &self,
        tree: &TreeKey,
        root: NodeId,
        depth: u32,
        order: ListOrder,
        after: Option<&ListCursor>,
        bounds: AnswerBounds,
    ) -> Result<ListPage> {
        let scope = Scope::Subtree { root, depth };
        check_cursor(after, scope, order)?;
        let read = self.read_tree(tree)?;
        check_exists(&read, root)?;
        let mut walk = Walk::new(&read, order, depth, bounds)?;
        match after {
            None => {
                let info = match root {
                    ROOT | TRASH => NodeInfo {
                        id: root,
                        parent: root,
                        meta: Meta::default(),
                    },
                    _ => read::node_info(&read.rows, &read.children, read.rec.number, root)?
                        .expect("the root was just found"),
                };
                walk.name.clear();
                let fits = walk.fits(&info.meta)?;
                assert!(fits, "the first node of a page fits or is refused");
                walk.emit(info, 0);
                walk.descend(root, 1, 0)?;
            }
            Some(cursor) if cursor.last == root => walk.descend(root, 1, 0)?,
            Some(cursor) => walk.resume(root, cursor)?,
        }
        walk.run(scope)
    }
}

/// Refuses a cursor of another listing, or one no page of this order
/// could have made.
fn check_cursor(after: Option<&ListCursor>, scope: Scope, order: ListOrder) -> Result<()> {
    let Some(cursor) = after else {
        return Ok(());
    };
    if cursor.scope != scope || cursor.order != order {
        return Err(refused("the cursor continues another listing"));
    }
    let root_came_last = matches!(scope, Scope::Subtree { root, .. } if root == cursor.last);
    let key_valid = match order {
        _ if root_came_last => cursor.name_key.is_empty(),
        ListOrder::Id => cursor.name_key.is_empty(),
        ListOrder::Name => name_key_valid(&cursor.name_key),
    };
    if !key_valid {
        return Err(refused("the cursor's name key"));
    }
    Ok(())
}

fn check_exists(read: &TreeRead, node: NodeId) -> Result<()> {
    if matches!(node, ROOT | TRASH)
        || read::node_record(&read.rows, read.rec.number, node)?.is_some()
    {
        return Ok(());
    }
    Err(Error::NodeNotFound(node))
}

fn refused(why: &str) -> Error {
    Error::CursorRefused(why.into())
}

/// The path digest of `node` (named `name_key`, empty in id order) under
/// a parent whose path digest is `parent_path`.
fn path_step(parent_path: u64, node: NodeId, name_key: &[u8]) -> u64 {
    use xxhash_rust::xxh3::xxh3_64_with_seed;
    xxh3_64_with_seed(
        name_key,
        xxh3_64_with_seed(&node.to_le_bytes(), parent_path),
    )
}

/// Where a level's siblings start.
enum After {
    /// At the first child.
    Start,
    /// After this child, whose name key its node record holds (a node on
    /// the checked path, which the snapshot holds).
    Node(NodeId),
    /// After `(name key, id)` (the name is ignored in id order).
    Key(Vec<u8>, NodeId),
}

/// The children of one node being walked.
struct Level<'r> {
    parent: NodeId,
    /// Level of these children, the root being level 1.
    level: u32,
    /// [`path_step`] digest of `parent`'s path.
    path: u64,
    siblings: Siblings<'r>,
}

// The range is the common variant and levels are few (one per tree level
// a page stands in): not worth an allocation each.
#[allow(clippy::large_enum_variant)]
enum Siblings<'r> {
    /// Not read yet.
    Closed(After),
    /// Name order: the rest of the parent's index range.
    Name(redb::Range<'r, ChildKey, &'static [u8]>),
    /// Id order: the smallest ids after the place as `(id, meta time)`,
    /// ascending; `complete` when no other child follows them.
    Id {
        batch: VecDeque<(NodeId, Timestamp)>,
        complete: bool,
    },
}

impl Level<'_> {
    fn closed(parent: NodeId, level: u32, path: u64, after: After) -> Self {
        Self {
            parent,
            level,
            path,
            siblings: Siblings::Closed(after),
        }
    }
}

/// The last node a page gave, for its cursor.
struct Last {
    id: NodeId,
    parent: NodeId,
    path: u64,
}

/// One page's walk over one snapshot.
struct Walk<'r> {
    read: &'r TreeRead,
    order: ListOrder,
    /// Deepest level listed; 0 = all.
    depth: u32,
    bounds: AnswerBounds,
    /// Innermost last: the children being walked at each level.
    levels: Vec<Level<'r>>,
    nodes: Vec<NodeInfo>,
    bytes: usize,
    last: Option<Last>,
    /// Name key of the child just read (name order).
    name: Vec<u8>,
    /// Name key of `last` (name order).
    last_name: Vec<u8>,
    /// Ids held in the id-order batches of all levels; kept at most the
    /// room left in the page (see `fill`).
    cached: usize,
}

impl<'r> Walk<'r> {
    fn new(read: &'r TreeRead, order: ListOrder, depth: u32, bounds: AnswerBounds) -> Result<Self> {
        if bounds.nodes_max == 0 {
            return Err(Error::TooLarge {
                what: "list page".into(),
                size: 1,
                limit: 0,
            });
        }
        Ok(Self {
            read,
            order,
            depth,
            bounds,
            levels: Vec::new(),
            nodes: Vec::with_capacity(bounds.nodes_max.min(1024)),
            bytes: 0,
            last: None,
            name: Vec::new(),
            last_name: Vec::new(),
            cached: 0,
        })
    }

    fn tree(&self) -> u64 {
        self.read.rec.number
    }

    /// Whether a node with `meta` (named `self.name`) still fits the page
    /// with its cursor. The first node of a page that does not is
    /// `TooLarge`: no page could hold it.
    fn fits(&mut self, meta: &Meta) -> Result<bool> {
        let node = meta.size_bytes() + self.bounds.node_overhead_bytes;
        let cursor = match self.order {
            ListOrder::Name => self.name.len(),
            ListOrder::Id => 0,
        } + CURSOR_OVERHEAD_BYTES;
        let total = self.bytes.saturating_add(node);
        let needed = total.saturating_add(cursor);
        if needed <= self.bounds.bytes_max {
            self.bytes = total;
            return Ok(true);
        }
        if self.nodes.is_empty() {
            return Err(Error::TooLarge {
                what: "list page".into(),
                size: needed as u64,
                limit: self.bounds.bytes_max as u64,
            });
        }
        Ok(false)
    }

    /// Adds a node that fits; `path` is its parent's path digest.
    fn emit(&mut self, info: NodeInfo, path: u64) {
        self.last = Some(Last {
            id: info.id,
            parent: info.parent,
            path,
        });
        std::mem::swap(&mut self.name, &mut self.last_name);
        self.nodes.push(info);
    }

    /// Walks `node`'s children next if the depth allows; `level` is the
    /// node's, `path` its parent's path digest. Its name key is
    /// `self.last_name` (it was given last) unless it is the root.
    fn descend(&mut self, node: NodeId, level: u32, path: u64) -> Result<()> {
        if self.depth != 0 && level >= self.depth {
            return Ok(());
        }
        let own = if level == 1 {
            0
        } else {
            path_step(path, node, self.key_for_path())
        };
        let siblings = match self.order {
            ListOrder::Name => {
                let range = children_range(self.tree(), node);
                Siblings::Name(self.read.children.range(range)?)
            }
            ListOrder::Id => Siblings::Closed(After::Start),
        };
        self.levels.push(Level {
            parent: node,
            level: level + 1,
            path: own,
            siblings,
        });
        Ok(())
    }

    /// The last node's name as the path digest takes it.
    fn key_for_path(&self) -> &[u8] {
        match self.order {
            ListOrder::Name => &self.last_name,
            ListOrder::Id => &[],
        }
    }

    /// Finds the place `cursor` left the listing of `root` at, in this
    /// snapshot: the levels from the root down to the cursor's parent,
    /// each continuing after the child on the path, and the last node's
    /// own children if it still stands there.
    fn resume(&mut self, root: NodeId, cursor: &ListCursor) -> Result<()> {
        let t = self.tree();
        let rows = &self.read.rows;
        // Up from the cursor's parent to the root, by parent pointers.
        let mut up = Vec::new();
        let mut node = cursor.parent;
        while node != root {
            if up.len() as u64 > self.read.rec.node_count {
                return Err(Error::Malformed(format!(
                    "tree {t}: the parents above {} loop",
                    cursor.parent
                )));
            }
            let Some(record) = read::node_record(rows, t, node)? else {
                return Err(refused("the listing's place left the subtree"));
            };
            up.push(node);
            node = record.parent;
        }
        let parent_level = up.len() as u32 + 1;
        if self.depth != 0 && parent_level >= self.depth {
            return Err(refused("the cursor stands deeper than the listing"));
        }
        // Down again: one level per node on the path, each continuing
        // after the path's next node.
        let mut path = 0u64;
        let mut parent = root;
        let mut level = 2;
        for &node in up.iter().rev() {
            let record = read::node_record(rows, t, node)?.expect("found on the way up");
            let key: &[u8] = match self.order {
                ListOrder::Name => &record.name_key,
                ListOrder::Id => &[],
            };
            let after = After::Node(node);
            self.levels.push(Level::closed(parent, level, path, after));
            path = path_step(path, node, key);
            parent = node;
            level += 1;
        }
        if path != cursor.path {
            return Err(refused("the listing's place moved"));
        }
        let after = After::Key(cursor.name_key.clone(), cursor.last);
        self.levels.push(Level::closed(parent, level, path, after));
        // The last node's children follow it if it still stands there.
        if let Some(record) = read::node_record(rows, t, cursor.last)? {
            let same_name = self.order == ListOrder::Id || record.name_key == cursor.name_key;
            if record.parent == cursor.parent && same_name {
                self.last_name.clone_from(&cursor.name_key);
                self.descend(cursor.last, level, path)?;
            }
        }
        Ok(())
    }

    /// Gives nodes until the page is full or the walk ends.
    fn run(mut self, scope: Scope) -> Result<ListPage> {
        loop {
            let Some(top) = self.levels.len().checked_sub(1) else {
                return Ok(self.finish(scope, false));
            };
            if self.nodes.len() >= self.bounds.nodes_max {
                return Ok(self.finish(scope, true));
            }
            let Some((id, time, items)) = self.next_child(top)? else {
                self.levels.pop();
                continue;
            };
            let (parent, level, path) = {
                let at = &self.levels[top];
                (at.parent, at.level, at.path)
            };
            let items = match items {
                Some(items) => items,
                None => self.items_of(id, time)?,
            };
            let meta = Meta { time, items };
            if !self.fits(&meta)? {
                return Ok(self.finish(scope, true));
            }
            self.emit(NodeInfo { id, parent, meta }, path);
            self.descend(id, level, path)?;
        }
    }

    fn finish(self, scope: Scope, more: bool) -> ListPage {
        let next = match (more, self.last) {
            (true, Some(last)) => Some(ListCursor {
                scope,
                order: self.order,
                last: last.id,
                parent: last.parent,
                name_key: match self.order {
                    ListOrder::Name => self.last_name,
                    ListOrder::Id => Vec::new(),
                },
                path: last.path,
            }),
            _ => None,
        };
        ListPage {
            nodes: self.nodes,
            next,
        }
    }

    /// The meta items of child `id` whose meta time is `time`, by point
    /// reads (id order, whose batches hold ids only).
    fn items_of(&self, id: NodeId, time: Timestamp) -> Result<Vec<KeyValue>> {
        let (rows, tree) = (&self.read.rows, self.tree());
        let node = read::node_record(rows, tree, id)?.expect("the snapshot's index names it");
        assert_eq!(
            node.time, time,
            "tree {tree}: node {id} and its index row disagree"
        );
        read::node_items(&self.read.children, tree, id, &node)
    }

    /// The next child at level `at` as `(id, meta time, meta items)`, its
    /// name key in `self.name` (name order). The items come with the
    /// child in name order, whose rows hold them; in id order they are
    /// read once the child is given (`items_of`).
    #[allow(clippy::type_complexity)]
    fn next_child(
        &mut self,
        at: usize,
    ) -> Result<Option<(NodeId, Timestamp, Option<Vec<KeyValue>>)>> {
        if let Siblings::Closed(_) = self.levels[at].siblings {
            self.open(at)?;
        }
        match &mut self.levels[at].siblings {
            Siblings::Closed(_) => unreachable!("opened above"),
            Siblings::Name(range) => {
                let Some(row) = range.next() else {
                    return Ok(None);
                };
                let (key, value) = row?;
                let key = key.value();
                let entry = decode_child(key, value.value())?;
                self.name.clear();
                self.name.extend_from_slice(entry.name_key);
                Ok(Some((key.3, entry.time, Some(child_items(&entry)?))))
            }
            Siblings::Id { batch, complete } => match batch.pop_front() {
                Some((id, time)) => {
                    self.cached -= 1;
                    Ok(Some((id, time, None)))
                }
                None => {
                    // See `fill`: the page is full before a batch that
                    // lost its tail runs out.
                    assert!(*complete, "a cut batch ran out before its page was full");
                    Ok(None)
                }
            },
        }
    }

    /// Reads where level `at` starts.
    fn open(&mut self, at: usize) -> Result<()> {
        let t = self.tree();
        let parent = self.levels[at].parent;
        let Siblings::Closed(after) = &self.levels[at].siblings else {
            return Ok(());
        };
        let (name, id) = match after {
            After::Start => (None, None),
            After::Key(name, id) => (Some(name.clone()), Some(*id)),
            After::Node(id) => {
                let name = match self.order {
                    ListOrder::Name => {
                        let record = read::node_record(&self.read.rows, t, *id)?;
                        Some(record.expect("a node on the checked path").name_key)
                    }
                    ListOrder::Id => None,
                };
                (name, Some(*id))
            }
        };
        match self.order {
            ListOrder::Name => {
                let range = children_range(t, parent);
                let rows = match (&name, id) {
                    (Some(name), Some(id)) => {
                        let start = Bound::Excluded(child_key(t, parent, name, id));
                        let end = Bound::Included(*range.end());
                        self.read.children.range((start, end))?
                    }
                    _ => self.read.children.range(range)?,
                };
                self.levels[at].siblings = Siblings::Name(rows);
            }
            ListOrder::Id => self.fill(at, id)?,
        }
        Ok(())
    }

    /// Id order: level `at` takes the smallest ids after `after`, as many
    /// as the page has room for. Every id held by a deeper level comes out
    /// (with its subtree) before the ones of the levels above it, so
    /// those keep only the room left after the deeper ones: the batches of
    /// all levels together never hold more than the page's room. A batch
    /// cut here never runs out within its page: every later fill cuts
    /// again with what is then held below it, and the ids held below the
    /// last cut, then its own, fill the page.
    fn fill(&mut self, at: usize, after: Option<NodeId>) -> Result<()> {
        let t = self.tree();
        let parent = self.levels[at].parent;
        let room = self.bounds.nodes_max - self.nodes.len();
        let mut heap = BinaryHeap::new();
        let mut beyond = 0usize;
        for row in self.read.children.range(children_range(t, parent))? {
            let (key, value) = row?;
            let key = key.value();
            let id = key.3;
            if after.is_some_and(|a| id <= a) {
                continue;
            }
            beyond += 1;
            if heap.len() == room {
                match heap.peek() {
                    Some(&(top, _)) if top > id => {
                        heap.pop();
                    }
                    _ => continue,
                }
            }
            let entry = decode_child(key, value.value())?;
            heap.push((id, entry.time));
        }
        let batch: VecDeque<(NodeId, Timestamp)> = heap.into_sorted_vec().into();
        let mut ahead = batch.len();
        self.cached += ahead;
        self.levels[at].siblings = Siblings::Id {
            batch,
            complete: beyond <= room,
        };
        for level in self.levels[..at].iter_mut().rev() {
            if ahead >= self.cached {
                break;
            }
            if let Siblings::Id { batch, complete } = &mut level.siblings {
                let keep = room.saturating_sub(ahead);
                if batch.len() > keep {
                    self.cached -= batch.len() - keep;
                    batch.truncate(keep);
                    *complete = false;
                }
                ahead += batch.len();
            }
        }
        assert!(
            self.cached <= room,
            "{} ids held for a page with room for {room}",
            self.cached
        );
        Ok(())
    }
}
