//! The conventions of the reference CNI plugins that a person running the binary relies on:
//! run bare it says what it is and which CNI versions it speaks, and `--version` names the
//! release and the git revision it was built from. And the release's own history: the
//! previous release's source that the upgrade test (`scripts/e2e/upgrade.sh`) builds in a
//! checkout without git tags is that release's tag, file for file.

use std::path::Path;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_natguard");

/// The binary with nothing inherited but PATH, stdin from /dev/null.
fn natguard(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn run_bare_it_says_what_it_is_on_stderr_and_exits_0() {
    let out = natguard(&[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    let err = String::from_utf8(out.stderr).unwrap();
    let versions = natguard::cni::SUPPORTED_VERSIONS.join(", ");
    assert_eq!(
        err,
        format!(
            "natguard: CNI chained plugin for metadata interception and masquerade policy; \
             CNI protocol versions supported: {versions}\n"
        )
    );
    assert!(versions.contains("0.3.1") && versions.contains("1.1.0"));
}

/// A mistyped subcommand, run by hand (no `CNI_*` variable), is a usage error naming it, not
/// the CNI error JSON a runtime gets.
#[test]
fn an_unknown_subcommand_by_hand_is_a_usage_error_naming_it() {
    let out = natguard(&["stauts"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "no CNI reply: {out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("unknown subcommand \"stauts\"")
            && err.contains("did you mean `natguard status`?")
            && err.contains("natguard help"),
        "{err}"
    );
    let out = natguard(&["frobnicate", "--x"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("unknown subcommand \"frobnicate\"") && !err.contains("did you mean"),
        "{err}"
    );
    // With a CNI variable set it is a runtime's call: the code-4 reply as before.
    let out = Command::new(BIN)
        .arg("stauts")
        .env_clear()
        .env("CNI_CONTAINERID", "abc")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["code"], 4, "{out:?}");
}

#[test]
fn a_runtime_without_cni_command_still_gets_the_code_4_error() {
    let out = Command::new(BIN)
        .env_clear()
        .env("CNI_CONTAINERID", "abc")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["code"], 4);
    // The error line names what failed, before any network or container is known.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(" error CNI: CNI_COMMAND: not set") && !err.contains("error :"),
        "{err}"
    );
    let out = Command::new(BIN)
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(" error ADD: ") && !err.contains("error :"),
        "{err}"
    );
}

/// The checkout's revision as build.rs records it, or None outside a git checkout.
fn checkout_revision() -> Option<(String, bool)> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_OPTIONAL_LOCKS", "0")
            .output()
            .ok()?;
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let rev = git(&["rev-parse", "--short=12", "HEAD"])?;
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Some((rev, dirty))
}

