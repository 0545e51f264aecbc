//! The natguard binary: a CNI plugin when a runtime execs it with `CNI_COMMAND`, and a node tool
//! (`status`, `adopt`, `install`, ...) when run by hand. It reads the invocation, calls the
//! library, prints the reply or the CNI error JSON on stdout, and sets the exit code.

use natguard::cni::{self, Command};
use natguard::error::Error;
use std::io::{Read, Write};

/// What natguard is, first line of the usage and of the bare invocation's reply.
const ABOUT: &str = "natguard: CNI chained plugin for metadata interception and masquerade policy";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() && run_by_hand() {
        // The reference plugins' convention: run bare, say what it is on stderr and exit 0.
        eprintln!(
            "{ABOUT}; CNI protocol versions supported: {}",
            cni::SUPPORTED_VERSIONS.join(", ")
        );
        std::process::exit(0);
    }
    let code = match args.first().map(String::as_str) {
        Some("status") => natguard::tools::status::cli(&args[1..]),
        Some("metrics") => natguard::tools::metrics::cli(&args[1..]),
        Some("adopt") => natguard::tools::adopt::cli(&args[1..], false),
        Some("reconcile") => natguard::tools::adopt::cli(&args[1..], true),
        Some("install") => natguard::tools::install::install_cli(&args[1..]),
        Some("uninstall") => natguard::tools::install::uninstall_cli(&args[1..]),
        Some("version") | Some("--version") => natguard::tools::version_cli(&args[1..]),
        Some("help") | Some("--help") | Some("-h") => {
            print!("{ABOUT}\n{USAGE}");
            0
        }
        // A word no subcommand has, typed by a person: a usage error naming it, not the CNI
        // reply to a runtime that forgot CNI_COMMAND.
        Some(other) if run_by_hand() => unknown_subcommand(other),
        _ => run_cni(),
    };
    std::process::exit(code);
}

/// The subcommands, for the usage error of one that is not.
const SUBCOMMANDS: [&str; 8] = [
    "status",
    "metrics",
    "adopt",
    "reconcile",
    "install",
    "uninstall",
    "version",
    "help",
];

fn unknown_subcommand(word: &str) -> i32 {
    let shown: String = word.chars().take(64).collect();
    let near = SUBCOMMANDS
        .iter()
        .find(|s| edit_distance(s, word) <= 2)
        .map(|s| format!(" (did you mean `natguard {s}`?)"))
        .unwrap_or_default();
    eprintln!(
        "natguard: unknown subcommand {shown:?}{near}; the subcommands are {}; try `natguard help`",
        SUBCOMMANDS.join(", ")
    );
    natguard::tools::EXIT_USAGE
}

/// Levenshtein distance (a transposition costs two), for short words.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().take(64).collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// No CNI variable at all: a person (or a probe) ran the binary, not a runtime. A runtime that
/// sets some CNI variables but not CNI_COMMAND gets the code-4 error instead.
fn run_by_hand() -> bool {
    std::env::vars_os().all(|(k, _)| !k.as_encoded_bytes().starts_with(b"CNI_"))
}

const USAGE: &str = "
As a CNI plugin, natguard is executed by the container runtime with CNI_COMMAND set.
By hand:
  natguard status      print what natguard has installed on this node and what it stopped
                       (--json: the same as one JSON document)
  natguard metrics     print natguard's counters in the Prometheus text format
  natguard adopt       bring pods that predate natguard under policy (from the CNI cache)
  natguard reconcile   restore every pod's entries from the CNI cache
  natguard install     copy the binary and add natguard to the node's conflist
  natguard uninstall   remove natguard's conflist entry, binary and kernel state
  natguard version     print the version and the git revision it was built from
Each subcommand prints its options with --help (`natguard install --help`).
";

fn run_cni() -> i32 {
    // Lossy, so a non-UTF-8 value is rejected by validation instead of read as unset.
    let get = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
    // Until the verb knows its network and container, its lines name what is known: the verb.
    let verb = get("CNI_COMMAND").as_deref().and_then(Command::parse);
    natguard::log::set_context(natguard::log::Context::component(
        verb.map_or("CNI", |c| c.as_str()),
    ));
    let Some(cmd_text) = get("CNI_COMMAND") else {
        let e = Error::InvalidEnv(
            "CNI_COMMAND: not set; natguard runs as a CNI plugin, or try `natguard help`".into(),
        );
        return print_error(None, &e);
    };
    let Some(command) = Command::parse(&cmd_text) else {
        let e = Error::InvalidEnv(format!(
            "CNI_COMMAND: {:?} is not one of ADD, DEL, CHECK, VERSION, STATUS, GC",
            cni::truncate(&cmd_text, 32)
        ));
        return print_error(None, &e);
    };
    let mut stdin = Vec::new();
    let limit = natguard::cni::netconf::MAX_STDIN as u64 + 1;
    if let Err(e) = std::io::stdin().take(limit).read_to_end(&mut stdin) {
        return print_error(None, &Error::io("read stdin", e));
    }
    #[cfg(debug_assertions)]
    if let Some(p) = std::env::var_os("NATGUARD_TEST_PAUSE_BEFORE_COMMIT") {
        natguard::kernel::test_hooks::set_pause_before_commit(p.into());
    }
    natguard::kernel::netlink::defer_release();
    match natguard::verbs::run(command, &get, &stdin) {
        Ok(reply) => {
            if let Some(v) = reply {
                let mut out = std::io::stdout().lock();
                let _ = serde_json::to_writer(&mut out, &v);
                let _ = out.write_all(b"\n");
                let _ = out.flush();
            }
            let _ = natguard::kernel::netlink::release_deferred();
            0
        }
        Err(e) => {
            let version = natguard::cni::netconf::decode_stdin(&stdin)
                .ok()
                .and_then(|v| natguard::cni::netconf::cni_version_of(&v).ok().flatten());
            let code = print_error(version, &e);
            let _ = natguard::kernel::netlink::release_deferred();
            code
        }
    }
}

fn print_error(version: Option<cni::CniVersion>, e: &Error) -> i32 {
    natguard::log::write("error", &e.to_string());
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, &cni::error_reply(version, e));
    let _ = out.write_all(b"\n");
    let _ = out.flush();
    1
}
