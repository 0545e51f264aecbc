//! natguard's nf_tables state: one batch per invocation, and the reads CHECK, DEL and GC need.
//!
//! Writing: [`Tx`] collects messages between BATCH_BEGIN and BATCH_END; `commit` sends them in
//! one `sendmsg` and reads the outcome from the kernel's replies (one ACK on the last message,
//! an error for any message that fails; see `netlink`), so a transaction lands whole or not at
//! all, and its outcome is never guessed. A set's elements may span several messages of the
//! batch (`encode::set_elems`). Idempotency
//! lives in the batch: "make sure element E exists with comment C" is add, delete, add; "make
//! sure E is absent" is add, delete. Neither needs to know the current state, and neither can
//! fail with EEXIST or ENOENT.
//!
//! Reading: single-element GETs (the kernel looks the key up, so cost does not depend on the
//! number of pods), and dumps of one set or one chain's rules for CHECK, GC and `status`.

pub mod encode;

use crate::error::{Error, Result};
use crate::netlink::{BatchError, Msg, MsgBuf, NfSocket};
use crate::plan::{OwnerKey, SharedPlan};
use encode::*;
use std::net::IpAddr;

/// A set element as read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElemRead {
    pub key: Vec<u8>,
    pub flags: u32,
    pub comment: Option<String>,
}

impl ElemRead {
    /// The key of a `NET-pods` element as the owner key it encodes.
    pub fn owner(&self) -> Option<OwnerKey> {
        let end = self
            .key
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.key.len());
        std::str::from_utf8(&self.key[..end])
            .ok()
            .and_then(OwnerKey::parse_hex)
    }
    /// The owners an address element's comment lists.
    pub fn owners(&self) -> Vec<OwnerKey> {
        crate::plan::owners_from_comment(self.comment.as_deref().unwrap_or(""))
    }
    pub fn addr(&self) -> Option<IpAddr> {
        match self.key.len() {
            4 => Some(IpAddr::from(<[u8; 4]>::try_from(&self.key[..]).ok()?)),
            16 => Some(IpAddr::from(<[u8; 16]>::try_from(&self.key[..]).ok()?)),
            _ => None,
        }
    }
}

fn parse_elems(m: &Msg) -> Vec<ElemRead> {
    let mut out = Vec::new();
    let Some(list) = m.nf_attrs().get(NFTA_SET_ELEM_LIST_ELEMENTS) else {
        return out;
    };
    for el in list.nested().filter(|a| a.ty == NFTA_LIST_ELEM) {
        let attrs = el.nested();
        let key = attrs
            .get(NFTA_SET_ELEM_KEY)
            .and_then(|k| k.nested().get(NFTA_DATA_VALUE))
            .map(|v| v.payload.to_vec())
            .unwrap_or_default();
        let flags = attrs
            .get(NFTA_SET_ELEM_FLAGS)
            .and_then(|f| f.u32_be())
            .unwrap_or(0);
        let comment = attrs
            .get(NFTA_SET_ELEM_USERDATA)
            .and_then(|u| comment_of_udata(u.payload).map(str::to_string));
        out.push(ElemRead {
            key,
            flags,
            comment,
        });
    }
    out
}

/// A transaction under construction.
pub struct Tx {
    buf: MsgBuf,
    /// What each message does, by sequence number, for error messages.
    what: Vec<(u32, String)>,
}

impl Tx {
    pub fn new(sock: &mut NfSocket) -> Self {
        let mut buf = sock.msgbuf();
        begin_batch(&mut buf);
        Tx {
            buf,
            what: Vec::new(),
        }
    }

    fn note(&mut self, seq: u32, what: impl Into<String>) {
        self.what.push((seq, what.into()));
    }

