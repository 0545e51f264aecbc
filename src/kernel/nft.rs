//! natguard's nf_tables state: one batch per invocation, and the reads CHECK, DEL and GC need.
//!
//! Writing: [`Tx`] collects messages between BATCH_BEGIN and BATCH_END; `commit` sends them in
//! one `sendmsg` and reads the outcome from the kernel's replies (one ACK on the last message,
//! an error for any message that fails; see `netlink`), so a transaction lands whole or not at
//! all, and its outcome is never guessed. A set's elements may span several messages of the
//! batch (`lower::set_elems`). Element changes are built from what the store read under the
//! node lock in this invocation: an element read as absent is added exclusively
//! ([`Tx::add_elem`], `NLM_F_EXCL`), one read as present is deleted ([`Tx::delete_elem`]) or
//! replaced ([`Tx::ensure_elem`]: add, delete, add, which holds whatever the state). The add
//! and the delete are one message each and leave the kernel nothing to free after a grace
//! period; they would fail with EEXIST or ENOENT if the read were wrong, but the batch carries
//! the generation of that read (below), so whenever anyone committed since, the kernel refuses
//! the batch with `ERESTART` first and the verb reads again.
//!
//! Generations: [`generation`] reads the namespace's nf_tables generation (`NFT_MSG_GETGEN`);
//! a read-modify-write reads it before its first read and [`Tx::new`] sends it in the batch's
//! BATCH_BEGIN (`NFNL_BATCH_GENID`). If any writer committed in between, the kernel refuses
//! the whole batch with `ERESTART` ([`is_stale`]) and nothing of it is applied.
//!
//! Reading: single-element GETs (the kernel looks the key up, so cost does not depend on the
//! number of pods), and dumps of one set or one table's rules for CHECK, GC and `status`.

use super::lower::*;
use super::netlink::{
    BatchError, Msg, MsgBuf, NfSocket, NFNL_BATCH_GENID, NFNL_MSG_BATCH_BEGIN, NFNL_SUBSYS_NFTABLES,
};
use crate::error::{Error, Result};
use crate::plan::{SharedPlan, TableFamily};

/// A set element as read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElemRead {
    pub key: Vec<u8>,
    pub flags: u32,
    pub comment: Option<String>,
    /// The element's counter, when its set gives elements one.
    pub packets: Option<u64>,
}

/// A rule as read back: its comment and, when it has one, its counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRead {
    pub comment: String,
    pub packets: Option<u64>,
}

/// The packet count of the first `counter` expression in a list of expressions.
fn counter_in(exprs: super::netlink::Attrs<'_>) -> Option<u64> {
    exprs
        .filter(|e| e.ty == NFTA_LIST_ELEM)
        .find_map(|e| counter_of(e.nested()))
}

/// The packet count of one expression, when it is a `counter`.
fn counter_of(expr: super::netlink::Attrs<'_>) -> Option<u64> {
    (expr.get(NFTA_EXPR_NAME)?.str() == "counter")
        .then(|| expr.get(NFTA_EXPR_DATA))
        .flatten()?
        .nested()
        .get(NFTA_COUNTER_PACKETS)?
        .u64_be()
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
        // One expression comes as NFTA_SET_ELEM_EXPR, several as a list.
        let packets = attrs
            .get(NFTA_SET_ELEM_EXPRESSIONS)
            .and_then(|l| counter_in(l.nested()))
            .or_else(|| counter_of(attrs.get(NFTA_SET_ELEM_EXPR)?.nested()));
        out.push(ElemRead {
            key,
            flags,
            comment,
            packets,
        });
    }
    out
}

/// A transaction under construction.
pub struct Tx {
    buf: MsgBuf,
    /// What each message does, by sequence number, for error messages.
    what: Vec<(u32, String)>,
    /// The NEWSET messages that declare element counters, by sequence number, with the set.
    counted_sets: Vec<(u32, String)>,
}

/// A transaction the kernel did not commit.
#[derive(Debug)]
pub struct Refused {
    pub error: Error,
    /// The set, when the kernel's error answered a NEWSET that declares element counters.
    pub counted_set: Option<String>,
}

