//! The corpus of `tests/bad_input.rs`: the seeded pod's good invocation, and rows that each
//! break one thing about it (stdin, a config field, the prevResult, an environment variable, a
//! verb) with the CNI error code and the word the message must contain.

use serde_json::{json, Value};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

pub const NET: &str = "ng-bad";
pub const CID: &str = "0123456789abcdef0123456789abcdef";
pub const POD_ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0";

// ---------------------------------------------------------------------------------------------
// Building invocations
// ---------------------------------------------------------------------------------------------

pub fn good_prev() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "cni0", "mac": "aa:bb:cc:dd:ee:00"},
            {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:01"},
            {"name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/var/run/netns/pod"}
        ],
        "ips": [
            {"address": "10.99.0.5/24", "gateway": "10.99.0.1", "interface": 2},
            {"address": "fd00:99::5/64", "gateway": "fd00:99::1", "interface": 2}
        ],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {}
    })
}

/// The plugin entry of the seeded network: fixed proxy addresses, so no route is needed.
pub fn good_conf() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NET,
        "type": "natguard",
        "metadata": {"proxyIPv4": "10.98.0.1", "proxyIPv6": "fd00:98::1"},
        "prevResult": good_prev()
    })
}

/// `good_conf()` with the value at `path` replaced (`None`: removed).
pub fn patched(path: &[&str], value: Option<Value>) -> Value {
    let mut c = good_conf();
    set(&mut c, path, value);
    c
}

pub fn set(v: &mut Value, path: &[&str], value: Option<Value>) {
    let (last, parents) = path.split_last().unwrap();
    let mut cur = v;
    for p in parents {
        if !cur.get(*p).is_some_and(Value::is_object) {
            cur[*p] = json!({});
        }
        cur = cur.get_mut(*p).unwrap();
    }
    let obj = cur.as_object_mut().unwrap();
    match value {
        Some(x) => {
            obj.insert(last.to_string(), x);
        }
        None => {
            obj.remove(*last);
        }
    }
}

/// The environment a runtime sets for `verb` on the seeded pod's netns.
pub fn base_env(verb: &str, netns: &str) -> Vec<(String, OsString)> {
    [
        ("CNI_COMMAND", verb),
        ("CNI_CONTAINERID", CID),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
        ("CNI_ARGS", POD_ARGS),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), OsString::from(v)))
    .collect()
}

