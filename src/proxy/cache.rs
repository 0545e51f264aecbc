//! The metadata API's answers, kept for a second. What the proxy passes describes the instance
//! (region, zone, instance ID, the network): the same answer for every pod in `proxy` mode,
//! since the upstream request is built from the canonical target alone and the pod's own
//! headers are never sent. A node's pods polling that in tight loops then cost the instance's
//! metadata API (which throttles per instance, and which the node's own agents need) at most
//! one request per path and second.
//!
//! Only whole 200 answers are kept, as the pod was sent them (listings and documents already
//! filtered), and only after the request was judged: who asks and what is concealed are
//! decided for every request, never by the cache. The cache is bounded in bytes, so it never
//! grows with the node's history: an answer that does not fit is simply not kept.
//!
//! When an answer is missing (the first ask, or a second after the last), the first request
//! asks the upstream and the others for the same target wait for its answer ([`InFlight`]),
//! within the upstream's deadline: a busy node sends one request upstream per path, not one
//! per waiting pod, at each second.

use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// How long an answer is served again.
pub const KEEP_FOR: Duration = Duration::from_secs(1);
/// The largest answer kept (metadata values and documents are a few KiB).
pub const MAX_ANSWER: usize = 64 * 1024;
/// All answers kept, in bytes (what an entry is counted for: [`Kept::cost`]).
pub const MAX_BYTES: usize = 4 * 1024 * 1024;
/// What an entry costs beyond its bytes (the map's slot, the key's and answer's allocations).
const ENTRY_COST: usize = 256;

/// An answer as the pod was sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub status: u16,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

impl Kept {
    fn cost(&self, target: &str) -> usize {
        ENTRY_COST
            + target.len()
            + self.body.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.as_str().len() + v.len())
                .sum::<usize>()
    }
}

/// Answers per upstream and canonical target.
#[derive(Default)]
pub struct Cache {
    kept: HashMap<SocketAddr, HashMap<String, (Instant, usize, Kept)>>,
    bytes: usize,
}

impl Cache {
    /// The answer kept for `target` at `upstream`, if it is younger than [`KEEP_FOR`].
    pub fn get(&mut self, upstream: SocketAddr, target: &str, now: Instant) -> Option<Kept> {
        let of = self.kept.get_mut(&upstream)?;
        match of.get(target) {
            Some((at, _, k)) if now.saturating_duration_since(*at) < KEEP_FOR => Some(k.clone()),
            Some(_) => {
                if let Some((_, cost, _)) = of.remove(target) {
                    self.bytes -= cost;
                }
                None
            }
            None => None,
        }
    }

    /// Keeps `answer` (a 200 of at most [`MAX_ANSWER`] bytes; others are not kept). Expired
    /// answers make room first; when the live ones fill [`MAX_BYTES`], it is not kept.
    pub fn put(&mut self, upstream: SocketAddr, target: &str, answer: Kept, now: Instant) {
        if answer.status != 200 || answer.body.len() > MAX_ANSWER {
            return;
        }
        let cost = answer.cost(target);
        if let Some((_, old, _)) = self.kept.get_mut(&upstream).and_then(|m| m.remove(target)) {
            self.bytes -= old;
        }
        if self.bytes + cost > MAX_BYTES {
            let mut freed = 0;
            for of in self.kept.values_mut() {
                of.retain(|_, (at, c, _)| {
                    let live = now.saturating_duration_since(*at) < KEEP_FOR;
                    if !live {
                        freed += *c;
                    }
                    live
                });
            }
            self.kept.retain(|_, of| !of.is_empty());
            self.bytes -= freed;
            if self.bytes + cost > MAX_BYTES {
                return;
            }
        }
        self.bytes += cost;
        self.kept
            .entry(upstream)
            .or_default()
            .insert(target.to_string(), (now, cost, answer));
    }

    /// Bytes held (for the tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.bytes
    }
}

/// Targets being asked upstream, per upstream and target.
#[derive(Default)]
pub struct InFlight {
    asking: Mutex<HashMap<(SocketAddr, String), Arc<Notify>>>,
}

/// What a request does about a missing answer.
pub enum Ask<'a> {
    /// It asks the upstream; the others are woken when this is dropped.
    Lead(Leader<'a>),
    /// Another request is asking: wait for it (then look in the cache again).
    Wait(OwnedNotified),
}

/// The request asking the upstream for a target.
pub struct Leader<'a> {
    of: &'a InFlight,
    key: (SocketAddr, String),
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let mut asking = self.of.asking.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = asking.remove(&self.key) {
            n.notify_waiters();
        }
    }
}

