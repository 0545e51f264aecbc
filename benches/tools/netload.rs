//! netload: the load generators of the datapath cell (benches/datapath.py), std only.
//!
//!   netload udp-recv PORT SECS        counts 64-byte datagrams on PORT for SECS seconds from the
//!                                      first one received (after a 0.2 s settle) and prints
//!                                      `<packets per second>`; 0 if nothing arrived in 5 s
//!   netload udp-send ADDR PORT SECS   sends 64-byte datagrams to ADDR:PORT as fast as one
//!                                      socket can, for SECS seconds
//!   netload tcp-echo PORT             echoes every byte it reads, one thread per connection,
//!                                      until killed
//!   netload tcp-rr ADDR PORT SECS     one connection (TCP_NODELAY), 1-byte request, 1-byte
//!                                      response, back to back for SECS seconds after 50 warm-up
//!                                      rounds; prints `<p50 us> <p90 us> <rounds>`
//!
//! Why not iperf3 or netperf: a compiled sender with one `send` per datagram keeps the sender's
//! own cost small and fixed, so what changes between the alternatives is the forwarding path.
//! Not a cargo target: scripts/bench.sh builds it with plain `rustc`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

const PAYLOAD: usize = 64;

fn arg<T: std::str::FromStr>(v: &[String], i: usize, what: &str) -> T {
    v.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| die(&format!("missing or bad {what}")))
}

fn die(msg: &str) -> ! {
    eprintln!("netload: {msg}");
    std::process::exit(2)
}

fn udp_recv(port: u16, secs: f64) {
    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)).unwrap_or_else(|e| die(&format!("bind: {e}")));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 2048];
    if s.recv(&mut buf).is_err() {
        println!("0");
        return;
    }
    let settle = Instant::now() + Duration::from_millis(200);
    while Instant::now() < settle {
        let _ = s.recv(&mut buf);
    }
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let start = Instant::now();
    let window = Duration::from_secs_f64(secs);
    let mut n: u64 = 0;
    while start.elapsed() < window {
        if s.recv(&mut buf).is_ok() {
            n += 1;
        }
    }
    println!("{:.0}", n as f64 / start.elapsed().as_secs_f64());
}

fn udp_send(addr: Ipv4Addr, port: u16, secs: f64) {
    let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    s.connect((addr, port)).unwrap_or_else(|e| die(&format!("connect: {e}")));
    let buf = [0x5au8; PAYLOAD];
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut i: u32 = 0;
    loop {
        // ENOBUFS and ECONNREFUSED (an ICMP error before the receiver binds) are not fatal.
        let _ = s.send(&buf);
        i = i.wrapping_add(1);
        if i % 256 == 0 && Instant::now() >= end {
            break;
        }
    }
}

fn tcp_echo(port: u16) {
    let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).unwrap_or_else(|e| die(&format!("bind: {e}")));
    for c in l.incoming() {
        let Ok(mut c) = c else { continue };
        std::thread::spawn(move || {
            let _ = c.set_nodelay(true);
            let mut b = [0u8; 64];
            while let Ok(n) = c.read(&mut b) {
                if n == 0 || c.write_all(&b[..n]).is_err() {
                    break;
                }
            }
        });
    }
}

fn tcp_rr(addr: Ipv4Addr, port: u16, secs: f64) {
    let sa = SocketAddr::from((addr, port));
    let mut c = TcpStream::connect_timeout(&sa, Duration::from_secs(5)).unwrap_or_else(|e| die(&format!("connect: {e}")));
    c.set_nodelay(true).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    let mut round = |c: &mut TcpStream| {
        c.write_all(&[1]).unwrap_or_else(|e| die(&format!("write: {e}")));
        c.read_exact(&mut b).unwrap_or_else(|e| die(&format!("read: {e}")));
    };
    for _ in 0..50 {
        round(&mut c);
    }
    let mut lat = Vec::with_capacity(1 << 16);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        let t = Instant::now();
        round(&mut c);
        lat.push(t.elapsed().as_nanos() as u64);
    }
    lat.sort_unstable();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1e3;
    println!("{:.1} {:.1} {}", q(0.5), q(0.9), lat.len());
}

fn main() {
    let v: Vec<String> = std::env::args().collect();
    match v.get(1).map(String::as_str) {
        Some("udp-recv") => udp_recv(arg(&v, 2, "port"), arg(&v, 3, "seconds")),
        Some("udp-send") => udp_send(arg(&v, 2, "address"), arg(&v, 3, "port"), arg(&v, 4, "seconds")),
        Some("tcp-echo") => tcp_echo(arg(&v, 2, "port")),
        Some("tcp-rr") => tcp_rr(arg(&v, 2, "address"), arg(&v, 3, "port"), arg(&v, 4, "seconds")),
        _ => die("usage: netload udp-recv|udp-send|tcp-echo|tcp-rr ..."),
    }
}
