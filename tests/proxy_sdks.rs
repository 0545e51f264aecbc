//! The real cloud SDKs (boto3/botocore, google-auth, azure-identity, from PyPI) against natguard's
//! metadata proxy, each in front of a faithful fake of its cloud's metadata API.
//!
//! The standard world (`common::World`) with the cloud namespace's server replaced by a fake
//! upstream (`tests/proxy/fake_<cloud>.py`: the cloud's documented paths and protocol, IMDSv2
//! tokens enforced, every request recorded, credential answers counted), natguard with the
//! cloud's `metadata.preset` (so `metadata.proxyCloud: "auto"` picks that cloud) and
//! `kube-system` exempt, a default pod and an exempt pod ADDed through the reference bridge
//! plugin, and `natguard install --watch` serving the proxy on the node (the stand-in proxy of
//! the world is stopped: natguard's own must answer). Inside each pod's namespace,
//! `tests/proxy/sdk_probe.py` runs the SDK as a pod's program would (a clean environment, no
//! credentials anywhere but the metadata endpoint) and reports what it got:
//!
//! - AWS (IPv4 and the IPv6 endpoint), the fake with hop limit 1: botocore's region discovery
//!   over IMDSv2 and the instance identity document work (the node holds the real token);
//!   credential resolution ends at once with botocore's ordinary `NoCredentialsError`; the fake
//!   answered no credential and never saw a credential path. The exempt pod, asking the fake
//!   past the node's routing, gets no token and so no region: the hop limit holds.
//! - GCP: google-auth finds the metadata server, the project ID and the zone; a token fails.
//! - Azure: the instance metadata works; azure-identity's `ManagedIdentityCredential` fails.
//!
//! Every request that reached the fake from the default pod came from the node (the proxy),
//! carried the cloud's protocol (an IMDSv2 token, `Metadata-Flavor: Google`, `Metadata: true`)
//! and no `X-Forwarded-For`. The control in every case: the exempt pod (GCP, Azure) or the node
//! itself (AWS, where hop limit 1 keeps tokens from pods) gets the credentials (the fake counts
//! them and the SDK prints the leak marker), so the test would see a leak. `the_fakes_and_sdks_are_faithful_from_the_node` proves the fakes and the
//! SDKs without natguard: the node asks the fake directly and gets everything, and the fakes
//! enforce their protocol (tokens, headers, api-versions) on raw requests;
//! `the_alibaba_and_openstack_fakes_keep_their_protocol` and
//! `the_oracle_and_digitalocean_fakes_keep_their_protocol` do the same for the fakes no SDK
//! test uses (Alibaba's hardening-mode tokens, Nova's OpenStack and EC2 APIs, Oracle's IMDSv2,
//! DigitalOcean's plain GETs).
//!
//! The SDKs live in a virtualenv that `scripts/sdk-venv.sh` makes (scripts/test.sh runs it);
//! `$NATGUARD_SDK_PYTHON` names another interpreter. Needs root; never skips.

mod common;

use common::fake::Fake;
use common::watcher::Watcher;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// In every credential the fakes hand out (`tests/proxy/fakemeta.py`).
const LEAK_MARKER: &str = "NATGUARDLEAKMARKER";
/// How long one SDK probe may run before the test fails (a deadline, not a speed check).
const PROBE_DEADLINE: Duration = Duration::from_secs(60);
/// "At once": the SDK's credential resolution ends well before its own timeouts and retries
/// would (a proxy that hung would make botocore wait 1 s per attempt, azure-identity retry
/// with backoff for many seconds). A deadline for a hang, not a measurement.
const AT_ONCE: Duration = Duration::from_secs(10);
/// The node's addresses towards the cloud (`World`): where the proxy's requests come from.
const NODE_TO_CLOUD: [&str; 2] = ["10.20.0.1", "fd00:c1::1"];

#[derive(Clone, Copy, Debug)]
enum Cloud {
    Aws,
    Gcp,
    Azure,
}

impl Cloud {
    fn name(self) -> &'static str {
        match self {
            Cloud::Aws => "aws",
            Cloud::Gcp => "gcp",
            Cloud::Azure => "azure",
        }
    }
}

fn proxy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy")
}