/// One malformed invocation and what natguard must answer.
pub struct Row {
    pub name: String,
    pub verb: &'static str,
    /// Environment changes: `Some` sets (raw bytes allowed), `None` removes.
    pub env: Vec<(&'static str, Option<OsString>)>,
    /// `None`: no stdin at all.
    pub stdin: Option<Vec<u8>>,
    pub code: u64,
    pub needle: String,
}

struct Corpus(Vec<Row>);

impl Corpus {
    fn push(
        &mut self,
        name: impl Into<String>,
        verb: &'static str,
        env: Vec<(&'static str, Option<OsString>)>,
        stdin: Option<Vec<u8>>,
        code: u64,
        needle: impl Into<String>,
    ) {
        self.0.push(Row {
            name: name.into(),
            verb,
            env,
            stdin,
            code,
            needle: needle.into(),
        });
    }

    /// An ADD whose stdin is `conf`.
    fn conf(&mut self, name: &str, conf: Value, code: u64, needle: &str) {
        let stdin = serde_json::to_vec(&conf).unwrap();
        self.push(name, "ADD", vec![], Some(stdin), code, needle);
    }

    /// An ADD whose natguard field at `path` is `value`.
    fn field(&mut self, path: &[&str], value: Value, code: u64, needle: &str) {
        let name = format!("{} = {}", path.join("."), short(&value.to_string()));
        self.conf(&name, patched(path, Some(value)), code, needle);
    }

    /// An ADD with raw bytes on stdin.
    fn raw(&mut self, name: &str, stdin: Vec<u8>, code: u64, needle: &str) {
        self.push(name, "ADD", vec![], Some(stdin), code, needle);
    }

    /// A `verb` with one environment variable set to `value` (`None`: unset).
    fn env(
        &mut self,
        verb: &'static str,
        var: &'static str,
        value: Option<OsString>,
        code: u64,
        needle: &str,
    ) {
        let shown = match &value {
            Some(v) => short(&format!("{v:?}")),
            None => "unset".into(),
        };
        let stdin = serde_json::to_vec(&good_conf()).unwrap();
        self.push(
            format!("{verb} {var}={shown}"),
            verb,
            vec![(var, value)],
            Some(stdin),
            code,
            needle,
        );
    }
}

pub fn short(s: &str) -> String {
    if s.len() > 60 {
        format!(
            "{}... ({} bytes)",
            &s[..s.char_indices().nth(50).map_or(s.len(), |c| c.0)],
            s.len()
        )
    } else {
        s.to_string()
    }
}

pub fn os(s: &str) -> Option<OsString> {
    Some(OsString::from(s))
}

pub fn corpus() -> Vec<Row> {
    let mut c = Corpus(Vec::new());
    let good = serde_json::to_vec(&good_conf()).unwrap();

    // --- stdin that is not a JSON object: code 6 ---
    c.raw("empty stdin", vec![], 6, "stdin");
    c.push("no stdin at all", "ADD", vec![], None, 6, "stdin");
    c.raw(
        "unterminated object",
        b"{\"cniVersion\":\"1.0.0\"".to_vec(),
        6,
        "not valid JSON",
    );
    c.raw("JSON array", b"[]".to_vec(), 6, "expected a JSON object");
    c.raw("JSON null", b"null".to_vec(), 6, "expected a JSON object");
    c.raw(
        "JSON string",
        b"\"natguard\"".to_vec(),
        6,
        "expected a JSON object",
    );
    c.raw("JSON number", b"42".to_vec(), 6, "expected a JSON object");
    let mut trailing = good.clone();
    trailing.extend_from_slice(b" {}");
    c.raw("two objects", trailing, 6, "not valid JSON");
    let mut bom = b"\xef\xbb\xbf".to_vec();
    bom.extend_from_slice(&good);
    c.raw("UTF-8 byte order mark", bom, 6, "not valid JSON");
    c.raw(
        "binary junk",
        (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect(),
        6,
        "not valid JSON",
    );
    c.raw(
        "invalid UTF-8 in a string",
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"n\xff\xfe\"}".to_vec(),
        6,
        "not valid JSON",
    );
    c.raw(
        "raw control byte in a string",
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"a\x01b\"}".to_vec(),
        6,
        "not valid JSON",
    );
    c.raw(
        "nesting 100000 deep",
        [
            b"{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"x\":".to_vec(),
            vec![b'['; 100_000],
        ]
        .concat(),
        6,
        "not valid JSON",
    );
    c.raw(
        "number out of range",
        br#"{"cniVersion":"1.0.0","name":"n","metadata":{"ports":[1e400]}}"#.to_vec(),
        6,
        "not valid JSON",
    );
    c.raw(
        "oversized stdin (17 MiB of spaces)",
        vec![b' '; natguard::cni::netconf::MAX_STDIN + (1 << 20)],
        6,
        "bytes",
    );
    let mut big = good_conf();
    big["padding"] = Value::String("x".repeat(natguard::cni::netconf::MAX_STDIN));
    c.conf("oversized but valid JSON object", big, 6, "bytes");

    // --- cniVersion ---
    c.conf(
        "cniVersion missing",
        patched(&["cniVersion"], None),
        1,
        "cniVersion",
    );
    for v in [
        "0.1.0", "0.2.0", "0.3", "1.0", "2.0.0", "1.0.0 ", "v1.0.0", "",
    ] {
        c.field(&["cniVersion"], json!(v), 1, "cniVersion");
    }
    c.field(&["cniVersion"], json!(1.0), 7, "cniVersion");
    c.field(&["cniVersion"], json!(null), 7, "cniVersion");

    // --- name and type ---
    c.conf("name missing", patched(&["name"], None), 7, "name");
    c.field(&["name"], json!("../etc"), 7, "name");
    c.field(&["name"], json!("a b"), 7, "name");
    c.field(&["name"], json!("-net"), 7, "name");
    c.field(&["name"], json!(""), 7, "name");
    c.field(&["name"], json!("n".repeat(129)), 7, "name");
    c.field(&["name"], json!("net\u{0}1"), 7, "name");
    c.field(&["name"], json!(7), 7, "name");
    c.field(&["type"], json!(["natguard"]), 7, "type");

    // --- metadata: wrong types, bad values ---
    c.field(&["metadata"], json!([]), 7, "metadata");
    c.field(&["metadata"], json!("proxy"), 7, "metadata");
    c.field(&["metadata", "mode"], json!(1), 7, "metadata.mode");
    c.field(&["metadata", "mode"], json!("PROXY"), 7, "metadata.mode");
    c.field(&["metadata", "mode"], json!("allow"), 7, "allow");
    c.field(
        &["metadata", "addresses"],
        json!("169.254.169.254"),
        7,
        "metadata.addresses",
    );
    c.field(
        &["metadata", "addresses"],
        json!([169]),
        7,
        "metadata.addresses[0]",
    );
    c.field(
        &["metadata", "addresses"],
        json!(["169.254.169.254/32"]),
        7,
        "169.254.169.254/32",
    );
    c.field(
        &["metadata", "addresses"],
        json!(["169.254.169"]),
        7,
        "metadata.addresses[0]",
    );
    c.field(
        &["metadata", "addresses"],
        json!(["fd00:ec2::254", "0.0.0.0"]),
        7,
        "metadata.addresses[1]",
    );
    c.field(
        &["metadata", "addresses"],
        json!(["127.0.0.1"]),
        7,
        "127.0.0.1",
    );
    c.field(&["metadata", "addresses"], json!(["ff02::1"]), 7, "ff02::1");
    c.field(
        &["metadata", "addresses"],
        json!(["::"]),
        7,
        "metadata.addresses[0]",
    );
    c.field(
        &["metadata", "addresses"],
        json!([]),
        7,
        "metadata.addresses",
    );
    c.field(&["metadata", "ports"], json!(80), 7, "metadata.ports");
    c.field(
        &["metadata", "ports"],
        json!(["80"]),
        7,
        "metadata.ports[0]",
    );
    c.field(&["metadata", "ports"], json!([0]), 7, "metadata.ports[0]");
    c.field(
        &["metadata", "ports"],
        json!([80, 65536]),
        7,
        "metadata.ports[1]",
    );
    c.field(&["metadata", "ports"], json!([-80]), 7, "metadata.ports[0]");
    c.field(
        &["metadata", "ports"],
        json!([80.5]),
        7,
        "metadata.ports[0]",
    );
    c.field(
        &["metadata", "ports"],
        json!([null]),
        7,
        "metadata.ports[0]",
    );
    c.field(&["metadata", "ports"], json!([]), 7, "metadata.ports");
    c.field(
        &["metadata", "proxyPort"],
        json!("8181"),
        7,
        "metadata.proxyPort",
    );
    c.field(
        &["metadata", "proxyPort"],
        json!(0),
        7,
        "metadata.proxyPort",
    );
    c.field(&["metadata", "proxyPort"], json!(70000), 7, "70000");
    c.field(
        &["metadata", "proxyPort"],
        json!(18_446_744_073_709_551_615u64),
        7,
        "metadata.proxyPort",
    );
    c.field(
        &["metadata", "proxyIPv4"],
        json!(1),
        7,
        "metadata.proxyIPv4",
    );
    c.field(&["metadata", "proxyIPv4"], json!("Auto"), 7, "Auto");
    c.field(
        &["metadata", "proxyIPv4"],
        json!("fd00::1"),
        7,
        "metadata.proxyIPv4",
    );
    c.field(
        &["metadata", "proxyIPv4"],
        json!("10.0.0.1/32"),
        7,
        "metadata.proxyIPv4",
    );
    c.field(
        &["metadata", "proxyIPv4"],
        json!("0.0.0.0"),
        7,
        "metadata.proxyIPv4",
    );
    c.field(
        &["metadata", "proxyIPv4"],
        json!("255.255.255.255"),
        7,
        "metadata.proxyIPv4",
    );
    c.field(
        &["metadata", "proxyIPv4"],
        json!("224.0.0.1"),
        7,
        "metadata.proxyIPv4",
    );
    c.field(
        &["metadata", "proxyIPv4"],
        json!(""),
        7,
        "metadata.proxyIPv4",
    );
    c.field(
        &["metadata", "proxyIPv6"],
        json!("10.0.0.1"),
        7,
        "metadata.proxyIPv6",
    );
    c.field(
        &["metadata", "proxyIPv6"],
        json!("::"),
        7,
        "metadata.proxyIPv6",
    );
    c.field(
        &["metadata", "proxyIPv6"],
        json!("ff02::1"),
        7,
        "metadata.proxyIPv6",
    );
    c.field(
        &["metadata", "proxyIPv6"],
        json!("fe80::1%eth0"),
        7,
        "metadata.proxyIPv6",
    );
    c.field(
        &["metadata", "proxyIPv6"],
        json!(false),
        7,
        "metadata.proxyIPv6",
    );
    c.field(
        &["metadata", "exemptNamespaces"],
        json!("kube-system"),
        7,
        "metadata.exemptNamespaces",
    );
    c.field(
        &["metadata", "exemptNamespaces"],
        json!(["Kube-System"]),
        7,
        "Kube-System",
    );
    c.field(
        &["metadata", "exemptNamespaces"],
        json!(["kube system"]),
        7,
        "metadata.exemptNamespaces[0]",
    );
    c.field(
        &["metadata", "exemptNamespaces"],
        json!(["kube-system", "-kube"]),
        7,
        "metadata.exemptNamespaces[1]",
    );
    c.field(
        &["metadata", "exemptNamespaces"],
        json!(["n".repeat(64)]),
        7,
        "metadata.exemptNamespaces[0]",
    );
    c.field(
        &["metadata", "exemptNamespaces"],
        json!([""]),
        7,
        "metadata.exemptNamespaces[0]",
    );
    c.field(
        &["metadata", "exemptNamespaces"],
        json!([null]),
        7,
        "metadata.exemptNamespaces[0]",
    );
    c.field(
        &["metadata", "exemptNamespaces"],
        json!(["kube-system\u{1}"]),
        7,
        "metadata.exemptNamespaces[0]",
    );

    // --- masquerade ---
    c.field(&["masquerade"], json!(true), 7, "masquerade");
    c.field(
        &["masquerade", "enabled"],
        json!("yes"),
        7,
        "masquerade.enabled",
    );
    c.field(
        &["masquerade", "enabled"],
        json!(1),
        7,
        "masquerade.enabled",
    );
    c.field(
        &["masquerade", "nonMasqueradeCIDRs"],
        json!("10.0.0.0/8"),
        7,
        "masquerade.nonMasqueradeCIDRs",
    );
    c.field(
        &["masquerade", "nonMasqueradeCIDRs"],
        json!([10]),
        7,
        "masquerade.nonMasqueradeCIDRs[0]",
    );
    for bad in [
        "10.0.0.0",
        "10.0.0.0/33",
        "fd00::/129",
        "10.0.0.0/-1",
        "10.0.0.0/+8",
        "10.0.0.0/8/8",
        "10.0.0/8",
        "010.0.0.0/8",
        "10.0.0.0/ 8",
        " 10.0.0.0/8",
        "10.0.0.0/0008",
        "/8",
        "10.0.0.0/",
        "fe80::/10%eth0",
        "10.0.0.0\u{0}/8",
    ] {
        // The bad entry comes after a good one: the index in the message must be right.
        c.field(
            &["masquerade", "nonMasqueradeCIDRs"],
            json!(["192.168.0.0/16", bad]),
            7,
            "masquerade.nonMasqueradeCIDRs[1]",
        );
    }
    c.field(
        &["masquerade", "masqLinkLocal"],
        json!("true"),
        7,
        "masquerade.masqLinkLocal",
    );
    c.field(
        &["masquerade", "masqLinkLocalIPv6"],
        json!(null),
        7,
        "masquerade.masqLinkLocalIPv6",
    );
    c.field(
        &["masquerade", "randomFully"],
        json!(0),
        7,
        "masquerade.randomFully",
    );

    // --- conntrack and logFile ---
    c.field(&["conntrack"], json!([]), 7, "conntrack");
    c.field(
        &["conntrack", "flushOnAdd"],
        json!("no"),
        7,
        "conntrack.flushOnAdd",
    );
    c.field(&["logFile"], json!(1), 7, "logFile");
    c.field(&["logFile"], json!("natguard.log"), 7, "natguard.log");
    c.field(&["logFile"], json!("../../tmp/x.log"), 7, "logFile");
    c.field(&["logFile"], json!(["/var/log/natguard.log"]), 7, "logFile");

    // --- unknown fields at every level of natguard's sections ---
    c.field(
        &["metadata", "proxyIp"],
        json!("10.0.0.1"),
        7,
        "metadata.proxyIp",
    );
    c.field(&["metadata", "Mode"], json!("deny"), 7, "metadata.Mode");
    c.field(
        &["metadata", "exemptNamespace"],
        json!(["kube-system"]),
        7,
        "metadata.exemptNamespace",
    );
    c.field(
        &["masquerade", "nonMasqueradeCidrs"],
        json!(["10.0.0.0/8"]),
        7,
        "masquerade.nonMasqueradeCidrs",
    );
    c.field(
        &["masquerade", "randomfully"],
        json!(true),
        7,
        "masquerade.randomfully",
    );
    c.field(&["conntrack", "flush"], json!(true), 7, "conntrack.flush");
    c.field(&["conntrack", ""], json!(true), 7, "conntrack.");

    // --- prevResult of the wrong shape or version ---
    c.field(&["prevResult"], json!("10.99.0.5/24"), 6, "prevResult");
    c.field(&["prevResult"], json!([good_prev()]), 6, "prevResult");
    c.field(&["prevResult"], json!(true), 6, "prevResult");
    c.field(
        &["prevResult"],
        json!({"cniVersion":"0.2.0","ip4":{"ip":"10.99.0.5/24","gateway":"10.99.0.1"}}),
        6,
        "0.2.0",
    );
    c.field(
        &["prevResult"],
        json!({"ip4":{"ip":"10.99.0.5/24"}}),
        6,
        "ip4",
    );
    c.field(
        &["prevResult"],
        json!({"ip6":{"ip":"fd00:99::5/64"}}),
        6,
        "ip6",
    );
    c.field(&["prevResult", "cniVersion"], json!("0.1.0"), 1, "0.1.0");
    c.field(
        &["prevResult", "cniVersion"],
        json!(1),
        6,
        "prevResult.cniVersion",
    );
    c.field(
        &["prevResult", "ips"],
        json!({"address":"10.99.0.5/24"}),
        6,
        "prevResult.ips",
    );
    c.field(
        &["prevResult", "ips"],
        json!("10.99.0.5/24"),
        6,
        "prevResult.ips",
    );
    c.field(
        &["prevResult", "ips"],
        json!(["10.99.0.5/24"]),
        6,
        "prevResult.ips[0]",
    );
    c.field(
        &["prevResult", "interfaces"],
        json!({"name":"eth0"}),
        6,
        "prevResult.interfaces",
    );
    let ip_row = |c: &mut Corpus, ip: Value, needle: &str| {
        let name = format!("prevResult.ips[1] = {}", short(&ip.to_string()));
        let mut conf = good_conf();
        conf["prevResult"]["ips"][1] = ip;
        c.conf(&name, conf, 6, needle);
    };
    ip_row(&mut c, json!({"interface": 2}), "prevResult.ips[1].address");
    ip_row(
        &mut c,
        json!({"address": 10, "interface": 2}),
        "prevResult.ips[1].address",
    );
    ip_row(
        &mut c,
        json!({"address": "fd00:99::5", "interface": 2}),
        "prefix",
    );
    ip_row(
        &mut c,
        json!({"address": "10.99.0.6", "interface": 2}),
        "prefix",
    );
    ip_row(
        &mut c,
        json!({"address": "10.99.0.6/33", "interface": 2}),
        "prefix",
    );
    ip_row(
        &mut c,
        json!({"address": "fd00:99::5/129", "interface": 2}),
        "prefix",
    );
    ip_row(
        &mut c,
        json!({"address": "10.99.0.6/-1", "interface": 2}),
        "prefix",
    );
    ip_row(
        &mut c,
        json!({"address": "10.99.0.6/24/1", "interface": 2}),
        "prefix",
    );
    ip_row(
        &mut c,
        json!({"address": "10.99.0.256/24", "interface": 2}),
        "not an IP address",
    );
    ip_row(
        &mut c,
        json!({"address": "fe80::1%eth0/64", "interface": 2}),
        "not an IP address",
    );
    ip_row(
        &mut c,
        json!({"address": "/24", "interface": 2}),
        "prevResult.ips[1].address",
    );
    ip_row(
        &mut c,
        json!({"address": "10.99.0.6/24", "interface": 3}),
        "out of range",
    );
    ip_row(
        &mut c,
        json!({"address": "10.99.0.6/24", "interface": 99_999_999_999u64}),
        "out of range",
    );
    ip_row(
        &mut c,
        json!({"address": "10.99.0.6/24", "interface": -1}),
        "prevResult.ips[1].interface",
    );
    ip_row(
        &mut c,
        json!({"address": "10.99.0.6/24", "interface": 1.5}),
        "prevResult.ips[1].interface",
    );
    ip_row(
        &mut c,
        json!({"address": "10.99.0.6/24", "interface": "2"}),
        "prevResult.ips[1].interface",
    );
    ip_row(&mut c, json!(["10.99.0.6/24"]), "prevResult.ips[1]");
    let mut many = good_conf();
    many["prevResult"]["ips"] = json!((1..=4)
        .map(|i| json!({"address": format!("fd00:9999:9999:9999:9999:9999:9999:{i:04x}/64"), "interface": 2}))
        .collect::<Vec<_>>());
    c.conf(
        "more IPv6 addresses than natguard records",
        many,
        7,
        "prevResult",
    );

    // --- environment: code 4 ---
    for verb in ["ADD", "DEL", "CHECK"] {
        c.env(verb, "CNI_CONTAINERID", None, 4, "CNI_CONTAINERID");
        c.env(verb, "CNI_IFNAME", None, 4, "CNI_IFNAME");
    }
    for verb in ["ADD", "CHECK"] {
        c.env(verb, "CNI_NETNS", None, 4, "CNI_NETNS");
        c.env(verb, "CNI_PATH", os(""), 4, "CNI_PATH");
    }
    for id in [
        "../x".to_string(),
        "x".repeat(1025),
        "abc def".into(),
        "abc\u{1}".into(),
        "-abc".into(),
        "abc/def".into(),
        "$(reboot)".into(),
        "abc;rm -rf".into(),
        "\u{e9}t\u{e9}".into(),
    ] {
        c.env("ADD", "CNI_CONTAINERID", os(&id), 4, "CNI_CONTAINERID");
    }
    c.env("DEL", "CNI_CONTAINERID", os("../x"), 4, "CNI_CONTAINERID");
    c.env(
        "ADD",
        "CNI_CONTAINERID",
        Some(OsString::from_vec(b"abc\xff".to_vec())),
        4,
        "CNI_CONTAINERID",
    );
    for ifname in [
        "../x",
        "abcdefghijklmnop",
        "eth 0",
        "eth\u{1}",
        "..",
        ".",
        "eth0:1",
        "eth/0",
        "\u{e9}th0",
        "eth0\n",
    ] {
        c.env("ADD", "CNI_IFNAME", os(ifname), 4, "CNI_IFNAME");
    }
    c.env("DEL", "CNI_IFNAME", os(&"e".repeat(300)), 4, "CNI_IFNAME");
    c.env("CHECK", "CNI_IFNAME", os("eth0 "), 4, "CNI_IFNAME");
    for args in [
        "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAMESPACE=default",
        "K8S_POD_NAMESPACE=default;IgnoreUnknown=1;K8S_POD_NAME=a;K8S_POD_NAMESPACE=kube-system",
        "K8S_POD_NAME=a;K8S_POD_NAME=b",
    ] {
        c.env("ADD", "CNI_ARGS", os(args), 4, "given twice");
    }
    c.env(
        "ADD",
        "CNI_ARGS",
        os("K8S_POD_NAMESPACE=Kube-System"),
        4,
        "K8S_POD_NAMESPACE",
    );
    c.env(
        "ADD",
        "CNI_ARGS",
        os("K8S_POD_NAMESPACE=kube-system\u{1}"),
        4,
        "K8S_POD_NAMESPACE",
    );
    c.env(
        "ADD",
        "CNI_ARGS",
        os("K8S_POD_NAMESPACE=kube-system "),
        4,
        "K8S_POD_NAMESPACE",
    );
    c.env(
        "ADD",
        "CNI_ARGS",
        os("K8S_POD_NAMESPACE="),
        4,
        "K8S_POD_NAMESPACE",
    );
    c.env(
        "ADD",
        "CNI_ARGS",
        os("K8S_POD_NAMESPACE=kube-system=1"),
        4,
        "K8S_POD_NAMESPACE",
    );
    c.env(
        "ADD",
        "CNI_ARGS",
        os(&format!("K8S_POD_NAME={}", "p".repeat(300))),
        4,
        "K8S_POD_NAME",
    );
    c.env("ADD", "CNI_ARGS", os("K8S_POD_NAME=a b"), 4, "K8S_POD_NAME");
    c.env("ADD", "CNI_ARGS", os("IgnoreUnknown=1;junk"), 4, "junk");
    c.env(
        "CHECK",
        "CNI_ARGS",
        os("K8S_POD_NAMESPACE=a;K8S_POD_NAMESPACE=b"),
        4,
        "given twice",
    );
    // A CNI_ARGS value that is not UTF-8 must not read as "unset" (the namespace would vanish).
    c.env(
        "ADD",
        "CNI_ARGS",
        Some(std::os::unix::ffi::OsStringExt::from_vec(
            b"K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=\xff".to_vec(),
        )),
        4,
        "K8S_POD_NAME",
    );
    // Replies stay small whatever the size of the bad value.
    c.field(
        &["metadata", "mode"],
        json!("x".repeat(100_000)),
        7,
        "metadata.mode",
    );
    c.field(
        &["masquerade", "nonMasqueradeCIDRs"],
        json!(["y".repeat(100_000)]),
        7,
        "nonMasqueradeCIDRs[0]",
    );
    c.field(
        &["metadata", "proxyIPv4"],
        json!("127.0.0.1"),
        7,
        "proxyIPv4",
    );
    c.field(&["metadata", "proxyIPv6"], json!("::1"), 7, "proxyIPv6");
    c.field(
        &["prevResult"],
        json!({"ips": (0..1000).map(|i| json!({"address": format!("10.{}.{}.1/8", i / 250, i % 250)})).collect::<Vec<_>>()}),
        7,
        "prevResult",
    );
    c.env("ADD", "CNI_COMMAND", os("add"), 4, "CNI_COMMAND");
    c.env("ADD", "CNI_COMMAND", os("ADD\u{1}"), 4, "CNI_COMMAND");
    c.env("ADD", "CNI_COMMAND", None, 4, "CNI_COMMAND");

    // --- verbs a cniVersion does not have, and GC's attachment list ---
    let with_version = |v: &str| {
        let mut conf = good_conf();
        conf["cniVersion"] = json!(v);
        serde_json::to_vec(&conf).unwrap()
    };
    c.push(
        "CHECK on 0.3.1",
        "CHECK",
        vec![],
        Some(with_version("0.3.1")),
        1,
        "0.4.0",
    );
    c.push(
        "GC on 1.0.0",
        "GC",
        vec![],
        Some(with_version("1.0.0")),
        1,
        "1.1.0",
    );
    c.push(
        "STATUS on 0.4.0",
        "STATUS",
        vec![],
        Some(with_version("0.4.0")),
        1,
        "1.1.0",
    );
    for (att, needle) in [
        (json!("all"), "cni.dev/valid-attachments"),
        (json!([CID]), "cni.dev/valid-attachments[0]"),
        (
            json!([{"containerID": CID}]),
            "cni.dev/valid-attachments[0].ifname",
        ),
        (
            json!([{"containerID": 1, "ifname": "eth0"}]),
            "cni.dev/valid-attachments[0].containerID",
        ),
    ] {
        let mut conf = good_conf();
        conf["cniVersion"] = json!("1.1.0");
        conf["cni.dev/valid-attachments"] = att.clone();
        c.push(
            format!("GC valid-attachments = {att}"),
            "GC",
            vec![],
            Some(serde_json::to_vec(&conf).unwrap()),
            7,
            needle,
        );
    }
    c.0
}