    /// Converges a network's shared objects to `plan`: creates what is missing, rewrites every
    /// rule and every shared set's contents. Per-pod sets are created but never flushed.
    pub fn converge_shared(&mut self, plan: &SharedPlan) {
        let s = new_table(&mut self.buf);
        self.note(s, format!("create table inet {}", crate::plan::TABLE));
        for (i, set) in plan.sets.iter().enumerate() {
            let s = new_set(&mut self.buf, &set.name, set.kind, i as u32 + 1);
            self.note(s, format!("create set {}", set.name));
        }
        let comment = plan.rule_comment();
        for c in crate::plan::ChainKind::ALL {
            let name = plan.names.chain(c);
            let s = new_chain(&mut self.buf, &name, c.chain_type(), c.hook(), c.priority());
            self.note(s, format!("create chain {name}"));
            let s = flush_chain(&mut self.buf, &name);
            self.note(s, format!("flush chain {name}"));
            for r in plan.rules_of(c) {
                let s = new_rule(&mut self.buf, &name, r, &plan.names, &comment);
                self.note(
                    s,
                    format!(
                        "add rule {name} {}",
                        crate::plan::render_rule(r, &plan.names)
                    ),
                );
            }
        }
        for set in &plan.sets {
            let Some(elems) = &set.elements else { continue };
            let s = flush_set(&mut self.buf, &set.name);
            self.note(s, format!("flush set {}", set.name));
            let data: Vec<ElemData> = elems
                .iter()
                .flat_map(|e| elem_data(e, set.kind.is_interval()))
                .collect();
            if !data.is_empty() {
                for s in set_elems(
                    &mut self.buf,
                    NFT_MSG_NEWSETELEM,
                    NLM_F_CREATE_,
                    &set.name,
                    &data,
                ) {
                    self.note(s, format!("fill set {}", set.name));
                }
            }
        }
    }

    /// Makes sure `key` is in `set`, carrying `comment` (replacing any earlier comment).
    pub fn ensure_elem(&mut self, set: &str, key: Vec<u8>, comment: String, what: &str) {
        let bare = [ElemData {
            key: key.clone(),
            flags: 0,
            comment: None,
        }];
        for s in set_elems(&mut self.buf, NFT_MSG_NEWSETELEM, NLM_F_CREATE_, set, &bare) {
            self.note(s, format!("add {what} to {set}"));
        }
        for s in set_elems(&mut self.buf, NFT_MSG_DELSETELEM, 0, set, &bare) {
            self.note(s, format!("replace {what} in {set}"));
        }
        let full = [ElemData {
            key,
            flags: 0,
            comment: Some(comment),
        }];
        for s in set_elems(&mut self.buf, NFT_MSG_NEWSETELEM, NLM_F_CREATE_, set, &full) {
            self.note(s, format!("add {what} to {set}"));
        }
    }

    /// Deletes an element known to exist (read under the lock in this invocation).
    pub fn delete_elem(&mut self, set: &str, key: Vec<u8>, what: &str) {
        let bare = [ElemData {
            key,
            flags: 0,
            comment: None,
        }];
        for s in set_elems(&mut self.buf, NFT_MSG_DELSETELEM, 0, set, &bare) {
            self.note(s, format!("remove {what} from {set}"));
        }
    }

    /// Sets the owner list of an address element: deletes it when no owner is left.
    pub fn set_owners(
        &mut self,
        set: &str,
        ip: &IpAddr,
        existing: bool,
        owners: &[crate::plan::OwnerKey],
    ) {
        if owners.is_empty() {
            if existing {
                self.delete_elem(set, ip_bytes(ip), &ip.to_string());
            }
        } else {
            self.ensure_elem(
                set,
                ip_bytes(ip),
                crate::plan::owners_comment(owners),
                &ip.to_string(),
            );
        }
    }

    /// Rewrites an interval set to exactly `ranges` (sorted, merged, of one family).
    pub fn rewrite_intervals(
        &mut self,
        set: &str,
        f: crate::plan::Family,
        ranges: &[(u128, u128)],
    ) {
        let s = flush_set(&mut self.buf, set);
        self.note(s, format!("flush set {set}"));
        let data: Vec<ElemData> = ranges
            .iter()
            .flat_map(|&(a, b)| elem_data(&crate::plan::Elem::Range(f, a, b), true))
            .collect();
        if !data.is_empty() {
            for s in set_elems(&mut self.buf, NFT_MSG_NEWSETELEM, NLM_F_CREATE_, set, &data) {
                self.note(s, format!("fill set {set}"));
            }
        }
    }