/// The Python with the SDKs: `$NATGUARD_SDK_PYTHON`, else scripts/sdk-venv.sh's virtualenv.
fn sdk_python() -> PathBuf {
    let p = match std::env::var_os("NATGUARD_SDK_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/sdk-venv/bin/python"),
    };
    assert!(
        p.exists(),
        "no Python with the cloud SDKs at {}: run scripts/sdk-venv.sh (scripts/test.sh does) or set NATGUARD_SDK_PYTHON",
        p.display()
    );
    p
}

/// Runs `sdk_probe.py <cloud>` in `ns` with a clean environment plus `env`; its JSON report.
fn probe(w: &World, ns: &Netns, cloud: Cloud, env: &[(&str, &str)]) -> Value {
    let home = w.dir().join("sdk-home");
    fs::create_dir_all(&home).unwrap();
    let python = sdk_python();
    let script = proxy_dir().join("sdk_probe.py");
    let secs = deadline(PROBE_DEADLINE).as_secs().to_string();
    let mut c = ns.cmd("timeout");
    c.env_clear()
        .envs([
            ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            ("HOME", home.to_str().unwrap()),
            // No credentials but what the metadata endpoint gives.
            ("AWS_CONFIG_FILE", "/dev/null"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
            ("CLOUDSDK_CONFIG", home.to_str().unwrap()),
            // A pod has no metadata.google.internal in its DNS here; the address is the same.
            ("GCE_METADATA_HOST", "169.254.169.254"),
            ("GCE_METADATA_IP", "169.254.169.254"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
        ])
        .envs(env.iter().copied())
        .args([
            &secs,
            python.to_str().unwrap(),
            script.to_str().unwrap(),
            cloud.name(),
        ]);
    let out = output(&mut c);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "sdk_probe.py {} in {} failed ({}):\n{stdout}\n{}",
        cloud.name(),
        ns.name,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("sdk_probe.py {}: not JSON ({e}):\n{stdout}", cloud.name()));
    // What each SDK got, in the test's output (cargo test -- --nocapture).
    let summary: Vec<String> = v
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, r)| {
            let s = match (r.get("ok"), r.get("error")) {
                (Some(ok), _) => format!("ok {ok}"),
                (_, Some(e)) => format!("error {e}"),
                _ => r.to_string(),
            };
            format!("  {k}: {}", s.chars().take(140).collect::<String>())
        })
        .collect();
    eprintln!(
        "sdk_probe.py {} in {}:\n{}",
        cloud.name(),
        ns.name,
        summary.join("\n")
    );
    v["raw"] = Value::from(stdout.into_owned());
    v
}

/// The value the SDK got for `key`, or the test fails with what it got instead.
fn ok<'a>(report: &'a Value, key: &str) -> &'a Value {
    report[key]
        .get("ok")
        .unwrap_or_else(|| panic!("the SDK did not get {key}: {}", report[key]))
}

/// The SDK's error for `key`, or the test fails with the value it got (a leak).
fn err<'a>(report: &'a Value, key: &str) -> &'a str {
    report[key]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("the SDK got {key} where it must fail: {}", report[key]))
}

// ---------------------------------------------------------------------------------------------
// The node: natguard with the cloud's preset, a default and an exempt pod, the watcher
// ---------------------------------------------------------------------------------------------

struct Node {
    w: World,
    fake: Fake,
    web: Pod,
    exempt: Pod,
    _chain: Chain,
    watcher: Watcher,
}