impl Refused {
    /// Whether this is the kernel's answer to a set it cannot give element counters: a
    /// NEWSET carrying `NFTA_SET_EXPR` (a counter) refused with `EOPNOTSUPP`, the errno
    /// `nf_tables_newset` returns when no set backend takes an element expression or the
    /// expression cannot live in a set (`nft_select_set_ops`, `nft_set_elem_expr_alloc`).
    /// `EINVAL`, or an error on any other message, is a bad batch and is reported as one.
    ///
    /// Kernels before 5.7 ignore `NFTA_SET_EXPR` (an attribute past their `NFTA_SET_MAX`,
    /// parsed liberally), and 5.7 to 5.10 accept it and give each element a counter that
    /// lookups never update (`nft_set_elem_update_expr` came with 5.11): neither answers
    /// with an error, so neither reaches this fallback.
    pub fn means_no_set_counters(&self) -> bool {
        self.counted_set.is_some() && self.error.errno() == Some(libc::EOPNOTSUPP)
    }
}

impl Tx {
    /// A transaction on `sock`; with `generation`, the kernel commits it only if nf_tables is
    /// still at that generation (else `ERESTART`).
    pub fn new(sock: &mut NfSocket, generation: Option<u32>) -> Self {
        Self::on(sock.msgbuf(), generation)
    }

    fn on(mut buf: MsgBuf, generation: Option<u32>) -> Self {
        match generation {
            Some(g) => {
                buf.begin(NFNL_MSG_BATCH_BEGIN, 0, 0, NFNL_SUBSYS_NFTABLES as u16);
                buf.attr_u32_be(NFNL_BATCH_GENID, g);
                buf.end();
            }
            None => begin_batch(&mut buf),
        }
        Tx {
            buf,
            what: Vec::new(),
            counted_sets: Vec::new(),
        }
    }

    /// The batch as it would be sent (for golden tests of the encoding).
    #[cfg(test)]
    pub(crate) fn encoded(mut self) -> Vec<u8> {
        self.buf.ack_last();
        end_batch(&mut self.buf);
        self.buf.as_bytes().to_vec()
    }

    #[cfg(test)]
    pub(crate) fn for_test() -> Self {
        Self::on(MsgBuf::new(1), None)
    }

    #[cfg(test)]
    pub(crate) fn for_test_at(generation: u32) -> Self {
        Self::on(MsgBuf::new(1), Some(generation))
    }

    fn note(&mut self, seq: u32, what: impl Into<String>) {
        self.what.push((seq, what.into()));
    }

    /// What message `seq` does, as noted; `whole` for a message nothing was noted of.
    fn what_of(&self, seq: u32, whole: &str) -> String {
        self.what
            .iter()
            .find(|(s, _)| *s == seq)
            .map_or_else(|| whole.to_string(), |(_, w)| w.clone())
    }

