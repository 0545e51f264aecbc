//! nf_tables change notifications: who changed natguard's tables, so that `install --watch` can
//! repair them within milliseconds of someone else's flush.
//!
//! A netfilter netlink socket that joins the `NFNLGRP_NFTABLES` multicast group receives one
//! message per object every committed transaction created or deleted (tables, chains, rules,
//! sets, set elements, objects, flowtables), in commit order, followed by one `NFT_MSG_NEWGEN`
//! that closes the transaction. Commits are serialised by the kernel's commit mutex, so the
//! messages of two transactions never interleave. `NEWGEN` carries the writer's pid and command
//! name (`NFTA_GEN_PROC_PID`, `NFTA_GEN_PROC_NAME`, since Linux 4.19).
//!
//! [`Tracker`] turns that stream into verdicts, message by message, without syscalls (so it is
//! unit-tested on built messages): a transaction that touched one of natguard's tables
//! (`inet natguard`, `netdev natguard`, `arp natguard`, by the table name every object message carries) and was
//! written by someone who is not natguard is [`Verdict::Foreign`]. natguard's own transactions
//! (a CNI ADD or DEL, the watcher's own repair) are recognised by the writer's command name
//! (`natguard`, which is what runtimes exec) or the id of the thread that opened the monitor
//! (the kernel reports the writing thread's id), and other components'
//! transactions on their own tables are ignored whatever they do: they cost a read, never a
//! repair. A writer that the kernel does not name (a kernel without the attributes) counts as
//! foreign: the repair it triggers is a check that writes nothing when nothing is missing, so
//! its own notifications cannot feed a loop.
//!
//! When the receive buffer overflows, the kernel drops notifications and the next read fails
//! with `ENOBUFS`: what was lost is unknown, so the verdict is [`Verdict::Lost`] and the caller
//! checks (and repairs) everything. The buffer is grown to [`RCVBUF`] to make that rare
//! (`NATGUARD_MONITOR_RCVBUF`, [`RCVBUF_ENV`], sets another size: the tests of that path).
//!
//! Limits: the command name is the kernel's `comm`, which any process can set for itself, so a
//! component that names itself `natguard` is not repaired against. The monitor sees only its
//! own network namespace, as every netlink socket does.

use super::netlink::{parse_msgs, Msg, NFNL_SUBSYS_NFTABLES};
use crate::error::{Error, Result};
use crate::plan::TABLE;
use rustix::fd::{AsFd, OwnedFd};
use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{sockopt, AddressFamily, RecvFlags, SocketFlags, SocketType};

/// The nf_tables multicast group (`enum nfnetlink_groups`).
pub const NFNLGRP_NFTABLES: u32 = 7;

/// `NFT_MSG_NEWGEN`: closes a committed transaction.
pub const NFT_MSG_NEWGEN: u16 = 15;
const NFTA_GEN_PROC_PID: u16 = 2;
const NFTA_GEN_PROC_NAME: u16 = 3;
/// Every object message names its table in attribute 1 (`NFTA_TABLE_NAME`,
/// `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, `NFTA_SET_TABLE`, `NFTA_SET_ELEM_LIST_TABLE`,
/// `NFTA_OBJ_TABLE`, `NFTA_FLOWTABLE_TABLE`).
const NFTA_ANY_TABLE: u16 = 1;
/// The families of natguard's tables (`NFPROTO_INET`, `NFPROTO_NETDEV`, `NFPROTO_ARP`).
const OWN_TABLE_FAMILIES: [u8; 3] = [1, 5, 3];

/// The command name natguard runs under (the kernel's `comm` of `/opt/cni/bin/natguard`).
pub const OWN_NAME: &str = "natguard";

/// The receive buffer asked for: room for the notifications of a flush of a large ruleset.
pub const RCVBUF: usize = 8 << 20;
/// Overrides [`RCVBUF`] (bytes), so tests can make the buffer overflow.
pub const RCVBUF_ENV: &str = "NATGUARD_MONITOR_RCVBUF";

/// What a read of the notifications concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing of natguard's was changed by anyone else.
    Quiet,
    /// Someone else changed natguard's tables: who (command name and pid), and how many of
    /// their messages touched them.
    Foreign { writer: String, objects: usize },
    /// Notifications were dropped (receive buffer overflow): anything may have happened.
    Lost,
}

impl Verdict {
    /// The verdict that demands more of two: Lost over Foreign over Quiet.
    fn max(self, other: Verdict) -> Verdict {
        match (&self, &other) {
            (Verdict::Lost, _) | (_, Verdict::Quiet) => self,
            (_, Verdict::Lost) | (Verdict::Quiet, _) => other,
            _ => self,
        }
    }

    pub fn needs_repair(&self) -> bool {
        *self != Verdict::Quiet
    }
}

/// Follows the notification stream transaction by transaction.
#[derive(Debug)]
pub struct Tracker {
    own_pid: u32,
    /// Messages of the transaction under way that touched natguard's tables.
    touched: usize,
    /// Transactions seen, foreign ones among them (for the watcher's log).
    pub transactions: u64,
    pub foreign: u64,
}