    pub fn delete_table(&mut self) {
        let s = del_table(&mut self.buf);
        self.note(s, format!("delete table inet {}", crate::plan::TABLE));
    }

    pub fn is_empty(&self) -> bool {
        self.what.is_empty()
    }

    /// Number of messages in the transaction.
    pub fn len(&self) -> usize {
        self.what.len()
    }

    /// Sends the batch and reads its outcome (see `netlink`): the last message asks for the
    /// one ACK that proves the commit, and every failing message is reported anyway.
    ///
    /// The batch is resent only when the kernel rejected it with a "try again" errno, which
    /// means nothing of it was applied. When its outcome is unknown (replies lost, no reply in
    /// time) it is never resent: the verb fails with code 11 and the runtime's retry starts
    /// again from the kernel's state.
    pub fn commit(mut self, sock: &mut NfSocket) -> Result<()> {
        if self.what.is_empty() {
            return Ok(());
        }
        self.buf.ack_last();
        end_batch(&mut self.buf);
        let what = |seq: u32| -> String {
            self.what
                .iter()
                .find(|(s, _)| *s == seq)
                .map(|(_, w)| w.clone())
                .unwrap_or_else(|| "nftables transaction".into())
        };
        let mut attempt = 0;
        loop {
            match sock.transact_batch(&self.buf, &what) {
                Ok(()) => return Ok(()),
                Err(BatchError::Rejected(e))
                    if e.is_transient() && attempt < crate::netlink::TRANSIENT_RETRIES =>
                {
                    attempt += 1;
                    crate::netlink::backoff(attempt);
                }
                Err(BatchError::Rejected(e)) | Err(BatchError::Unknown(e)) => return Err(e),
            }
        }
    }
}

/// NEWSETELEM without NLM_F_EXCL: adding an element that exists is not an error.
const NLM_F_CREATE_: u16 = crate::netlink::NLM_F_CREATE;

