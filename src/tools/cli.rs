//! The command lines of the node tools, parsed one way: `--flag value` or `--flag=value`,
//! `-h`/`--help` anywhere, and one reply to a usage error.
//!
//! Every subcommand answers `--help` with its usage on stdout and exit 0, and a usage error with
//! ONE line on stderr that names the bad argument and points at `natguard VERB --help`, exit 2.
//! The usage text is not repeated on an error: in a container's log it would bury the line that
//! says what was wrong. Parsing never touches the node; each subcommand's own checks of values
//! (a port, a CIDR, a config file) return [`Error::Command`] and reach the same reply.

use crate::error::{Error, Result};

/// Exit code of a usage error (a bad command line; nothing was done).
pub const EXIT_USAGE: i32 = 2;

/// A parsed command line, or a request for the usage text.
pub(crate) enum Parsed<T> {
    Run(T),
    Help,
}

/// Pulls `--flag value` / `--flag=value` pairs out of an argument list.
pub(crate) struct Args<'a> {
    args: &'a [String],
    pos: usize,
}

impl<'a> Args<'a> {
    pub(crate) fn new(args: &'a [String]) -> Self {
        Args { args, pos: 0 }
    }

    /// The next flag and, if written as `--flag=value`, its inline value.
    pub(crate) fn next_flag(&mut self) -> Option<(String, Option<String>)> {
        let arg = self.args.get(self.pos)?;
        self.pos += 1;
        match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                Some((flag.to_string(), Some(value.to_string())))
            }
            _ => Some((arg.clone(), None)),
        }
    }

    /// The flag's value: inline, or the next argument.
    pub(crate) fn value(&mut self, flag: &str, inline: Option<String>) -> Result<String> {
        if let Some(v) = inline {
            return Ok(v);
        }
        let v = self
            .args
            .get(self.pos)
            .ok_or_else(|| usage(format!("{flag} needs a value")))?;
        self.pos += 1;
        Ok(v.clone())
    }
}

/// A usage error with this message.
pub(crate) fn usage(msg: impl Into<String>) -> Error {
    Error::Command(msg.into())
}

/// A switch written with a value (`--watch=yes`) is a usage error.
pub(crate) fn no_value(flag: &str, inline: &Option<String>) -> Result<()> {
    match inline {
        Some(_) => Err(usage(format!("{flag} takes no value"))),
        None => Ok(()),
    }
}

/// The usual error for an argument no subcommand knows.
pub(crate) fn unknown(arg: &str) -> Error {
    usage(format!("unknown argument {arg:?}"))
}

/// Whether `flag` asks for the usage text.
pub(crate) fn is_help(flag: &str) -> bool {
    matches!(flag, "-h" | "--help")
}

/// The options to run with, or the exit code when there is nothing to run: the usage on stdout
/// for `--help` (0), one line on stderr for a usage error (2).
pub(crate) fn options_or_exit<T>(
    verb: &str,
    usage_text: &str,
    parsed: Result<Parsed<T>>,
) -> std::result::Result<T, i32> {
    match parsed {
        Ok(Parsed::Run(o)) => Ok(o),
        Ok(Parsed::Help) => {
            print!("{usage_text}");
            Err(0)
        }
        Err(e) => {
            eprintln!("{}", usage_line(verb, &e));
            Err(EXIT_USAGE)
        }
    }
}

/// `natguard VERB: MESSAGE; try `natguard VERB --help``.
pub(crate) fn usage_line(verb: &str, e: &Error) -> String {
    format!("natguard {verb}: {e}; try `natguard {verb} --help`")
}

/// A command line of switches only (`status --json`, `metrics`, `version`): the switches given,
/// in order; anything else is a usage error.
pub(crate) fn parse_switches(args: &[String], known: &[&str]) -> Result<Parsed<Vec<String>>> {
    let mut it = Args::new(args);
    let mut out = Vec::new();
    while let Some((flag, inline)) = it.next_flag() {
        if is_help(&flag) {
            return Ok(Parsed::Help);
        }
        if !known.contains(&flag.as_str()) {
            return Err(unknown(&flag));
        }
        no_value(&flag, &inline)?;
        out.push(flag);
    }
    Ok(Parsed::Run(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn switches_help_and_errors() {
        let ok = |a: &[&str]| match parse_switches(&args(a), &["--json"]) {
            Ok(Parsed::Run(v)) => Some(v),
            _ => None,
        };
        assert_eq!(ok(&[]), Some(vec![]));
        assert_eq!(ok(&["--json"]), Some(vec!["--json".to_string()]));
        assert!(matches!(
            parse_switches(&args(&["--json", "-h"]), &["--json"]),
            Ok(Parsed::Help)
        ));
        let e = parse_switches(&args(&["--jsno"]), &["--json"])
            .err()
            .unwrap();
        assert_eq!(
            usage_line("status", &e),
            "natguard status: unknown argument \"--jsno\"; try `natguard status --help`"
        );
        assert!(parse_switches(&args(&["--json=1"]), &["--json"]).is_err());
    }

    #[test]
    fn values_inline_or_next() {
        let a = args(&["--x=1", "--y", "2", "--z"]);
        let mut it = Args::new(&a);
        let (f, i) = it.next_flag().unwrap();
        assert_eq!(it.value(&f, i).unwrap(), "1");
        let (f, i) = it.next_flag().unwrap();
        assert_eq!(it.value(&f, i).unwrap(), "2");
        let (f, i) = it.next_flag().unwrap();
        assert_eq!(
            it.value(&f, i).unwrap_err().to_string(),
            "--z needs a value"
        );
    }
}