impl InFlight {
    /// Whether this request asks the upstream for `target` or waits for another's answer.
    pub fn ask(&self, upstream: SocketAddr, target: &str) -> Ask<'_> {
        let key = (upstream, target.to_string());
        let mut asking = self.asking.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = asking.get(&key) {
            // Made while the lock is held: the leader's wake-up cannot come before it.
            return Ask::Wait(n.clone().notified_owned());
        }
        asking.insert(key.clone(), Arc::new(Notify::new()));
        Ask::Lead(Leader { of: self, key })
    }

    /// Targets being asked (for the tests).
    #[cfg(test)]
    fn asking(&self) -> usize {
        self.asking.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up() -> SocketAddr {
        "169.254.169.254:80".parse().unwrap()
    }

    fn answer(status: u16, body: &str) -> Kept {
        Kept {
            status,
            headers: vec![(
                hyper::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain"),
            )],
            body: Bytes::from(body.to_string()),
        }
    }

    #[test]
    fn an_answer_is_served_again_for_a_second_and_then_asked_anew() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        let path = "/latest/meta-data/placement/region";
        assert_eq!(c.get(up(), path, t0), None);
        c.put(up(), path, answer(200, "eu-west-3"), t0);
        let again = c.get(up(), path, t0 + Duration::from_millis(999)).unwrap();
        assert_eq!(again.body, "eu-west-3");
        // Keyed by upstream and target: another endpoint or path is not this answer.
        let other: SocketAddr = "[fd00:ec2::254]:80".parse().unwrap();
        assert_eq!(c.get(other, path, t0), None);
        assert_eq!(c.get(up(), "/latest/meta-data/placement/", t0), None);
        // A second later it is gone, and its bytes with it.
        assert_eq!(c.get(up(), path, t0 + KEEP_FOR), None);
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn one_request_asks_the_upstream_and_the_others_wait_for_it() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let f = InFlight::default();
            let Ask::Lead(leader) = f.ask(up(), "/a") else {
                panic!("the first request does not lead")
            };
            let Ask::Wait(waiting) = f.ask(up(), "/a") else {
                panic!("a second request for the same target leads too")
            };
            // Another target, or another upstream, is asked on its own.
            assert!(matches!(f.ask(up(), "/b"), Ask::Lead(_)));
            assert_eq!(f.asking(), 1, "a dropped leader is no longer asking");
            let other: SocketAddr = "[fd00:ec2::254]:80".parse().unwrap();
            assert!(matches!(f.ask(other, "/a"), Ask::Lead(_)));
            // The waiter is woken when the leader is done, whatever its outcome.
            drop(leader);
            tokio::time::timeout(Duration::from_secs(10), waiting)
                .await
                .expect("the waiting request was not woken");
            assert_eq!(f.asking(), 0);
            assert!(matches!(f.ask(up(), "/a"), Ask::Lead(_)));
        });
    }

    #[test]
    fn only_whole_200_answers_of_bounded_size_are_kept() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        for status in [401, 403, 404, 500, 502] {
            c.put(up(), "/a", answer(status, "x"), t0);
            assert_eq!(c.get(up(), "/a", t0), None, "status {status} was kept");
        }
        let big = "x".repeat(MAX_ANSWER + 1);
        c.put(up(), "/big", answer(200, &big), t0);
        assert_eq!(c.get(up(), "/big", t0), None);
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn the_bytes_held_never_pass_the_bound_and_expired_answers_make_room() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        let body = "y".repeat(MAX_ANSWER);
        // Many distinct paths (a pod walking the tree): the bound holds.
        let mut kept = 0;
        for i in 0..200 {
            c.put(up(), &format!("/p/{i}"), answer(200, &body), t0);
            assert!(c.held() <= MAX_BYTES, "{} bytes held", c.held());
            if c.get(up(), &format!("/p/{i}"), t0).is_some() {
                kept += 1;
            }
        }
        assert!(kept > 0 && kept < 200, "{kept} answers kept");
        // Once they expired, a new answer finds room.
        let later = t0 + KEEP_FOR;
        c.put(up(), "/new", answer(200, &body), later);
        assert!(c.get(up(), "/new", later).is_some());
        assert!(c.held() <= MAX_BYTES);
        // Replacing an answer does not count it twice.
        let before = c.held();
        c.put(up(), "/new", answer(200, &body), later);
        assert_eq!(c.held(), before);
    }
}
