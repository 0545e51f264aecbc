//! natguard's own metadata proxy: what pods in `proxy` mode reach when they connect to their
//! cloud's metadata API. It passes what describes the instance (region, zone, instance ID and
//! type, the network) and conceals credentials, user data and signed identity documents, in
//! the cloud's own protocol (IMDSv2 tokens included). docs/proxy.md is the operator's view.
//!
//! It runs inside `install --watch` on a thread and a current-thread runtime of its own
//! ([`http`]), so nothing it does delays the watcher's loop or self-repair, and ADD, DEL and
//! CHECK never start it. Each request goes through one handler ([`handle`]):
//! 1. who asks: the connection's original destination (`SO_ORIGINAL_DST`) must be a
//!    `proxy` endpoint natguard's DNAT redirected, and the source address a live attachment's
//!    ([`pods`]); the strictest of the attachments holding it decides;
//! 2. what is asked: the request target read into its canonical form ([`canon`]), judged
//!    by the cloud's allow-list ([`rules`]) and protocol;
//! 3. the upstream is only the endpoint the pod first connected to, asked with a request the
//!    proxy builds ([`upstream`]); listings and documents are filtered on the way back. What
//!    was passed is served again for a second ([`cache`]): the same target gets the same
//!    answer for every pod the proxy serves it to.
//!
//! Counters of every result go to a record beside the watcher's readiness file
//! (`proxy.json`), which `status` and `metrics` read from another process.

mod cache;
pub mod canon;
pub mod http;
mod io;
pub mod pods;
pub mod record;
pub mod rules;
mod tokens;
mod upstream;

use http::{text, Conn, Limits, Reply};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response};
use rules::{Api, Verdict};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use record::ProxyRecord;

/// The bounds of the proxy's connections: enough for every pod of a node at once, with no
/// source able to take more than a share.
pub const LIMITS: Limits = Limits {
    max_conns: 16384,
    per_source: 128,
    header_timeout: Duration::from_secs(5),
    lifetime: Duration::from_secs(120),
    max_head: 16 * 1024,
    keep_alive: true,
};

/// What the watcher starts the proxy with.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where it listens (the proxy addresses and port the DNAT points at).
    pub listen: Vec<SocketAddr>,
    /// The metadata API it speaks; `None`: it refuses every request.
    pub api: Option<Api>,
    /// Which cloud, and how it was chosen, for the log and `status`.
    pub cloud: String,
    /// The record for `status` and `metrics`.
    pub record: PathBuf,
}

/// The results counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Served,
    Concealed,
    Refused,
    UpstreamError,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Concealed => "concealed",
            Outcome::Refused => "refused",
            Outcome::UpstreamError => "upstream_error",
        }
    }
}

struct State {
    api: Option<Api>,
    records: pods::Records,
    tokens: Mutex<tokens::Tokens>,
    node_tokens: upstream::NodeTokens,
    pool: upstream::Pool,
    cache: Mutex<cache::Cache>,
    asking: cache::InFlight,
    counts: [AtomicU64; 4],
    log: Mutex<LogBudget>,
}

/// At most [`LOG_BURST`] lines of concealed or refused requests per second; the rest are
/// counted and said in the next line.
const LOG_BURST: u32 = 20;

#[derive(Default)]
struct LogBudget {
    second: Option<Instant>,
    used: u32,
    dropped: u64,
}

impl State {
    fn count(&self, o: Outcome) {
        self.counts[o as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn note(&self, o: Outcome, who: &str, src: IpAddr, method: &Method, target: &str, why: &str) {
        self.count(o);
        let mut b = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if b.second
            .is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1))
        {
            b.second = Some(now);
            b.used = 0;
        }
        if b.used >= LOG_BURST {
            b.dropped += 1;
            return;
        }
        b.used += 1;
        let dropped = std::mem::take(&mut b.dropped);
        drop(b);
        let more = if dropped > 0 {
            format!(" ({dropped} more line(s) not logged)")
        } else {
            String::new()
        };
        let target: String = target.chars().take(200).collect();
        crate::info!(
            "metadata proxy: {} {method} {target:?} for {who} ({src}): {why}{more}",
            o.as_str()
        );
    }
}