impl Tracker {
    pub fn new(own_pid: u32) -> Self {
        Tracker {
            own_pid,
            touched: 0,
            transactions: 0,
            foreign: 0,
        }
    }

    /// Takes one message; returns a verdict when it closes a transaction.
    pub fn feed(&mut self, m: &Msg) -> Option<Verdict> {
        if m.msg_type >> 8 != NFNL_SUBSYS_NFTABLES as u16 {
            return None;
        }
        let ty = m.msg_type & 0xff;
        if ty != NFT_MSG_NEWGEN {
            if touches_own_table(m) {
                self.touched += 1;
            }
            return None;
        }
        self.transactions += 1;
        let touched = std::mem::take(&mut self.touched);
        if touched == 0 {
            return Some(Verdict::Quiet);
        }
        let attrs = m.nf_attrs();
        let pid = attrs.get(NFTA_GEN_PROC_PID).and_then(|a| a.u32_be());
        let name = attrs.get(NFTA_GEN_PROC_NAME).map(|a| a.str());
        if pid == Some(self.own_pid) || name == Some(OWN_NAME) {
            return Some(Verdict::Quiet);
        }
        self.foreign += 1;
        let writer = match (name, pid) {
            (Some(n), Some(p)) => format!("{n} (pid {p})"),
            (None, Some(p)) => format!("pid {p}"),
            (Some(n), None) => n.to_string(),
            (None, None) => "an unnamed writer".to_string(),
        };
        Some(Verdict::Foreign {
            writer,
            objects: touched,
        })
    }

    /// Notifications were dropped: the transaction under way is unknown.
    pub fn lost(&mut self) -> Verdict {
        self.touched = 0;
        Verdict::Lost
    }
}

/// Whether an object message is about one of natguard's tables.
fn touches_own_table(m: &Msg) -> bool {
    OWN_TABLE_FAMILIES.contains(&m.nf_family())
        && m.nf_attrs().get(NFTA_ANY_TABLE).map(|a| a.str()) == Some(TABLE)
}

/// A socket subscribed to the nf_tables notifications of the calling thread's namespace.
pub struct Monitor {
    sock: OwnedFd,
    buf: Vec<u8>,
    pub tracker: Tracker,
}

impl Monitor {
    /// A monitor with [`RCVBUF`], or with `rcvbuf` bytes (tests of the overflow path).
    pub fn open(rcvbuf: Option<usize>) -> Result<Self> {
        let sock = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::RAW,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            Some(rustix::net::netlink::NETFILTER),
        )
        .map_err(|e| Error::io("open netfilter netlink socket", e.into()))?;
        // A group is bit (group - 1) of the subscription given at bind time.
        rustix::net::bind(
            &sock,
            &SocketAddrNetlink::new(0, 1 << (NFNLGRP_NFTABLES - 1)),
        )
        .map_err(|e| Error::io("subscribe to nf_tables notifications", e.into()))?;
        set_rcvbuf(&sock, rcvbuf);
        Ok(Monitor {
            sock,
            buf: vec![0u8; 1 << 16],
            // The kernel names a writer by its thread id: the thread that opens the monitor
            // is the one whose own repairs it must recognise.
            tracker: Tracker::new(rustix::thread::gettid().as_raw_pid() as u32),
        })
    }

    /// The descriptor to poll for reading.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Reads everything queued now (never blocks) and returns the strongest verdict. An
    /// overflow is [`Verdict::Lost`]; reading goes on after it, so the queue is drained.
    pub fn drain(&mut self) -> Verdict {
        let mut out = Verdict::Quiet;
        loop {
            let n = match rustix::net::recv(&self.sock, &mut self.buf[..], RecvFlags::DONTWAIT) {
                Ok((n, _)) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::NOBUFS) => {
                    out = out.max(self.tracker.lost());
                    continue;
                }
                // EAGAIN: nothing more queued. Anything else is reported as a loss, so the
                // caller checks everything rather than trusting a stream it could not read.
                Err(rustix::io::Errno::AGAIN) => return out,
                Err(_) => return out.max(self.tracker.lost()),
            };
            if n == 0 {
                return out;
            }
            for m in parse_msgs(&self.buf[..n.min(self.buf.len())]) {
                if let Some(v) = self.tracker.feed(&m) {
                    out = out.max(v);
                }
            }
        }
    }
}

