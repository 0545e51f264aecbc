//! Replacing a file whole: the one write-then-rename every layer uses.
//!
//! Whoever reads natguard's files (a runtime reading a conflist or exec'ing the plugin, a
//! collector reading the metrics file, another invocation reading a conntrack request, the
//! verified record or the IPv6 probe's verdict) must see the old file or the new one, never
//! half of either. So a write goes to a temporary file in the target's directory, created
//! exclusively (`O_EXCL`: never through a symlink, never into another writer's file) and
//! renamed over the target. The temporary file's name starts with a dot, so no runtime takes
//! it for a config or a plugin and no collector for metrics.
//!
//! Files that must survive a power loss (what `install` puts in the netconf and binary
//! directories) are written [`How::durable`]: the file is fsynced before the rename and its
//! directory after. Files under `/run` are not: tmpfs forgets them at boot anyway, and the
//! verbs that write them are on a pod's start path.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How [`replace`] writes.
#[derive(Clone, Copy)]
pub(crate) struct How<'a> {
    /// The new file's mode, whatever the umask.
    pub mode: u32,
    /// A file whose mode and owner the new one takes instead (the file it replaces).
    pub like: Option<&'a fs::Metadata>,
    /// fsync the file before the rename and the directory after.
    pub durable: bool,
    /// Checked just before the rename: a write whose source changed meanwhile is abandoned
    /// with `io::ErrorKind::Interrupted`, so another agent's newer file is not overwritten with
    /// a version based on what it replaced.
    pub unchanged: Option<&'a dyn Fn() -> bool>,
}

impl How<'_> {
    /// A file of `mode`, not fsynced, written whatever is there.
    pub(crate) fn mode(mode: u32) -> Self {
        How {
            mode,
            like: None,
            durable: false,
            unchanged: None,
        }
    }
}

/// The directory a file is in (`.` for a bare name).
pub(crate) fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `path`'s temporary file for [`replace`], unique to this process: `.NAME.natguard-PID.tmp`.
pub(crate) fn temp_beside(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.natguard-{}.tmp", std::process::id()))
}

/// Replaces `path` with `bytes` through `tmp`, a name in the same directory that only this
/// writer uses ([`temp_beside`], or one the caller's protocol makes unique). A file left at
/// `tmp` by a writer that died is removed first; on failure `tmp` is removed and `path` is
/// untouched.
pub(crate) fn replace(path: &Path, tmp: &Path, bytes: &[u8], how: How<'_>) -> io::Result<()> {
    let _ = fs::remove_file(tmp);
    let result = (|| -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)?;
        f.write_all(bytes)?;
        let mode = how.like.map(|m| m.mode() & 0o7777).unwrap_or(how.mode);
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        if let Some(m) = how.like {
            // Keep the owner; only root may give a file away, and then it is root doing it.
            let _ = std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()));
        }
        if how.durable {
            f.sync_all()?;
        }
        drop(f);
        if let Some(unchanged) = how.unchanged {
            if !unchanged() {
                return Err(io::Error::new(
                    io::ErrorKind::Interrupted,
                    format!("{} changed while natguard was editing it", path.display()),
                ));
            }
        }
        fs::rename(tmp, path)?;
        if how.durable {
            sync_dir(parent(path))?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result
}

/// Which boot a per-boot record was made under.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's id (`/proc/sys/kernel/random/boot_id`), if the kernel tells it.
pub(crate) fn boot_id() -> Option<String> {
    fs::read_to_string(BOOT_ID)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The word a per-boot record holds for boot `boot`: `<boot id> <word>` in a file of
/// natguard's runtime directory (which does not survive a reboot; the id makes a record of
/// another boot count for nothing where it does). `None` for another boot, a file that is not a
/// regular file (opened without following a link or blocking on a FIFO), or one that does not
/// parse.
pub(crate) fn read_boot_record(file: &Path, boot: &str) -> Option<String> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(file)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    io::Read::read_to_string(&mut io::Read::take(f, 256), &mut text).ok()?;
    parse_boot_record(&text, boot).map(str::to_string)
}

/// [`read_boot_record`]'s format: exactly `<boot id> <word>`.
pub(crate) fn parse_boot_record<'a>(text: &'a str, boot: &str) -> Option<&'a str> {
    let mut words = text.split_whitespace();
    if words.next()? != boot {
        return None;
    }
    let word = words.next()?;
    words.next().is_none().then_some(word)
}

/// Writes the per-boot record `<boot> <word>` to `file` and renames it into place, so a reader
/// sees a whole file.
pub(crate) fn write_boot_record(file: &Path, boot: &str, word: &str) -> io::Result<()> {
    let text = format!("{boot} {word}\n");
    replace(file, &temp_beside(file), text.as_bytes(), How::mode(0o644))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(label: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("natguard-fsutil-{label}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_replace_leaves_the_new_file_with_its_mode_and_no_temporary() {
        let d = dir("mode");
        let path = d.join("f.conflist");
        fs::write(&path, b"old").unwrap();
        // A stale temporary file of a writer that died is no obstacle.
        fs::write(temp_beside(&path), b"stale").unwrap();
        let how = How {
            durable: true,
            ..How::mode(0o640)
        };
        replace(&path, &temp_beside(&path), b"new", how).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o640);
        let names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f.conflist")]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_changed_source_abandons_the_write() {
        let d = dir("changed");
        let path = d.join("f");
        fs::write(&path, b"theirs").unwrap();
        let how = How {
            unchanged: Some(&|| false),
            ..How::mode(0o644)
        };
        let e = replace(&path, &temp_beside(&path), b"mine", how).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
        assert_eq!(fs::read(&path).unwrap(), b"theirs");
        assert!(!temp_beside(&path).exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symlink_at_the_temporary_name_is_replaced_not_followed() {
        let d = dir("symlink");
        let path = d.join("f");
        let victim = d.join("victim");
        fs::write(&victim, b"victim").unwrap();
        std::os::unix::fs::symlink(&victim, temp_beside(&path)).unwrap();
        replace(&path, &temp_beside(&path), b"new", How::mode(0o644)).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"victim");
        assert_eq!(fs::read(&path).unwrap(), b"new");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_per_boot_record_counts_only_for_its_boot_and_only_from_a_regular_file() {
        let boot = "0c6b3c1e-6f7a-4c43-9d0e-5d1f9b2f7a10";
        assert_eq!(
            parse_boot_record(&format!("{boot} yes\n"), boot),
            Some("yes")
        );
        for bad in ["", "yes", boot, &format!("{boot} yes extra")] {
            assert_eq!(parse_boot_record(bad, boot), None, "{bad:?}");
        }
        assert_eq!(parse_boot_record(&format!("{boot} yes"), "another"), None);
        let d = dir("boot");
        let file = d.join("record");
        write_boot_record(&file, boot, "no").unwrap();
        assert_eq!(read_boot_record(&file, boot).as_deref(), Some("no"));
        assert_eq!(read_boot_record(&file, "another"), None);
        // A link to a record is not followed.
        let link = d.join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_boot_record(&link, boot), None);
        fs::remove_dir_all(&d).unwrap();
    }
}