/// Reads one element: `Ok(None)` when it, its set or the table does not exist.
pub fn get_element(sock: &mut NfSocket, set: &str, key: &[u8]) -> Result<Option<ElemRead>> {
    let r = sock.request_retry(
        &|b| {
            get_elem(b, set, key);
        },
        &format!("read element of set {set}"),
    );
    match r {
        Ok(msgs) => Ok(msgs.iter().flat_map(parse_elems).next()),
        Err(e) if e.errno() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The ranges of an interval set, from its start and end elements.
pub fn ranges_of(elems: &[ElemRead]) -> Vec<(u128, u128)> {
    let mut keyed: Vec<(u128, bool)> = elems
        .iter()
        .filter_map(|e| {
            let v = match e.key.len() {
                4 => u32::from_be_bytes(e.key[..].try_into().ok()?) as u128,
                16 => u128::from_be_bytes(e.key[..].try_into().ok()?),
                _ => return None,
            };
            Some((v, e.flags & NFT_SET_ELEM_INTERVAL_END != 0))
        })
        .collect();
    let max = match elems.first().map(|e| e.key.len()) {
        Some(4) => u32::MAX as u128,
        _ => u128::MAX,
    };
    keyed.sort();
    let mut out = Vec::new();
    let mut start: Option<u128> = None;
    for (v, is_end) in keyed {
        match (is_end, start) {
            (false, None) => start = Some(v),
            (false, Some(_)) => {}
            (true, Some(s)) if v > s => {
                out.push((s, v - 1));
                start = None;
            }
            (true, _) => start = None,
        }
    }
    if let Some(s) = start {
        out.push((s, max));
    }
    out
}

/// Reads every element of a set: empty when the set or the table does not exist.
pub fn dump_set(sock: &mut NfSocket, set: &str) -> Result<Vec<ElemRead>> {
    match sock.request_retry(
        &|b| {
            dump_elems(b, set);
        },
        &format!("list set {set}"),
    ) {
        Ok(msgs) => Ok(msgs.iter().flat_map(parse_elems).collect()),
        Err(e) if e.errno() == Some(libc::ENOENT) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The comments of every rule of natguard's table, by chain, in one dump; empty when the table
/// does not exist.
pub fn rule_comments_by_chain(
    sock: &mut NfSocket,
) -> Result<std::collections::HashMap<String, Vec<String>>> {
    let mut out: std::collections::HashMap<String, Vec<String>> = Default::default();
    let msgs = match sock.request_retry(
        &|b| {
            dump_rules(b, None);
        },
        "list rules",
    ) {
        Ok(m) => m,
        Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(out),
        Err(e) => return Err(e),
    };
    for m in &msgs {
        let a = m.nf_attrs();
        if a.get(NFTA_RULE_TABLE).map(|t| t.str()) != Some(crate::plan::TABLE) {
            continue;
        }
        let Some(chain) = a.get(NFTA_RULE_CHAIN) else {
            continue;
        };
        let comment = a
            .get(NFTA_RULE_USERDATA)
            .and_then(|u| comment_of_udata(u.payload).map(str::to_string))
            .unwrap_or_default();
        out.entry(chain.str().to_string())
            .or_default()
            .push(comment);
    }
    Ok(out)
}

/// Names of natguard's chains; empty when the table does not exist.
pub fn chain_names(sock: &mut NfSocket) -> Result<Vec<String>> {
    match sock.request_retry(
        &|b| {
            dump_chains(b);
        },
        "list chains",
    ) {
        Ok(msgs) => Ok(msgs
            .iter()
            .filter(|m| {
                m.nf_attrs()
                    .get(NFTA_CHAIN_TABLE)
                    .is_some_and(|t| t.str() == crate::plan::TABLE)
            })
            .filter_map(|m| {
                m.nf_attrs()
                    .get(NFTA_CHAIN_NAME)
                    .map(|n| n.str().to_string())
            })
            .collect()),
        Err(e) if e.errno() == Some(libc::ENOENT) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Names of natguard's sets; empty when the table does not exist.
pub fn set_names(sock: &mut NfSocket) -> Result<Vec<String>> {
    match sock.request_retry(
        &|b| {
            dump_sets(b);
        },
        "list sets",
    ) {
        Ok(msgs) => Ok(msgs
            .iter()
            .filter(|m| {
                m.nf_attrs()
                    .get(NFTA_SET_TABLE)
                    .is_some_and(|t| t.str() == crate::plan::TABLE)
            })
            .filter_map(|m| m.nf_attrs().get(NFTA_SET_NAME).map(|n| n.str().to_string()))
            .collect()),
        Err(e) if e.errno() == Some(libc::ENOENT) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Whether nf_tables answers at all (STATUS): a GETGEN round trip.
pub fn probe(sock: &mut NfSocket) -> Result<()> {
    sock.request_retry(
        &|b| {
            get_gen(b);
        },
        "read the nf_tables generation",
    )
    .map(|_| ())
}

/// Whether natguard's table exists.
pub fn table_exists(sock: &mut NfSocket) -> Result<bool> {
    Ok(table_flags(sock)?.is_some())
}

/// natguard's table flags (`None`: no table). A dormant table (flag 0x1) enforces nothing.
pub fn table_flags(sock: &mut NfSocket) -> Result<Option<u32>> {
    match sock.request_retry(
        &|b| {
            get_table(b);
        },
        "read table",
    ) {
        Ok(msgs) => Ok(Some(
            msgs.iter()
                .find_map(|m| m.nf_attrs().get(NFTA_TABLE_FLAGS).and_then(|f| f.u32_be()))
                .unwrap_or(0),
        )),
        Err(e) if e.errno() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Deletes natguard's whole table (uninstall). A missing table is not an error.
pub fn delete_all() -> Result<()> {
    let mut sock = NfSocket::open()?;
    if !table_exists(&mut sock)? {
        return Ok(());
    }
    let mut tx = Tx::new(&mut sock);
    tx.delete_table();
    match tx.commit(&mut sock) {
        Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

/// Errors that mean "nf_tables is not there at all", so there is nothing of natguard's to
/// remove either.
pub fn is_unavailable(e: &Error) -> bool {
    matches!(
        e.errno(),
        Some(libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT | libc::EOPNOTSUPP)
    )
}
