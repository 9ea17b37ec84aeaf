//! Entry storage for the timing wheel: a slab of nodes with generation-checked
//! indices. Slot lists (in [`super::level`]) are vectors of slab indices, and every
//! node records which list holds it and at which position, so removal is an O(1)
//! `swap_remove`.
//!
//! The choice made, measured (see `benches/wheel.rs`): a slab plus per-slot index
//! vectors rather than intrusive linked lists. Both are O(1) per operation, but walking
//! a linked list during cascade and expiry is a chain of dependent cache misses,
//! whereas reading a vector of indices lets the CPU overlap the node loads; with 1e6
//! entries resident that made steady-state insert+expire several times faster. A
//! generation per node makes a stale [`WheelKey`] miss instead of hitting a reused
//! node, and the module needs no `unsafe`.
//!
//! [`WheelKey`]: super::WheelKey

#![forbid(unsafe_code)]

/// The null index: "no node".
pub(crate) const NIL: u32 = u32::MAX;

/// One slab node, either holding a live entry or on the free list.
///
/// Both variants carry the generation, which is bumped every time the node is
/// vacated, so a key issued for an earlier occupant never matches.
pub(crate) enum Node<T> {
    /// On the free list.
    Vacant {
        /// Generation the next occupant will get.
        generation: u32,
        /// Next vacant node, or [`NIL`].
        next_free: u32,
    },
    /// Holding a live entry.
    Occupied {
        /// Generation of the current occupant; part of its key.
        generation: u32,
        /// Which list holds this node: `level * 64 + slot`, or the overdue list.
        list: u16,
        /// Index of this node within its list's vector.
        position: u32,
        /// The entry's deadline, in ticks, as given to `insert`.
        deadline: u64,
        /// The caller's value.
        value: T,
    },
}

/// The node storage: a vector of nodes plus the head of the free list.
pub(crate) struct Slab<T> {
    /// All nodes ever allocated; vacated nodes are reused before the vector grows.
    nodes: Vec<Node<T>>,
    /// First vacant node, or [`NIL`].
    free_head: u32,
    /// Number of occupied nodes.
    len: usize,
}

impl<T> Slab<T> {
    /// An empty slab with room for `capacity` nodes.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Slab {
            nodes: Vec::with_capacity(capacity),
            free_head: NIL,
            len: 0,
        }
    }

    /// Occupied nodes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Nodes the slab can hold without reallocating.
    pub(crate) fn capacity(&self) -> usize {
        self.nodes.capacity()
    }

    /// Stores `value` in a vacant node and returns `(index, generation)`. The caller
    /// must then place the index in a list and record it with [`Slab::set_place`].
    ///
    /// # Panics
    ///
    /// If `u32::MAX - 1` entries are already live (about 100 GiB of nodes).
    pub(crate) fn insert(&mut self, deadline: u64, value: T) -> (u32, u32) {
        let occupied = |generation| Node::Occupied {
            generation,
            list: 0,
            position: 0,
            deadline,
            value,
        };
        self.len += 1;
        if self.free_head != NIL {
            let index = self.free_head;
            let node = &mut self.nodes[index as usize];
            let Node::Vacant {
                generation,
                next_free,
            } = *node
            else {
                unreachable!("free list invariant: node {index} on the free list is occupied");
            };
            self.free_head = next_free;
            *node = occupied(generation);
            (index, generation)
        } else {
            let index = u32::try_from(self.nodes.len())
                .ok()
                .filter(|&index| index != NIL)
                .expect("slab capacity invariant: at most u32::MAX - 1 live entries");
            self.nodes.push(occupied(0));
            (index, 0)
        }
    }

    /// Whether `index` holds a live entry of `generation`.
    pub(crate) fn is_live(&self, index: u32, generation: u32) -> bool {
        matches!(
            self.nodes.get(index as usize),
            Some(Node::Occupied { generation: g, .. }) if *g == generation
        )
    }

    /// Vacates a live node and returns its deadline and value. The caller must already
    /// have removed the index from its list.
    pub(crate) fn take(&mut self, index: u32) -> (u64, T) {
        let node = &mut self.nodes[index as usize];
        let generation = match node {
            Node::Occupied { generation, .. } => *generation,
            Node::Vacant { .. } => unreachable!("take invariant: node {index} is vacant"),
        };
        let vacant = Node::Vacant {
            generation: generation.wrapping_add(1),
            next_free: self.free_head,
        };
        self.free_head = index;
        self.len -= 1;
        match core::mem::replace(node, vacant) {
            Node::Occupied {
                deadline, value, ..
            } => (deadline, value),
            Node::Vacant { .. } => unreachable!("checked occupied above"),
        }
    }

    /// The deadline of a live node.
    pub(crate) fn deadline(&self, index: u32) -> u64 {
        match &self.nodes[index as usize] {
            Node::Occupied { deadline, .. } => *deadline,
            Node::Vacant { .. } => unreachable!("deadline invariant: node {index} is vacant"),
        }
    }

    /// The list and position of a live node.
    pub(crate) fn place(&self, index: u32) -> (u16, u32) {
        match &self.nodes[index as usize] {
            Node::Occupied { list, position, .. } => (*list, *position),
            Node::Vacant { .. } => unreachable!("place invariant: node {index} is vacant"),
        }
    }

    /// Records that live node `index` now sits at `position` in list `list`.
    pub(crate) fn set_place(&mut self, index: u32, list: u16, position: u32) {
        match &mut self.nodes[index as usize] {
            Node::Occupied {
                list: node_list,
                position: node_position,
                ..
            } => {
                *node_list = list;
                *node_position = position;
            }
            Node::Vacant { .. } => unreachable!("set_place invariant: node {index} is vacant"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Node, Slab};

    #[test]
    fn node_overhead_without_value_is_24_bytes() {
        assert_eq!(core::mem::size_of::<Node<()>>(), 24);
        assert_eq!(core::mem::size_of::<Node<u64>>(), 32);
        assert_eq!(core::mem::size_of::<Node<usize>>(), 32);
    }

    #[test]
    fn generation_bumps_on_reuse() {
        let mut slab = Slab::with_capacity(0);
        let (a, gen_a) = slab.insert(1, 'a');
        assert_eq!(slab.take(a), (1, 'a'));
        let (b, gen_b) = slab.insert(2, 'b');
        assert_eq!(a, b, "a vacated node is reused first");
        assert_ne!(gen_a, gen_b);
        assert!(!slab.is_live(a, gen_a));
        assert!(slab.is_live(b, gen_b));
        assert!(!slab.is_live(99, 0), "an index past the end is not live");
        assert_eq!(slab.len(), 1);
    }

    #[test]
    fn place_round_trips() {
        let mut slab = Slab::with_capacity(1);
        let (a, _) = slab.insert(5, ());
        slab.set_place(a, 700, 42);
        assert_eq!(slab.place(a), (700, 42));
        assert_eq!(slab.deadline(a), 5);
    }
}