#[test]
fn version_names_the_release_and_the_git_revision() {
    for arg in ["--version", "version"] {
        let out = natguard(&[arg]);
        assert_eq!(out.status.code(), Some(0), "{arg}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let prefix = format!("natguard {} (revision ", env!("CARGO_PKG_VERSION"));
        let rev = text
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(")\n"))
            .unwrap_or_else(|| panic!("{arg}: {text:?}"));
        let Some((head, dirty_now)) = checkout_revision() else {
            // Built outside a git checkout (a source tarball): nothing to name.
            assert_eq!(rev, "unknown", "{arg}");
            continue;
        };
        let (hex, dirty) = match rev.strip_suffix("-dirty") {
            Some(h) => (h, true),
            None => (rev, false),
        };
        assert!(
            hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
            "{arg}: revision {rev:?} is not 12 hex digits"
        );
        // Built from this checkout: the same commit. The dirty mark is compared only when the
        // tree is clean now (an edit made after the build shows only at the next build).
        assert_eq!(hex, head, "{arg}: built from another commit than HEAD");
        if !dirty_now {
            assert!(!dirty, "{arg}: says -dirty, but the tree is clean");
        }
    }
}

/// `git -C <crate> ARGS`: stdout when git ran and succeeded, None otherwise.
fn git_out(args: &[&str]) -> Option<Vec<u8>> {
    let o = Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stderr(Stdio::null())
        .output()
        .ok()?;
    o.status.success().then_some(o.stdout)
}

/// `scripts/e2e/upgrade.sh` builds 0.1.0 from the tag `v0.1.0` where the checkout has it, and
/// from `tests/fixtures/natguard-0.1.0-src.tar.gz` where it does not (CI's checkout may carry
/// no tags): the archive must hold exactly the paths the script takes from the tag
/// (`OLD_FILES`), with the tag's bytes, or the two ways would test different releases.
#[test]
fn the_previous_release_archive_is_its_tag() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let archive = dir.join("tests/fixtures/natguard-0.1.0-src.tar.gz");
    let script = std::fs::read_to_string(dir.join("scripts/e2e/upgrade.sh")).unwrap();
    let paths: Vec<&str> = script
        .lines()
        .find_map(|l| l.strip_prefix("OLD_FILES=(")?.strip_suffix(')'))
        .expect("upgrade.sh names the paths it takes from the tag: OLD_FILES=(...)")
        .split_whitespace()
        .collect();
    // tar -tzf ARCHIVE (the list) or tar -xzOf ARCHIVE PATH (one file's bytes)
    let tar = |mode: &str, path: Option<&str>| {
        let o = Command::new("tar")
            .arg(mode)
            .arg(&archive)
            .args(path)
            .output()
            .unwrap();
        assert!(o.status.success(), "tar {mode} {path:?}: {o:?}");
        o.stdout
    };
    let mut in_archive: Vec<String> = String::from_utf8(tar("-tzf", None))
        .unwrap()
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(String::from)
        .collect();
    in_archive.sort();
    // Whatever git says, the archive is 0.1.0's crate.
    let manifest = String::from_utf8(tar("-xzOf", Some("Cargo.toml"))).unwrap();
    assert!(
        manifest.contains("\nversion = \"0.1.0\"\n"),
        "the archive's Cargo.toml is not 0.1.0's:\n{manifest}"
    );
    if git_out(&["rev-parse", "-q", "--verify", "v0.1.0^{commit}"]).is_none() {
        eprintln!("no tag v0.1.0 in this checkout: the archive is not compared with it");
        return;
    }
    let mut ls_tree = vec!["ls-tree", "-r", "--name-only", "v0.1.0", "--"];
    ls_tree.extend(&paths);
    let mut in_tag: Vec<String> = String::from_utf8(git_out(&ls_tree).unwrap())
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    in_tag.sort();
    assert!(!in_tag.is_empty(), "v0.1.0 has none of {paths:?}");
    assert_eq!(
        in_archive, in_tag,
        "the archive's files are not the tag's {paths:?}"
    );
    for path in &in_tag {
        let from_tag = git_out(&["cat-file", "blob", &format!("v0.1.0:{path}")]).unwrap();
        assert!(
            tar("-xzOf", Some(path)) == from_tag,
            "{path}: the archive's bytes differ from the tag's"
        );
    }
}

/// The image's `org.opencontainers.image.source` label comes from Cargo.toml's
/// `package.repository` (scripts/image.sh): it must be there and be a URL, and image.sh must
/// refuse to label an image without one rather than write "unknown".
#[test]
fn the_image_source_label_has_a_real_url() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let toml = std::fs::read_to_string(Path::new(dir).join("Cargo.toml")).unwrap();
    let repo = toml
        .lines()
        .find_map(|l| l.strip_prefix("repository = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("package.repository in Cargo.toml");
    assert!(
        repo.starts_with("https://") && repo.len() > "https://".len() + 3,
        "{repo}"
    );
    assert_eq!(env!("CARGO_PKG_REPOSITORY"), repo);
    let image = std::fs::read_to_string(Path::new(dir).join("scripts/image.sh")).unwrap();
    assert!(
        !image.contains("source_url:-unknown"),
        "image.sh must not fall back to unknown"
    );
}