fn node_with_proxy(test: &str, cloud: Cloud, fake_args: &[&str]) -> Node {
    let w = World::new(test);
    let fake = Fake::start(&w, cloud.name(), fake_args);
    // natguard serves the proxy port itself now; the world's stand-in must not answer there.
    w.stop_proxy();
    let entry = w.natguard(json!({
        "metadata": { "preset": cloud.name(), "exemptNamespaces": ["kube-system"] }
    }));
    let chain = w.chain(w.list("sdks", "1.0.0", 0, Some(entry.clone())));
    let web = w.add_pod(&chain, "web", "default");
    let exempt = w.add_pod(&chain, "creds", "kube-system");

    let netd = w.dir().join("net.d");
    fs::create_dir_all(&netd).unwrap();
    fs::write(
        netd.join("10-sdks.conflist"),
        serde_json::to_vec_pretty(&chain.list).unwrap(),
    )
    .unwrap();
    let watcher = Watcher::spawn(
        &w,
        &entry,
        &w.cache_dir().join("results"),
        &[],
        "watcher.log",
    );
    let limit = deadline(Duration::from_secs(10));
    watcher.wait_for("the watcher's record", limit, || watcher.state().is_some());
    let end = Instant::now() + limit;
    loop {
        let ss = w
            .node
            .run(&["ss", "-Hltn", &format!("sport = :{PROXY_PORT}")]);
        if !ss.trim().is_empty() {
            break;
        }
        assert!(
            Instant::now() < end,
            "natguard install --watch serves no metadata proxy on port {PROXY_PORT} \
             (metadata.serveProxy defaults to true); watcher log:\n{}",
            watcher.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    fake.clear();
    Node {
        w,
        fake,
        web,
        exempt,
        _chain: chain,
        watcher,
    }
}

impl Node {
    /// What reached the upstream for the default pod: only from the node (the proxy), never a
    /// credential, and `check` holds for every request.
    fn upstream_saw_only(&self, what: &str, check: impl Fn(&Value) -> bool) {
        let records = self.fake.records();
        assert!(
            !records.is_empty(),
            "nothing reached the upstream for the default pod; watcher log:\n{}",
            self.watcher.log_text()
        );
        for r in &records {
            let client = r["client"].as_str().unwrap_or_default();
            assert!(
                NODE_TO_CLOUD.contains(&client),
                "a request reached the upstream from {client}, not from the node's proxy \
                 (the pod's own address is {} / {}):\n{}",
                self.web.v4,
                self.web.v6,
                self.fake.dump()
            );
            assert!(
                r["headers"].get("x-forwarded-for").is_none(),
                "the proxy sent X-Forwarded-For upstream: {r}"
            );
            assert!(check(r), "{what}: {r}\nall:\n{}", self.fake.dump());
        }
        assert_eq!(
            self.fake.credentials(),
            0,
            "the upstream answered credentials for the default pod:\n{}",
            self.fake.dump()
        );
    }

    /// The control: the exempt pod reaches the fake directly and gets `key` with the marker;
    /// the fake counts it.
    fn exempt_gets_credentials(&self, cloud: Cloud, env: &[(&str, &str)]) {
        self.fake.clear();
        let r = probe(&self.w, &self.exempt.ns, cloud, env);
        let got = ok(&r, "credentials").to_string();
        assert!(
            got.contains(LEAK_MARKER),
            "the exempt pod's credentials do not carry the marker: {got}"
        );
        assert!(
            self.fake.credentials() >= 1,
            "the fake counted no credential answer for the exempt pod:\n{}",
            self.fake.dump()
        );
    }
}

fn path_of(r: &Value) -> &str {
    r["path"].as_str().unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Through natguard's proxy
// ---------------------------------------------------------------------------------------------

#[test]
fn aws_sdk_gets_region_and_identity_document_and_no_credentials() {
    // Hop limit 1, as EKS sets it: token answers die at the first router, so only the node
    // (natguard's proxy) can hold a token; the pods' tokens are the proxy's own.
    let n = node_with_proxy("sdk-aws", Cloud::Aws, &["--hop-limit", "1"]);
    for (family, env) in [
        ("IPv4", vec![]),
        (
            "IPv6",
            vec![("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv6")],
        ),
    ] {
        n.fake.clear();
        let r = probe(&n.w, &n.web.ns, Cloud::Aws, &env);
        assert_eq!(ok(&r, "region"), "eu-west-3", "{family}: region");
        let doc = ok(&r, "identity_document");
        assert_eq!(doc["instanceId"], "i-0a1b2c3d4e5f67890", "{family}: {doc}");
        assert_eq!(doc["region"], "eu-west-3", "{family}: {doc}");
        let e = err(&r, "credentials");
        assert!(
            e.starts_with("NoCredentialsError: Unable to locate credentials"),
            "{family}: botocore's ordinary error expected, got {e}"
        );
        let secs = r["seconds"].as_f64().unwrap();
        assert!(
            Duration::from_secs_f64(secs) < deadline(AT_ONCE),
            "{family}: credential resolution took {secs:.1} s"
        );
        assert!(
            !r["raw"].as_str().unwrap().contains(LEAK_MARKER),
            "{family}: {r}"
        );
        // Upstream: every GET carried a token the fake issued (it answers 401 otherwise),
        // no credential path, no user data.
        n.upstream_saw_only(&format!("{family}: a request upstream"), |rec| {
            let p = path_of(rec);
            let token_ok =
                rec["method"] == "PUT" || rec["headers"].get("x-aws-ec2-metadata-token").is_some();
            token_ok
                && rec["status"] == 200
                && !p.contains("security-credentials")
                && !p.contains("identity-credentials")
                && !p.contains("user-data")
        });
    }
    // The hop limit holds in this network: the exempt pod, which reaches the upstream through
    // the node's routing, never gets a token, so botocore finds no region (and no credentials).
    n.fake.clear();
    let r = probe(&n.w, &n.exempt.ns, Cloud::Aws, &[]);
    assert!(
        r["region"].get("ok").is_none_or(|v| v.is_null()),
        "the exempt pod got a region with hop limit 1: {}",
        r["region"]
    );
    assert_eq!(n.fake.credentials(), 0, "{}", n.fake.dump());
    // The control: the node asks the upstream itself and gets the role's credentials.
    let r = probe(&n.w, &n.w.node, Cloud::Aws, &[]);
    let got = ok(&r, "credentials").to_string();
    assert!(got.contains(LEAK_MARKER), "the node's credentials: {got}");
    assert!(n.fake.credentials() >= 1, "{}", n.fake.dump());
}

#[test]
fn gcp_sdk_gets_project_and_zone_and_no_token() {
    let n = node_with_proxy("sdk-gcp", Cloud::Gcp, &[]);
    let r = probe(&n.w, &n.web.ns, Cloud::Gcp, &[]);
    assert_eq!(ok(&r, "on_gce"), true, "google-auth's ping");
    assert_eq!(ok(&r, "project_id"), "natguard-test-project");
    assert_eq!(ok(&r, "default_project"), "natguard-test-project");
    assert_eq!(ok(&r, "zone"), "projects/123456789012/zones/europe-west1-b");
    let e = err(&r, "credentials");
    assert!(
        e.starts_with("RefreshError"),
        "google-auth's error expected, got {e}"
    );
    assert!(!r["raw"].as_str().unwrap().contains(LEAK_MARKER), "{r}");
    let secs = r["seconds"].as_f64().unwrap();
    assert!(
        Duration::from_secs_f64(secs) < deadline(AT_ONCE),
        "took {secs:.1} s"
    );
    n.upstream_saw_only("a request upstream", |rec| {
        let p = path_of(rec);
        (p == "/" || rec["headers"]["metadata-flavor"] == "Google")
            && !p.ends_with("/token")
            && !p.ends_with("/identity")
    });
    n.exempt_gets_credentials(Cloud::Gcp, &[]);
}

#[test]
fn azure_sdk_gets_instance_metadata_and_no_managed_identity_token() {
    let n = node_with_proxy("sdk-azure", Cloud::Azure, &[]);
    let r = probe(&n.w, &n.web.ns, Cloud::Azure, &[]);
    let inst = ok(&r, "instance");
    assert_eq!(inst["compute"]["location"], "westeurope", "{inst}");
    assert_eq!(inst["compute"]["vmSize"], "Standard_D4s_v5", "{inst}");
    let e = err(&r, "credentials");
    assert!(
        e.starts_with("ClientAuthenticationError") || e.starts_with("CredentialUnavailableError"),
        "azure-identity's error expected, got {e}"
    );
    assert!(!r["raw"].as_str().unwrap().contains(LEAK_MARKER), "{r}");
    let secs = r["seconds"].as_f64().unwrap();
    assert!(
        Duration::from_secs_f64(secs) < deadline(AT_ONCE),
        "took {secs:.1} s"
    );
    n.upstream_saw_only("a request upstream", |rec| {
        rec["headers"]["metadata"] == "true"
            && rec["target"]
                .as_str()
                .unwrap_or_default()
                .contains("api-version=")
            && !path_of(rec).contains("/identity/")
            && !path_of(rec).contains("/attested/")
    });
    n.exempt_gets_credentials(Cloud::Azure, &[]);
}

// ---------------------------------------------------------------------------------------------
// The fakes and the SDKs without natguard
// ---------------------------------------------------------------------------------------------

/// One raw HTTP/1.1 request from `ns` to the metadata address; (status, head, body).
fn raw(ns: &Netns, request: &str) -> (u16, String, String) {
    let request = request.replace('\n', "\r\n") + "\r\n";
    in_netns(ns, move || {
        let mut s = TcpStream::connect_timeout(&sa(META4, HTTP_PORT), IO_TIMEOUT).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
        (status, head.to_string(), body.to_string())
    })
}

fn status(ns: &Netns, request: &str) -> u16 {
    raw(ns, request).0
}

#[test]
fn the_fakes_and_sdks_are_faithful_from_the_node() {
    let w = World::new("sdk-fakes");
    let node = &w.node;
    for cloud in [Cloud::Aws, Cloud::Gcp, Cloud::Azure] {
        let fake = Fake::start(&w, cloud.name(), &[]);
        let r = probe(&w, node, cloud, &[]);
        let got = ok(&r, "credentials").to_string();
        assert!(got.contains(LEAK_MARKER), "{}: {got}", cloud.name());
        assert!(fake.credentials() >= 1, "{}: {}", cloud.name(), fake.dump());
        match cloud {
            Cloud::Aws => {
                assert_eq!(ok(&r, "region"), "eu-west-3");
                assert_eq!(ok(&r, "identity_document")["instanceType"], "m6i.large");
                let v6 = probe(
                    &w,
                    node,
                    cloud,
                    &[("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv6")],
                );
                assert_eq!(ok(&v6, "region"), "eu-west-3", "IPv6 endpoint");
                assert!(fake.records().iter().any(|r| r["client"] == "fd00:c1::1"));
                // IMDSv2: no token, 401; a bad TTL, 400; a token PUT through a proxy, 403.
                let md = "GET /latest/meta-data/instance-id HTTP/1.1\nHost: 169.254.169.254\n";
                assert_eq!(status(node, md), 401);
                let put = "PUT /latest/api/token HTTP/1.1\nHost: x\nContent-Length: 0\n";
                assert_eq!(status(node, put), 400, "no TTL");
                let ttl = format!("{put}X-aws-ec2-metadata-token-ttl-seconds: 21601\n");
                assert_eq!(status(node, &ttl), 400, "TTL above 21600");
                let xff = format!(
                    "{put}X-aws-ec2-metadata-token-ttl-seconds: 60\nX-Forwarded-For: 10.0.0.1\n"
                );
                assert_eq!(status(node, &xff), 403, "X-Forwarded-For on the token PUT");
                let (code, head, token) = raw(
                    node,
                    &format!("{put}X-aws-ec2-metadata-token-ttl-seconds: 60\n"),
                );
                assert_eq!(code, 200);
                assert!(
                    head.contains("X-aws-ec2-metadata-token-ttl-seconds: 60"),
                    "{head}"
                );
                let with = format!("{md}X-aws-ec2-metadata-token: {token}\n");
                assert_eq!(raw(node, &with).2, "i-0a1b2c3d4e5f67890");
                let bad = format!("{md}X-aws-ec2-metadata-token: {token}x\n");
                assert_eq!(status(node, &bad), 401, "an unknown token");
                let role = format!(
                    "GET /latest/meta-data/iam/security-credentials/ HTTP/1.1\nHost: x\nX-aws-ec2-metadata-token: {token}\n"
                );
                assert_eq!(raw(node, &role).2, "natguard-node-role");
            }
            Cloud::Gcp => {
                assert_eq!(ok(&r, "project_id"), "natguard-test-project");
                let pid = "GET /computeMetadata/v1/project/project-id HTTP/1.1\nHost: x\n";
                let (code, _, body) = raw(node, pid);
                assert_eq!(code, 403, "no Metadata-Flavor");
                assert!(
                    body.contains("Missing Metadata-Flavor:Google header"),
                    "{body}"
                );
                let flavored = format!("{pid}Metadata-Flavor: Google\n");
                let (code, head, body) = raw(node, &flavored);
                assert_eq!((code, body.as_str()), (200, "natguard-test-project"));
                assert!(head.contains("Metadata-Flavor: Google"), "{head}");
                let xff = format!("{flavored}X-Forwarded-For: 10.0.0.1\n");
                assert_eq!(status(node, &xff), 403, "X-Forwarded-For");
                let rec = "GET /computeMetadata/v1/instance/?recursive=true HTTP/1.1\nHost: x\nMetadata-Flavor: Google\n";
                let body = raw(node, rec).2;
                let v: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(
                    v["serviceAccounts"]["default"]["email"],
                    "123456789012-compute@developer.gserviceaccount.com"
                );
                assert!(v["attributes"]["kubeEnv"]
                    .as_str()
                    .unwrap()
                    .contains(LEAK_MARKER));
                let id = "GET /computeMetadata/v1/instance/service-accounts/default/identity HTTP/1.1\nHost: x\nMetadata-Flavor: Google\n";
                assert_eq!(status(node, id), 400, "identity without audience");
                let dir =
                    "GET /computeMetadata/v1/instance HTTP/1.1\nHost: x\nMetadata-Flavor: Google\n";
                assert_eq!(status(node, dir), 301, "a directory without its slash");
            }
            Cloud::Azure => {
                assert_eq!(ok(&r, "instance")["compute"]["location"], "westeurope");
                let inst = "GET /metadata/instance?api-version=2021-02-01 HTTP/1.1\nHost: x\n";
                assert_eq!(status(node, inst), 400, "no Metadata: true");
                let with = format!("{inst}Metadata: true\n");
                assert_eq!(status(node, &with), 200);
                assert_eq!(
                    status(node, &format!("{with}X-Forwarded-For: 10.0.0.1\n")),
                    400
                );
                let nover = "GET /metadata/instance HTTP/1.1\nHost: x\nMetadata: true\n";
                let (code, _, body) = raw(node, nover);
                assert_eq!(code, 400);
                assert!(body.contains("api-version was not specified"), "{body}");
                let badver = "GET /metadata/instance?api-version=2099-01-01 HTTP/1.1\nHost: x\nMetadata: true\n";
                let (code, _, body) = raw(node, badver);
                assert_eq!(code, 400);
                assert!(body.contains("newest-versions"), "{body}");
                let loc = "GET /metadata/instance/compute/location?api-version=2021-02-01&format=text HTTP/1.1\nHost: x\nMetadata: true\n";
                assert_eq!(raw(node, loc).2, "westeurope");
                let att = "GET /metadata/attested/document?api-version=2020-09-01 HTTP/1.1\nHost: x\nMetadata: true\n";
                assert!(raw(node, att).2.contains("pkcs7"));
                let tok = "GET /metadata/identity/oauth2/token?api-version=2018-02-01 HTTP/1.1\nHost: x\nMetadata: true\n";
                assert_eq!(status(node, tok), 400, "a token without resource");
            }
        }
        // The next cloud's fake takes port 80.
        fake.stop(&w);
    }
}

/// The Alibaba and OpenStack fakes (no SDK test uses them; natguard's proxy tests may): their
/// protocol on raw requests from the node, and their credential count.
#[test]
fn the_alibaba_and_openstack_fakes_keep_their_protocol() {
    let w = World::new("sdk-fakes2");
    let node = &w.node;

    let fake = Fake::start(&w, "alibaba", &[]);
    let md = "GET /latest/meta-data/region-id HTTP/1.1\nHost: x\n";
    assert_eq!(status(node, md), 403, "hardening mode: no token");
    let put = "PUT /latest/api/token HTTP/1.1\nHost: x\nContent-Length: 0\n";
    assert_eq!(status(node, put), 400, "no TTL");
    let xff =
        format!("{put}X-aliyun-ecs-metadata-token-ttl-seconds: 60\nX-Forwarded-For: 10.0.0.1\n");
    assert_eq!(status(node, &xff), 403);
    let (code, _, token) = raw(
        node,
        &format!("{put}X-aliyun-ecs-metadata-token-ttl-seconds: 60\n"),
    );
    assert_eq!(code, 200);
    let with = |req: &str| format!("{req}X-aliyun-ecs-metadata-token: {token}\n");
    assert_eq!(raw(node, &with(md)).2, "cn-hangzhou");
    let role = "GET /latest/meta-data/ram/security-credentials/ HTTP/1.1\nHost: x\n";
    assert_eq!(raw(node, &with(role)).2, "natguard-node-ram-role");
    let cred =
        "GET /latest/meta-data/ram/security-credentials/natguard-node-ram-role HTTP/1.1\nHost: x\n";
    let v: Value = serde_json::from_str(&raw(node, &with(cred)).2).unwrap();
    assert!(
        v["SecurityToken"].as_str().unwrap().contains(LEAK_MARKER),
        "{v}"
    );
    assert_eq!(fake.credentials(), 1, "{}", fake.dump());
    fake.stop(&w);

    let fake = Fake::start(&w, "openstack", &[]);
    let (code, _, body) = raw(node, "GET /openstack HTTP/1.1\nHost: x\n");
    assert_eq!(code, 200);
    assert!(body.lines().any(|l| l == "latest"), "{body}");
    let meta = raw(
        node,
        "GET /openstack/latest/meta_data.json HTTP/1.1\nHost: x\n",
    )
    .2;
    let v: Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(v["availability_zone"], "nova");
    assert_eq!(
        raw(
            node,
            "GET /latest/meta-data/placement/availability-zone HTTP/1.1\nHost: x\n"
        )
        .2,
        "nova"
    );
    assert_eq!(fake.credentials(), 0);
    let ud = raw(node, "GET /openstack/latest/user_data HTTP/1.1\nHost: x\n").2;
    assert!(ud.contains(LEAK_MARKER));
    assert_eq!(fake.credentials(), 1, "{}", fake.dump());
    assert_eq!(
        status(
            node,
            "POST /openstack/latest/meta_data.json HTTP/1.1\nHost: x\nContent-Length: 0\n"
        ),
        405
    );
    fake.stop(&w);
}

/// The Oracle and DigitalOcean fakes (natguard's proxy tests use them, no SDK test does):
/// their protocol on raw requests from the node, and their credential count.
#[test]
fn the_oracle_and_digitalocean_fakes_keep_their_protocol() {
    let w = World::new("sdk-fakes3");
    let node = &w.node;

    let fake = Fake::start(&w, "oracle", &[]);
    let region = "GET /opc/v2/instance/region HTTP/1.1\nHost: x\n";
    assert_eq!(status(node, region), 401, "no Authorization");
    let bearer = |req: &str| format!("{req}Authorization: Bearer Oracle\n");
    assert_eq!(raw(node, &bearer(region)).2, "phx");
    for fwd in [
        "Forwarded: for=10.0.0.1",
        "X-Forwarded-For: 10.0.0.1",
        "X-Forwarded-Host: x",
    ] {
        assert_eq!(
            status(node, &format!("{}{fwd}\n", bearer(region))),
            403,
            "{fwd}"
        );
    }
    assert_eq!(
        status(node, &bearer("GET /opc/v1/instance/ HTTP/1.1\nHost: x\n")),
        404,
        "IMDSv1 disabled"
    );
    let vnic = "GET /opc/v2/vnics/0/privateIp HTTP/1.1\nHost: x\n";
    assert_eq!(raw(node, &bearer(vnic)).2, "10.0.0.5");
    assert_eq!(fake.credentials(), 0, "{}", fake.dump());
    let doc = raw(node, &bearer("GET /opc/v2/instance/ HTTP/1.1\nHost: x\n")).2;
    let v: Value = serde_json::from_str(&doc).unwrap();
    assert!(
        v["metadata"]["user_data"]
            .as_str()
            .unwrap()
            .contains(LEAK_MARKER),
        "{v}"
    );
    let key = raw(
        node,
        &bearer("GET /opc/v2/identity/key.pem HTTP/1.1\nHost: x\n"),
    )
    .2;
    assert!(key.contains(LEAK_MARKER), "{key}");
    assert_eq!(fake.credentials(), 2, "{}", fake.dump());
    fake.stop(&w);

    let fake = Fake::start(&w, "digitalocean", &[]);
    let (code, _, index) = raw(node, "GET /metadata/v1/ HTTP/1.1\nHost: x\n");
    assert_eq!(code, 200);
    assert!(
        index.lines().any(|l| l == "user-data") && index.lines().any(|l| l == "interfaces/"),
        "{index}"
    );
    assert_eq!(
        raw(node, "GET /metadata/v1/region HTTP/1.1\nHost: x\n").2,
        "nyc3"
    );
    assert_eq!(fake.credentials(), 0);
    let ud = raw(node, "GET /metadata/v1/user-data HTTP/1.1\nHost: x\n").2;
    assert!(ud.contains(LEAK_MARKER));
    let v: Value =
        serde_json::from_str(&raw(node, "GET /metadata/v1.json HTTP/1.1\nHost: x\n").2).unwrap();
    assert_eq!(v["droplet_id"], 2756294);
    assert_eq!(fake.credentials(), 2, "{}", fake.dump());
    assert_eq!(
        status(
            node,
            "POST /metadata/v1/ HTTP/1.1\nHost: x\nContent-Length: 0\n"
        ),
        405
    );
    fake.stop(&w);
}
