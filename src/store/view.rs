//! The elements one read-modify-write touches: read from the kernel once (under the lock),
//! changed in memory, then emitted as the smallest batch that turns what was read into what
//! is wanted. Every rule of the store (owner lists, pruning, counting) works on this view, so
//! a change made early in a verb is seen by everything after it, and an element changed twice
//! is written once.

use crate::error::Result;
use crate::kernel::{Batch, Kernel, Op, SetRef};
use crate::plan::Key;
use std::collections::HashMap;

#[derive(Debug, Clone)]
struct Slot {
    /// The comment as read (`None`: no such element).
    before: Option<String>,
    /// The comment as it will be.
    after: Option<String>,
}

pub(crate) struct View<'k, K: Kernel> {
    pub k: &'k mut K,
    slots: HashMap<(SetRef, Key), Slot>,
    /// First-touch order, so batches are deterministic.
    order: Vec<(SetRef, Key)>,
}

impl<'k, K: Kernel> View<'k, K> {
    pub fn new(k: &'k mut K) -> Self {
        View {
            k,
            slots: HashMap::new(),
            order: Vec::new(),
        }
    }

    /// Loads every element of `set` with one dump (GC reads whole sets).
    pub fn preload(&mut self, set: &SetRef) -> Result<Vec<Key>> {
        let mut keys = Vec::new();
        for e in self.k.dump(set)? {
            let id = (set.clone(), e.key);
            if !self.slots.contains_key(&id) {
                self.order.push(id.clone());
                self.slots.insert(
                    id,
                    Slot {
                        before: Some(e.comment.clone().unwrap_or_default()),
                        after: Some(e.comment.unwrap_or_default()),
                    },
                );
            }
            keys.push(e.key);
        }
        Ok(keys)
    }

    /// The element's comment as it stands in this view; `None` when it does not exist.
    pub fn get(&mut self, set: &SetRef, key: &Key) -> Result<Option<String>> {
        let id = (set.clone(), *key);
        if let Some(s) = self.slots.get(&id) {
            return Ok(s.after.clone());
        }
        let now = self.k.get(set, key)?.map(|e| e.comment.unwrap_or_default());
        self.order.push(id.clone());
        self.slots.insert(
            id,
            Slot {
                before: now.clone(),
                after: now.clone(),
            },
        );
        Ok(now)
    }

    /// Sets the element's comment (`None`: the element is to be deleted).
    pub fn set(&mut self, set: &SetRef, key: &Key, comment: Option<String>) -> Result<()> {
        self.get(set, key)?;
        if let Some(s) = self.slots.get_mut(&(set.clone(), *key)) {
            s.after = comment;
        }
        Ok(())
    }

    /// The keys of `set` this view holds an element for.
    pub fn keys_in(&self, set: &SetRef) -> Vec<Key> {
        self.order
            .iter()
            .filter(|(s, k)| s == set && self.slots[&(s.clone(), *k)].after.is_some())
            .map(|(_, k)| *k)
            .collect()
    }

    /// Appends what turns the elements as read into the elements as wanted.
    pub fn emit(self, batch: &mut Batch) {
        for id in self.order {
            let slot = &self.slots[&id];
            if slot.before == slot.after {
                continue;
            }
            let (set, key) = id;
            match &slot.after {
                Some(comment) => batch.push(Op::Put {
                    set,
                    key,
                    comment: comment.clone(),
                }),
                None => batch.push(Op::Del { set, key }),
            }
        }
    }
}
