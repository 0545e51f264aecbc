//! Embeds the git revision natguard is built from, so `natguard --version` can name it with no
//! git at runtime: `git rev-parse --short=12 HEAD`, plus `-dirty` when tracked files differ from
//! that commit, or `unknown` outside a git checkout of this crate (a source tarball, a vendored
//! copy inside another repository, no git installed).
//!
//! Cargo reruns this when HEAD moves (a commit, a checkout), when the index changes (`git add`)
//! or when the crate's own sources change; an edit to a file outside those (README, scripts)
//! shows up as `-dirty` at the next build that reruns this script.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    for p in ["build.rs", "Cargo.toml", "Cargo.lock", "src"] {
        println!("cargo:rerun-if-changed={p}");
    }
    let revision = revision(&manifest_dir).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=NATGUARD_GIT_REVISION={revision}");
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        // No opportunistic index refresh: a build must not write to the repository.
        .env("GIT_OPTIONAL_LOCKS", "0")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn revision(dir: &Path) -> Option<String> {
    // Only a checkout of this crate counts, not a repository the crate happens to sit in.
    let top = PathBuf::from(git(dir, &["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    // HEAD, the branch it points to and packed-refs move on commit and checkout; the index on
    // `git add`. Worktrees keep HEAD and the index apart from the shared refs: ask git where.
    let mut watched = vec!["HEAD".to_string(), "index".into(), "packed-refs".into()];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(p) = git(dir, &["rev-parse", "--git-path", &name]) {
            let p = if Path::new(&p).is_absolute() {
                PathBuf::from(p)
            } else {
                dir.join(p)
            };
            // A path that does not exist would make cargo rerun this at every build.
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    let rev = git(dir, &["rev-parse", "--short=12", "HEAD"])?;
    let dirty = !git(dir, &["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Some(if dirty { format!("{rev}-dirty") } else { rev })
}