    /// Converges a network's shared objects to `plan`: creates what is missing, rewrites every
    /// rule and every shared set's contents. Per-pod sets are created but never flushed.
    pub fn converge_shared(&mut self, plan: &SharedPlan, set_counters: bool) {
        for t in TableFamily::ALL {
            // Woken if someone made it dormant.
            let s = new_table(&mut self.buf, t, Some(0));
            self.note(
                s,
                format!("create table {} {}", t.nft(), crate::plan::TABLE),
            );
        }
        for (i, set) in plan.sets.iter().enumerate() {
            let t = set.kind.table();
            let s = new_set(
                &mut self.buf,
                t,
                &set.name,
                set.kind,
                i as u32 + 1,
                set_counters,
            );
            self.note(s, format!("create set {} {}", t.nft(), set.name));
            if set_counters && set.kind.is_counted() {
                self.counted_sets.push((s, set.name.clone()));
            }
        }
        for c in plan.chains() {
            let name = plan.names.chain(c);
            let t = c.table();
            let s = new_chain(&mut self.buf, t, &name, c.chain_type(), hook_of(c));
            self.note(s, format!("create chain {name}"));
            let s = flush_chain(&mut self.buf, t, &name);
            self.note(s, format!("flush chain {name}"));
            for r in plan.rules_of(c) {
                let s = new_rule(&mut self.buf, t, &name, r, &plan.names, &plan.comment_of(r));
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
            let t = set.kind.table();
            let s = flush_set(&mut self.buf, t, &set.name);
            self.note(s, format!("flush set {}", set.name));
            let data: Vec<ElemData> = elems
                .iter()
                .flat_map(|e| elem_data(e, set.kind.is_interval()))
                .collect();
            if !data.is_empty() {
                for s in set_elems(
                    &mut self.buf,
                    t,
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

    /// Makes sure `key` is in `set`, carrying `comment` (replacing any earlier comment): an
    /// add that tolerates the element (so the delete finds it), a delete, and the add with
    /// the comment.
    pub fn ensure_elem(
        &mut self,
        t: TableFamily,
        set: &str,
        key: Vec<u8>,
        comment: String,
        what: &str,
    ) {
        let add = format!("add {what} to {set}");
        self.elem(t, set, ELEM_ADD, key.clone(), None, &add);
        let replace = format!("replace {what} in {set}");
        self.elem(t, set, ELEM_DEL, key.clone(), None, &replace);
        self.elem(t, set, ELEM_ADD, key, Some(comment), &add);
    }

    /// Adds an element known to be absent (read under the lock in this invocation), carrying
    /// `comment`: one NEWSETELEM with NLM_F_EXCL. Unlike [`Tx::ensure_elem`]'s replace, which is
    /// a delete and an add, it leaves nothing for the kernel to free after an RCU grace period,
    /// and so nothing that the next release of any netfilter socket in the namespace waits for
    /// while holding the commit mutex (docs/kernel-bug-nftables-release-stall.md). Should the
    /// element exist after all, the kernel refuses the whole batch with EEXIST.
    pub fn add_elem(
        &mut self,
        t: TableFamily,
        set: &str,
        key: Vec<u8>,
        comment: String,
        what: &str,
    ) {
        let note = format!("add {what} to {set}");
        self.elem(t, set, ELEM_CREATE, key, Some(comment), &note);
    }

    /// Deletes an element known to exist (read under the lock in this invocation).
    pub fn delete_elem(&mut self, t: TableFamily, set: &str, key: Vec<u8>, what: &str) {
        let note = format!("remove {what} from {set}");
        self.elem(t, set, ELEM_DEL, key, None, &note);
    }

    /// One element message (`msg`: type and flags), noted as `note` for error messages.
    fn elem(
        &mut self,
        t: TableFamily,
        set: &str,
        (msg, flags): (u16, u16),
        key: Vec<u8>,
        comment: Option<String>,
        note: &str,
    ) {
        let e = [ElemData {
            key,
            flags: 0,
            comment,
        }];
        for s in set_elems(&mut self.buf, t, msg, flags, set, &e) {
            self.note(s, note.to_string());
        }
    }

    /// Creates or rewrites an exempt pod's veth chain in the netdev table (the table first,
    /// which a batch that converges nothing may not have created).
    pub fn veth_chain(&mut self, veth: &str) {
        let s = new_table(&mut self.buf, TableFamily::Netdev, None);
        self.note(s, format!("create table netdev {}", crate::plan::TABLE));
        let (c, f, rules) = super::lower::new_veth_chain(&mut self.buf, veth);
        self.note(
            c,
            format!(
                "create chain netdev {} {veth} (hook ingress device {veth})",
                crate::plan::TABLE
            ),
        );
        self.note(
            f,
            format!("flush chain netdev {} {veth}", crate::plan::TABLE),
        );
        for (s, r) in rules {
            self.note(
                s,
                format!(
                    "add rule netdev {} {veth} {}",
                    crate::plan::TABLE,
                    crate::plan::render_veth_rule(&r)
                ),
            );
        }
    }

    /// Deletes a chain with its rules (they go first: the kernel deletes only empty chains).
    pub fn delete_chain(&mut self, t: TableFamily, name: &str) {
        let s = flush_chain(&mut self.buf, t, name);
        self.note(
            s,
            format!("flush chain {} {} {name}", t.nft(), crate::plan::TABLE),
        );
        let s = del_chain(&mut self.buf, t, name);
        self.note(
            s,
            format!("delete chain {} {} {name}", t.nft(), crate::plan::TABLE),
        );
    }

    pub fn delete_set(&mut self, t: TableFamily, name: &str) {
        let s = del_set(&mut self.buf, t, name);
        self.note(
            s,
            format!("delete set {} {} {name}", t.nft(), crate::plan::TABLE),
        );
    }

    pub fn delete_table(&mut self, t: TableFamily) {
        let s = del_table(&mut self.buf, t);
        self.note(
            s,
            format!("delete table {} {}", t.nft(), crate::plan::TABLE),
        );
    }

    /// Sends the batch and reads its outcome; resends it only when the kernel rejected it
    /// whole with a "try again" errno other than `ERESTART` (a stale generation stays stale).
    pub fn commit(self, sock: &mut NfSocket) -> Result<()> {
        self.commit_checked(sock).map_err(|r| r.error)
    }

    /// [`Tx::commit`], saying which message the kernel's refusal answered.
    pub fn commit_checked(mut self, sock: &mut NfSocket) -> std::result::Result<(), Refused> {
        if self.what.is_empty() {
            return Ok(());
        }
        self.buf.ack_last();
        end_batch(&mut self.buf);
        let what = |seq: u32| self.what_of(seq, "nftables transaction");
        let counted_set = |seq: Option<u32>| {
            self.counted_sets
                .iter()
                .find(|(s, _)| Some(*s) == seq)
                .map(|(_, n)| n.clone())
        };
        // Only a batch the kernel rejected as a whole is sent again: one whose replies were
        // lost may have been committed, and is never resent.
        let mut attempt = 0;
        loop {
            match sock.transact_batch(&self.buf, &what) {
                Ok(()) => return Ok(()),
                Err(BatchError::Rejected(e, _))
                    if e.is_transient()
                        && !is_stale(&e)
                        && attempt < super::netlink::TRANSIENT_RETRIES =>
                {
                    attempt += 1;
                    super::netlink::backoff(attempt);
                }
                Err(BatchError::Rejected(error, seq)) => {
                    return Err(Refused {
                        error,
                        counted_set: counted_set(seq),
                    })
                }
                Err(BatchError::Unknown(error)) => {
                    return Err(Refused {
                        error,
                        counted_set: None,
                    })
                }
            }
        }
    }

    /// Sends the batch without its BATCH_END: the kernel checks every message (loading the
    /// modules it asks for), answers them, and then drops the transaction, so nothing of it is
    /// applied and no generation passes (what `nft --check` does).
    pub fn validate(mut self, sock: &mut NfSocket) -> Result<()> {
        if self.what.is_empty() {
            return Ok(());
        }
        self.buf.ack_last();
        let what = |seq: u32| self.what_of(seq, "nftables check");
        sock.transact_batch(&self.buf, &what).map_err(|e| match e {
            BatchError::Rejected(e, _) | BatchError::Unknown(e) => e,
        })
    }

    /// The sequence numbers of the NEWSETs that declare element counters (unit tests).
    #[cfg(test)]
    pub(crate) fn counted_set_seqs(&self) -> Vec<u32> {
        self.counted_sets.iter().map(|(s, _)| *s).collect()
    }
}

/// NEWSETELEM without NLM_F_EXCL: adding an element that exists is not an error.
const NLM_F_CREATE_: u16 = super::netlink::NLM_F_CREATE;
/// An element message's type and flags: an add that tolerates the element, an add that must
/// create it (the batch fails with EEXIST otherwise), a delete.
const ELEM_ADD: (u16, u16) = (NFT_MSG_NEWSETELEM, NLM_F_CREATE_);
const ELEM_CREATE: (u16, u16) = (
    NFT_MSG_NEWSETELEM,
    NLM_F_CREATE_ | super::netlink::NLM_F_EXCL,
);
const ELEM_DEL: (u16, u16) = (NFT_MSG_DELSETELEM, 0);

/// Reads one element: `Ok(None)` when it, its set or the table does not exist.
pub fn get_element(
    sock: &mut NfSocket,
    t: TableFamily,
    set: &str,
    key: &[u8],
) -> Result<Option<ElemRead>> {
    let r = sock.request_retry(
        &|b| {
            get_elem(b, t, set, key);
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
pub fn dump_set(sock: &mut NfSocket, t: TableFamily, set: &str) -> Result<Vec<ElemRead>> {
    match sock.request_retry(
        &|b| {
            dump_elems(b, t, set);
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
pub fn rules_by_chain(
    sock: &mut NfSocket,
    t: TableFamily,
    chain: Option<&str>,
) -> Result<std::collections::HashMap<String, Vec<RuleRead>>> {
    let mut out: std::collections::HashMap<String, Vec<RuleRead>> = Default::default();
    let msgs = match sock.request_retry(
        &|b| {
            dump_rules(b, t, chain);
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
        let packets = a
            .get(NFTA_RULE_EXPRESSIONS)
            .and_then(|l| counter_in(l.nested()));
        out.entry(chain.str().to_string())
            .or_default()
            .push(RuleRead { comment, packets });
    }
    Ok(out)
}

/// Names of natguard's chains; empty when the table does not exist.
pub fn chain_names(sock: &mut NfSocket, t: TableFamily) -> Result<Vec<String>> {
    match sock.request_retry(
        &|b| {
            dump_chains(b, t);
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
pub fn set_names(sock: &mut NfSocket, t: TableFamily) -> Result<Vec<String>> {
    match sock.request_retry(
        &|b| {
            dump_sets(b, t);
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

/// The namespace's nf_tables generation (`NFTA_GEN_ID` of `NFT_MSG_GETGEN`): every commit of
/// any writer moves it on.
pub fn generation(sock: &mut NfSocket) -> Result<u32> {
    let msgs = sock.request_retry(
        &|b| {
            get_gen(b);
        },
        "read the nf_tables generation",
    )?;
    generation_of(&msgs)
}

/// The generation id in a GETGEN reply.
fn generation_of(msgs: &[Msg]) -> Result<u32> {
    const NFTA_GEN_ID: u16 = 1;
    msgs.iter()
        .find_map(|m| m.nf_attrs().get(NFTA_GEN_ID)?.u32_be())
        .ok_or_else(|| {
            Error::Protocol("read the nf_tables generation: the reply has no NFTA_GEN_ID".into())
        })
}

/// Whether a commit was refused because nf_tables moved past the generation it carried:
/// another writer committed between the read it was built from and the commit.
pub fn is_stale(e: &Error) -> bool {
    e.errno() == Some(libc::ERESTART)
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

/// nf_tables' table flag for a dormant table: its base chains are not hooked, so none of its
/// rules apply.
pub const NFT_TABLE_F_DORMANT: u32 = 0x1;

/// natguard's table flags (`None`: no table). A dormant table (flag 0x1) enforces nothing.
pub fn table_flags(sock: &mut NfSocket, t: TableFamily) -> Result<Option<u32>> {
    match sock.request_retry(
        &|b| {
            get_table(b, t);
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

/// Errors that mean "nf_tables is not there at all", so there is nothing of natguard's to
/// remove either.
pub fn is_unavailable(e: &Error) -> bool {
    matches!(
        e.errno(),
        Some(libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT | libc::EOPNOTSUPP)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::parse_msgs;

    /// The BATCH_BEGIN of a transaction built from a read carries that read's generation, as
    /// the big-endian `NFNL_BATCH_GENID` attribute after the nfgenmsg; one without carries none.
    #[test]
    fn a_batch_built_from_a_read_carries_its_generation_in_batch_begin() {
        let mut tx = Tx::for_test_at(0x0102_0304);
        tx.delete_table(TableFamily::Inet);
        let msgs = parse_msgs(&tx.encoded());
        let begin = &msgs[0];
        assert_eq!(begin.msg_type, NFNL_MSG_BATCH_BEGIN);
        assert_eq!(
            begin.body[2..4],
            (NFNL_SUBSYS_NFTABLES as u16).to_be_bytes()
        );
        let genid = begin.nf_attrs().get(NFNL_BATCH_GENID).unwrap();
        assert_eq!(genid.payload, [1, 2, 3, 4]);

        let mut tx = Tx::for_test();
        tx.delete_table(TableFamily::Inet);
        let msgs = parse_msgs(&tx.encoded());
        assert_eq!(msgs[0].nf_attrs().count(), 0);
    }

    #[test]
    fn the_generation_is_read_from_a_getgen_reply() {
        let mut b = MsgBuf::new(5);
        b.begin(0x0a00 | 15, 0, 0, 0); // NFT_MSG_NEWGEN
        b.attr_u32_be(1, 77); // NFTA_GEN_ID
        b.attr_u32_be(2, 1234); // NFTA_GEN_PROC_PID
        b.end();
        assert_eq!(generation_of(&parse_msgs(b.as_bytes())).unwrap(), 77);
        let mut empty = MsgBuf::new(5);
        empty.begin(0x0a00 | 15, 0, 0, 0);
        empty.end();
        assert!(generation_of(&parse_msgs(empty.as_bytes())).is_err());
    }

    #[test]
    fn only_erestart_means_stale() {
        assert!(is_stale(&Error::netlink("commit", libc::ERESTART)));
        for errno in [libc::EBUSY, libc::EAGAIN, libc::ENOENT, libc::EINVAL] {
            assert!(!is_stale(&Error::netlink("commit", errno)), "{errno}");
        }
    }
}