/// Starts the proxy on a thread of its own; Err only when that thread cannot start. Each
/// address is bound on that thread; one that cannot be bound is logged.
pub fn start(opts: Options) -> std::io::Result<()> {
    raise_nofile();
    let records = pods::Records::start()?;
    let state = Arc::new(State {
        api: opts.api,
        records,
        tokens: Mutex::default(),
        node_tokens: upstream::NodeTokens::default(),
        pool: upstream::Pool::default(),
        cache: Mutex::default(),
        asking: cache::InFlight::default(),
        counts: Default::default(),
        log: Mutex::default(),
    });
    let listen = opts.listen.clone();
    let cloud = opts.cloud.clone();
    let record = opts.record.clone();
    http::spawn("metadata-proxy", move || async move {
        let mut serving = Vec::new();
        for addr in listen {
            match http::bind(addr) {
                Ok(l) => {
                    serving.push(addr);
                    let st = state.clone();
                    let handler: http::Handler =
                        Arc::new(move |req, conn| Box::pin(handle(st.clone(), req, conn)));
                    tokio::spawn(http::serve(l, LIMITS, handler, original_dst));
                }
                Err(e) => crate::warn!("metadata proxy: cannot listen on {addr}: {e}"),
            }
        }
        if serving.is_empty() {
            crate::warn!("metadata proxy: serving nowhere");
        } else {
            let at: Vec<String> = serving.iter().map(|a| a.to_string()).collect();
            crate::info!("metadata proxy: serving {cloud} on {}", at.join(", "));
        }
        // The record for `status` and `metrics`, at start and every second it changed.
        let mut last = None;
        loop {
            let counts: Vec<u64> = state
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect();
            if last.as_ref() != Some(&counts) {
                let r = ProxyRecord {
                    pid: std::process::id(),
                    serving: serving.clone(),
                    cloud: cloud.clone(),
                    served: counts[0],
                    concealed: counts[1],
                    refused: counts[2],
                    upstream_error: counts[3],
                    running: None,
                };
                // On the blocking pool: the write syncs the file and its directory, which can
                // take milliseconds, and every connection of this thread would wait for it.
                let at = record.clone();
                let _ = tokio::task::spawn_blocking(move || r.write(&at)).await;
                last = Some(counts);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// Thousands of idle connections need as many descriptors: the soft limit goes up to the
/// hard one.
fn raise_nofile() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// The destination a connection was first sent to, before natguard's DNAT
/// (`SO_ORIGINAL_DST`, `IP6T_SO_ORIGINAL_DST`); `None` without a NAT record.
pub fn original_dst(s: &tokio::net::TcpStream) -> Option<SocketAddr> {
    use std::os::fd::AsRawFd;
    const SO_ORIGINAL_DST: libc::c_int = 80;
    let fd = s.as_raw_fd();
    // SAFETY: getsockopt into a zeroed sockaddr_in6, large enough for either family, with
    // its size.
    unsafe {
        let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        let local = s.local_addr().ok()?;
        let level = if local.is_ipv4() {
            libc::SOL_IP
        } else {
            libc::SOL_IPV6
        };
        if libc::getsockopt(
            fd,
            level,
            SO_ORIGINAL_DST,
            (&mut sa as *mut libc::sockaddr_in6).cast(),
            &mut len,
        ) != 0
        {
            return None;
        }
        if local.is_ipv4() {
            let v4: libc::sockaddr_in = std::ptr::read((&sa as *const libc::sockaddr_in6).cast());
            Some(SocketAddr::new(
                IpAddr::V4(std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))),
                u16::from_be(v4.sin_port),
            ))
        } else {
            Some(SocketAddr::new(
                IpAddr::V6(std::net::Ipv6Addr::from(sa.sin6_addr.s6_addr)),
                u16::from_be(sa.sin6_port),
            ))
        }
    }
}

/// A concealed or refused answer: the status and a plain-text body naming natguard and why.
fn no(status: u16, why: &str) -> Reply {
    text(status, format!("natguard: {why}\n"))
}

/// The response headers passed on from the upstream (the rest are the proxy's own).
const PASSED_HEADERS: &[&str] = &[
    "content-type",
    "etag",
    "last-modified",
    "metadata-flavor",
    "server",
    "x-frame-options",
    "x-xss-protection",
];

async fn handle(st: Arc<State>, req: Request<Incoming>, conn: Conn) -> Reply {
    let src = conn.peer.ip();
    // The head is read here; the body only by a token request that has one (IBM's).
    let (req, body) = req.into_parts();
    let method = req.method.clone();
    let raw_target = req
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let refused = |who: &str, status: u16, why: &str| {
        st.note(Outcome::Refused, who, src, &method, &raw_target, why);
        no(status, why)
    };
    // Who asks, before anything else: nothing is said to a connection natguard did not send.
    let who = match st.records.lookup(src, conn.original_dst).await {
        Ok(w) => w,
        Err(why) => return refused("an unknown client", 403, &why),
    };
    let name = who.name.as_str();
    let Some(api) = st.api else {
        return refused(name, 403, "the proxy does not know this node's cloud (set metadata.proxyCloud or metadata.preset)");
    };
    if who.policy == pods::Policy::Deny {
        return refused(
            name,
            403,
            "the pod's policy is deny (natguard.io/metadata: deny)",
        );
    }
    // The request's form: origin-form only, no body, no framing a second parser could read
    // another way.
    if req.uri.scheme().is_some() || req.uri.authority().is_some() || method == Method::CONNECT {
        return refused(
            name,
            400,
            "absolute-form, authority-form and CONNECT are refused: natguard is not an open proxy",
        );
    }
    let h = &req.headers;
    if h.contains_key(hyper::header::TRANSFER_ENCODING) {
        return refused(
            name,
            400,
            "a request with Transfer-Encoding (a body) is refused",
        );
    }
    let c = match canon::parse(&raw_target) {
        Ok(c) => c,
        Err(why) => return refused(name, 400, &why),
    };
    let token = api.token();
    let token_request = token.filter(|p| p.is_token_path(api, &c));
    // No body, but the JSON of a token request whose protocol has one, at most a KiB.
    let cls: Vec<_> = h.get_all(hyper::header::CONTENT_LENGTH).iter().collect();
    let length = match cls.as_slice() {
        [] => 0,
        [v] => match v.to_str().ok().and_then(|v| v.parse::<usize>().ok()) {
            Some(n) => n,
            None => return refused(name, 400, "Content-Length is not a number"),
        },
        _ => return refused(name, 400, "more than one Content-Length"),
    };
    let takes_body = token_request.is_some_and(|p| matches!(p.ttl, rules::Ttl::JsonBody { .. }));
    if length > 0 && !(takes_body && method == Method::PUT && length <= rules::MAX_TOKEN_BODY) {
        return refused(name, 400, "a request with a body is refused");
    }
    let header = |k: &str| -> Option<String> {
        let mut all = h.get_all(k).iter();
        let first = all.next()?;
        if all.next().is_some() {
            // Two values of one header: ambiguous, treated as a wrong value.
            return Some(String::new());
        }
        Some(first.to_str().unwrap_or("").to_string())
    };
    // The pod's choice of JSON or text, where the API has one; any other Accept is text.
    let json = api.negotiates_json()
        && header("accept").is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if let Some(p) = token_request {
        if method != Method::PUT {
            return refused(name, 405, "the token path takes PUT only");
        }
        if header("x-forwarded-for").is_some() {
            return refused(
                name,
                403,
                "a token request with X-Forwarded-For is refused, as the cloud does",
            );
        }
        for (k, v) in p.put_headers {
            if header(k).as_deref() != Some(v) {
                return refused(name, 400, &format!("a token request needs {k}: {v}"));
            }
        }
        if let Err(r) = rules::check_request(api, &c, &Verdict::Listing, &header) {
            return refused(name, r.status, &r.reason);
        }
        let range = p.min_ttl..=p.max_ttl;
        let ttl = match p.ttl {
            rules::Ttl::Header(h) => match header(h).map(|v| v.parse::<u64>()) {
                Some(Ok(t)) if range.contains(&t) => t,
                Some(_) => {
                    let why = format!("{h} must be {} to {}", p.min_ttl, p.max_ttl);
                    return refused(name, 400, &why);
                }
                None => return refused(name, 400, &format!("{h} is required")),
            },
            rules::Ttl::JsonBody { key, default } => {
                let read = Limited::new(body, rules::MAX_TOKEN_BODY).collect();
                let bytes = match tokio::time::timeout(LIMITS.header_timeout, read).await {
                    Ok(Ok(b)) => b.to_bytes(),
                    _ => return refused(name, 400, "the token request's body did not arrive"),
                };
                let asked = if bytes.is_empty() {
                    Some(default)
                } else {
                    match serde_json::from_slice::<serde_json::Value>(&bytes) {
                        Ok(serde_json::Value::Object(o)) => match o.get(key) {
                            None => Some(default),
                            Some(v) => v.as_u64(),
                        },
                        _ => None,
                    }
                };
                match asked {
                    Some(t) if range.contains(&t) => t,
                    _ => {
                        let why = format!(
                            "the body must be a JSON object whose {key} is {} to {}",
                            p.min_ttl, p.max_ttl
                        );
                        return refused(name, 400, &why);
                    }
                }
            }
        };
        let t = st
            .tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .mint(src, Duration::from_secs(ttl));
        st.count(Outcome::Served);
        let json_reply = |v: serde_json::Value| {
            let mut r = text(200, v.to_string());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        };
        return match p.ttl {
            rules::Ttl::Header(h) => {
                let mut r = if json {
                    json_reply(serde_json::json!([t]))
                } else {
                    text(200, t)
                };
                if let Ok(v) = hyper::header::HeaderValue::from_str(&ttl.to_string()) {
                    r.headers_mut().insert(h, v);
                }
                r
            }
            rules::Ttl::JsonBody { .. } => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                json_reply(serde_json::json!({
                    "access_token": t,
                    "created_at": crate::log::rfc3339_utc(now),
                    "expires_at": crate::log::rfc3339_utc(now + Duration::from_secs(ttl)),
                    "expires_in": ttl,
                }))
            }
        };
    }
    if method != Method::GET && method != Method::HEAD {
        return refused(
            name,
            405,
            "only GET and HEAD are served (and PUT of a session token)",
        );
    }
    if let Some(p) = token {
        let ok = p.carrier.token(&header).is_some_and(|t| {
            st.tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .valid(&t, src)
        });
        if !ok {
            st.note(
                Outcome::Refused,
                name,
                src,
                &method,
                &raw_target,
                "no valid session token (IMDSv2 is required)",
            );
            let mut r = text(401, "");
            *r.body_mut() = Full::new(Bytes::new());
            return r;
        }
    }
    let verdict = rules::judge(api, &c.segments);
    if let Verdict::Conceal(rule) = verdict {
        let why = format!(
            "concealed by natguard's {} allow-list: {rule}",
            api.as_str()
        );
        st.note(Outcome::Concealed, name, src, &method, &raw_target, &why);
        return no(403, &why);
    }
    if let Err(r) = rules::check_request(api, &c, &verdict, &header) {
        return refused(name, r.status, &r.reason);
    }
    let Some(upstream) = conn.original_dst else {
        return refused(name, 403, "no original destination");
    };
    let target = c.target(api.query_keys());
    // What the answer depends on: the target, and the variant where the API has two.
    let key = if json {
        format!("{target} json")
    } else {
        target.clone()
    };
    // A kept answer; when there is none, one request asks the upstream and the others wait
    // for it (once, within the upstream's deadline), then ask themselves only if it was not
    // kept (not a 200).
    let mut leader = None;
    for first in [true, false] {
        let kept =
            st.cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(upstream, &key, Instant::now());
        if let Some(k) = kept {
            st.count(Outcome::Served);
            return reply(&method, k);
        }
        if !first {
            break;
        }
        match st.asking.ask(upstream, &key) {
            cache::Ask::Lead(l) => {
                leader = Some(l);
                break;
            }
            cache::Ask::Wait(w) => {
                let _ = tokio::time::timeout(upstream::ANSWER_TIMEOUT, w).await;
            }
        }
    }
    let _leader = leader;
    let mut headers: Vec<(&str, String)> = api
        .upstream_headers()
        .iter()
        .map(|(k, v)| (*k, v.to_string()))
        .collect();
    if json {
        headers.push(("accept", "application/json".to_string()));
    }
    if let Some(p) = token {
        match st.node_tokens.get(&st.pool, api, upstream).await {
            Ok(t) => headers.push(p.carrier.header(&t)),
            Err(e) => {
                st.note(Outcome::UpstreamError, name, src, &method, &raw_target, &e);
                return no(502, &format!("the node's session token: {e}"));
            }
        }
    }
    let answer = match upstream::send(&st.pool, upstream, Method::GET, &target, &headers).await {
        Ok(a) => a,
        Err(e) => {
            st.note(Outcome::UpstreamError, name, src, &method, &raw_target, &e);
            return no(502, &format!("the metadata API: {e}"));
        }
    };
    if answer.status == 401 && token.is_some() {
        // The node's token expired early (an instance stop, a reboot of the service).
        st.node_tokens.forget(upstream);
    }
    let mut body = answer.body;
    if answer.status == 200 {
        if verdict == Verdict::Listing {
            let s = String::from_utf8_lossy(&body);
            body = Bytes::from(rules::filter_listing(api, &c.segments, &s));
        } else {
            let form = api.answer_form(&c, json);
            if form == rules::Form::Text {
                // Text was asked for; an upstream that answers JSON anyway is filtered as JSON,
                // where the text filter would find no key.
                match serde_json::from_slice::<serde_json::Value>(&body) {
                    Ok(mut v) if v.is_object() || v.is_array() => {
                        rules::filter_json(&mut v, api.json_conceal());
                        body = Bytes::from(v.to_string());
                    }
                    _ => {
                        let s = String::from_utf8_lossy(&body);
                        body = Bytes::from(rules::filter_text_lines(&s, api.text_conceal()));
                    }
                }
            } else if !api.json_conceal().is_empty() {
                match serde_json::from_slice::<serde_json::Value>(&body) {
                    Ok(mut v) => {
                        rules::filter_json(&mut v, api.json_conceal());
                        body = Bytes::from(v.to_string());
                    }
                    // JSON was asked for, so the concealed keys cannot be found otherwise.
                    Err(_) if form == rules::Form::Json => {
                        let e = "the answer asked for as JSON is not JSON";
                        st.note(Outcome::UpstreamError, name, src, &method, &raw_target, e);
                        return no(502, &format!("the metadata API: {e}"));
                    }
                    Err(_) => {}
                }
            }
        }
    }
    let mut passed = Vec::with_capacity(PASSED_HEADERS.len());
    for k in PASSED_HEADERS {
        if let Some(v) = answer.headers.get(*k) {
            passed.push((hyper::header::HeaderName::from_static(k), v.clone()));
        }
    }
    let k = cache::Kept {
        status: answer.status,
        headers: passed,
        body,
    };
    st.cache.lock().unwrap_or_else(|e| e.into_inner()).put(
        upstream,
        &key,
        k.clone(),
        Instant::now(),
    );
    st.count(Outcome::Served);
    reply(&method, k)
}

/// The pod's answer: `k` as it is, or its head alone for HEAD.
fn reply(method: &Method, k: cache::Kept) -> Reply {
    let head = *method == Method::HEAD;
    let len = k.body.len();
    let mut r = Response::new(Full::new(if head { Bytes::new() } else { k.body }));
    *r.status_mut() =
        hyper::StatusCode::from_u16(k.status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    for (name, v) in k.headers {
        r.headers_mut().insert(name, v);
    }
    if head {
        r.headers_mut()
            .insert(hyper::header::CONTENT_LENGTH, len.into());
    }
    r
}
