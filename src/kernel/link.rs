//! Interface facts from rtnetlink (`RTM_GETLINK`): whether an interface is a bridge, and the
//! bridge an interface is a port of. Asked over netlink rather than read from /sys, because
//! /sys shows the namespace it was mounted in, not necessarily the caller's.

use super::netlink::{parse_msgs, Attrs, NLMSG_ERROR, NLMSG_HDRLEN, NLM_F_REQUEST};
use crate::error::{Error, Result};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::time::Duration;

const RTM_GETLINK: u16 = 18;
const RTM_NEWLINK: u16 = 16;
const IFINFOMSG_LEN: usize = 16;
const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
/// A link lookup answers at once; this only bounds a kernel that does not.
const REPLY_DEADLINE: Duration = Duration::from_secs(2);

/// What the kernel says about one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// `IFLA_INFO_KIND` is `bridge`.
    pub is_bridge: bool,
    /// The name of the interface this one is enslaved to (a bridge port's bridge).
    pub master: Option<String>,
}

/// Looks `name` up in the calling thread's network namespace; `None` when there is no such
/// interface.
pub fn link(name: &str) -> Result<Option<Link>> {
    let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| Error::io("open rtnetlink socket", e))?;
    sock.bind_auto()
        .map_err(|e| Error::io("bind rtnetlink socket", e))?;
    set_recv_timeout(&sock, REPLY_DEADLINE);
    let mut req = Vec::with_capacity(64);
    let attr_len = 4 + name.len() + 1;
    let total = NLMSG_HDRLEN + IFINFOMSG_LEN + ((attr_len + 3) & !3);
    req.extend_from_slice(&(total as u32).to_ne_bytes());
    req.extend_from_slice(&RTM_GETLINK.to_ne_bytes());
    req.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // seq
    req.extend_from_slice(&0u32.to_ne_bytes()); // port id
    req.extend_from_slice(&[0u8; IFINFOMSG_LEN]); // AF_UNSPEC, any index
    req.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    req.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
    req.extend_from_slice(name.as_bytes());
    req.push(0);
    req.resize(total, 0);
    sock.send_to(&req, &SocketAddr::new(0, 0), 0)
        .map_err(|e| Error::io("send RTM_GETLINK", e))?;
    let mut buf = vec![0u8; 1 << 16];
    let n = sock
        .recv(&mut &mut buf[..], 0)
        .map_err(|e| Error::io(format!("receive RTM_GETLINK reply for {name}"), e))?;
    for m in parse_msgs(&buf[..n]) {
        if m.msg_type == NLMSG_ERROR {
            return match m.error_code() {
                Some(0) => Ok(None),
                Some(c) if -c == libc::ENODEV => Ok(None),
                Some(c) => Err(Error::netlink(format!("look up interface {name}"), -c)),
                None => Ok(None),
            };
        }
        if m.msg_type != RTM_NEWLINK {
            continue;
        }
        let attrs = Attrs::new(m.body.get(IFINFOMSG_LEN..).unwrap_or(&[]));
        let is_bridge = attrs
            .get(IFLA_LINKINFO)
            .and_then(|li| li.nested().get(IFLA_INFO_KIND))
            .is_some_and(|k| k.str() == "bridge");
        let master = attrs
            .get(IFLA_MASTER)
            .and_then(|a| a.payload.get(..4))
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .and_then(index_to_name);
        return Ok(Some(Link { is_bridge, master }));
    }
    Ok(None)
}

fn index_to_name(index: u32) -> Option<String> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: the buffer holds IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr() as *mut libc::c_char) };
    if p.is_null() {
        return None;
    }
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec()).ok()
}

fn set_recv_timeout(sock: &Socket, d: Duration) {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt on a socket we own with a timeval of the right size.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(sock),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}
