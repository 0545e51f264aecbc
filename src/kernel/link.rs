//! Interface facts from rtnetlink: whether an interface is a bridge and the bridge an interface
//! is a port of (`RTM_GETLINK`), and the interface a route to an address leaves by
//! (`RTM_GETROUTE`), for primary plugins that report no host-side interface. Asked over netlink
//! rather than read from /sys, because /sys shows the namespace it was mounted in, not
//! necessarily the caller's.

use super::netlink::{parse_msgs, Attrs, NLMSG_ERROR, NLMSG_HDRLEN, NLM_F_REQUEST};
use crate::error::{Error, Result};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::time::Duration;

const RTM_GETLINK: u16 = 18;
const RTM_NEWLINK: u16 = 16;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWROUTE: u16 = 24;
const RTMSG_LEN: usize = 12;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
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

/// Sends one rtnetlink request (`body` after the header) and returns the reply messages.
fn ask(msg_type: u16, body: &[u8], what: &str) -> Result<Vec<super::netlink::Msg>> {
    let mut sock = Socket::new(NETLINK_ROUTE).map_err(|e| Error::io("open rtnetlink socket", e))?;
    sock.bind_auto()
        .map_err(|e| Error::io("bind rtnetlink socket", e))?;
    set_recv_timeout(&sock, REPLY_DEADLINE);
    let total = NLMSG_HDRLEN + body.len();
    let mut req = Vec::with_capacity(total);
    req.extend_from_slice(&(total as u32).to_ne_bytes());
    req.extend_from_slice(&msg_type.to_ne_bytes());
    req.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // seq
    req.extend_from_slice(&0u32.to_ne_bytes()); // port id
    req.extend_from_slice(body);
    sock.send_to(&req, &SocketAddr::new(0, 0), 0)
        .map_err(|e| Error::io(format!("send {what}"), e))?;
    let mut buf = vec![0u8; 1 << 16];
    let n = sock
        .recv(&mut &mut buf[..], 0)
        .map_err(|e| Error::io(format!("receive the reply to {what}"), e))?;
    Ok(parse_msgs(&buf[..n]))
}

/// The interface a route from this namespace to `addr` leaves by; `None` without a route.
pub fn route_oif(addr: std::net::IpAddr) -> Result<Option<String>> {
    let (family, bytes, bits) = match addr {
        std::net::IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec(), 32u8),
        std::net::IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec(), 128u8),
    };
    let mut body = vec![0u8; RTMSG_LEN];
    body[0] = family;
    body[1] = bits; // rtm_dst_len
    body.extend_from_slice(&((4 + bytes.len()) as u16).to_ne_bytes());
    body.extend_from_slice(&RTA_DST.to_ne_bytes());
    body.extend_from_slice(&bytes);
    for m in ask(RTM_GETROUTE, &body, &format!("RTM_GETROUTE for {addr}"))? {
        if m.msg_type == NLMSG_ERROR {
            return match m.error_code() {
                Some(c) if c != 0 && -c != libc::ENETUNREACH && -c != libc::EHOSTUNREACH => {
                    Err(Error::netlink(format!("look up the route to {addr}"), -c))
                }
                _ => Ok(None),
            };
        }
        if m.msg_type != RTM_NEWROUTE {
            continue;
        }
        let attrs = Attrs::new(m.body.get(RTMSG_LEN..).unwrap_or(&[]));
        return Ok(attrs
            .get(RTA_OIF)
            .and_then(|a| a.payload.get(..4))
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .and_then(index_to_name));
    }
    Ok(None)
}

/// Looks `name` up in the calling thread's network namespace; `None` when there is no such
/// interface.
pub fn link(name: &str) -> Result<Option<Link>> {
    let mut body = vec![0u8; IFINFOMSG_LEN]; // AF_UNSPEC, any index
    let attr_len = 4 + name.len() + 1;
    body.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    body.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
    body.extend_from_slice(name.as_bytes());
    body.push(0);
    body.resize(IFINFOMSG_LEN + ((attr_len + 3) & !3), 0);
    for m in ask(RTM_GETLINK, &body, &format!("RTM_GETLINK for {name}"))? {
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