/// [`RCVBUF`] (forced past `rmem_max`, which needs the `CAP_NET_ADMIN` the watcher has), or
/// exactly `want` bytes.
fn set_rcvbuf(sock: &impl AsFd, want: Option<usize>) {
    let bytes = want.unwrap_or(RCVBUF);
    if want.is_none() && sockopt::set_socket_recv_buffer_size_force(sock, bytes).is_ok() {
        return;
    }
    let _ = sockopt::set_socket_recv_buffer_size(sock, bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::netlink::MsgBuf;

    const DELRULE: u16 = 8;
    const DELTABLE: u16 = 2;
    const DELCHAIN: u16 = 5;
    const NEWSETELEM: u16 = 12;

    fn nft(ty: u16) -> u16 {
        (NFNL_SUBSYS_NFTABLES as u16) << 8 | ty
    }

    fn object(ty: u16, family: u8, table: &str) -> Msg {
        let mut b = MsgBuf::new(1);
        b.begin(nft(ty), 0, family, 0);
        b.attr_str(NFTA_ANY_TABLE, table);
        b.end();
        parse_msgs(b.as_bytes()).remove(0)
    }

    fn newgen(pid: Option<u32>, name: Option<&str>) -> Msg {
        let mut b = MsgBuf::new(1);
        b.begin(nft(NFT_MSG_NEWGEN), 0, 0, 0);
        b.attr_u32_be(1, 42);
        if let Some(p) = pid {
            b.attr_u32_be(NFTA_GEN_PROC_PID, p);
        }
        if let Some(n) = name {
            b.attr_str(NFTA_GEN_PROC_NAME, n);
        }
        b.end();
        parse_msgs(b.as_bytes()).remove(0)
    }

    fn run(t: &mut Tracker, msgs: &[Msg]) -> Vec<Verdict> {
        msgs.iter().filter_map(|m| t.feed(m)).collect()
    }

    #[test]
    fn a_foreign_flush_of_natguards_table_is_foreign() {
        let mut t = Tracker::new(100);
        let v = run(
            &mut t,
            &[
                object(DELRULE, 1, "natguard"),
                object(DELTABLE, 1, "natguard"),
                object(DELCHAIN, 5, "natguard"),
                object(DELTABLE, 3, "natguard"),
                // An earlier version's bridge table is no longer natguard's to repair.
                object(DELTABLE, 7, "natguard"),
                newgen(Some(555), Some("nft")),
            ],
        );
        assert_eq!(
            v,
            vec![Verdict::Foreign {
                writer: "nft (pid 555)".into(),
                objects: 4
            }]
        );
        assert_eq!((t.transactions, t.foreign), (1, 1));
    }

    #[test]
    fn natguards_own_transactions_are_quiet() {
        let mut t = Tracker::new(100);
        // Another natguard process (a CNI DEL), then the watcher itself under another name.
        let v = run(
            &mut t,
            &[
                object(NEWSETELEM, 1, "natguard"),
                newgen(Some(777), Some("natguard")),
                object(DELRULE, 1, "natguard"),
                newgen(Some(100), Some("renamed")),
            ],
        );
        assert_eq!(v, vec![Verdict::Quiet, Verdict::Quiet]);
        assert_eq!(t.foreign, 0);
    }

    #[test]
    fn other_tables_and_families_are_ignored() {
        let mut t = Tracker::new(100);
        let v = run(
            &mut t,
            &[
                object(DELTABLE, 1, "calico"),
                object(DELRULE, 2, "natguard"), // `ip natguard` is not natguard's
                object(DELRULE, 1, "natguard2"),
                newgen(Some(9), Some("calico-node")),
            ],
        );
        assert_eq!(v, vec![Verdict::Quiet]);
        // The count starts again at each transaction.
        let v = run(
            &mut t,
            &[
                object(DELRULE, 5, "natguard"),
                newgen(Some(9), Some("nft")),
                newgen(Some(9), Some("nft")),
            ],
        );
        assert_eq!(
            v,
            vec![
                Verdict::Foreign {
                    writer: "nft (pid 9)".into(),
                    objects: 1
                },
                Verdict::Quiet
            ]
        );
    }

    #[test]
    fn an_unnamed_writer_is_foreign_and_a_loss_forgets_the_transaction() {
        let mut t = Tracker::new(100);
        let v = run(
            &mut t,
            &[object(DELTABLE, 1, "natguard"), newgen(None, None)],
        );
        assert_eq!(
            v,
            vec![Verdict::Foreign {
                writer: "an unnamed writer".into(),
                objects: 1
            }]
        );
        t.feed(&object(DELTABLE, 1, "natguard"));
        assert_eq!(t.lost(), Verdict::Lost);
        assert_eq!(t.feed(&newgen(Some(1), Some("nft"))), Some(Verdict::Quiet));
    }

    #[test]
    fn non_nftables_messages_are_ignored() {
        let mut t = Tracker::new(1);
        let mut b = MsgBuf::new(1);
        b.begin(1 << 8 | 2, 0, 1, 0); // ctnetlink
        b.attr_str(1, "natguard");
        b.end();
        assert_eq!(t.feed(&parse_msgs(b.as_bytes())[0]), None);
        assert_eq!(t.touched, 0);
    }

    #[test]
    fn verdicts_combine_to_the_strongest() {
        let f = || Verdict::Foreign {
            writer: "x".into(),
            objects: 1,
        };
        assert_eq!(Verdict::Quiet.max(f()), f());
        assert_eq!(f().max(Verdict::Quiet), f());
        assert_eq!(f().max(Verdict::Lost), Verdict::Lost);
        assert_eq!(Verdict::Lost.max(f()), Verdict::Lost);
        assert!(!Verdict::Quiet.needs_repair() && Verdict::Lost.needs_repair());
    }
}
