//! timeit: runs one command as a container runtime does (fork/exec, stdio inherited), reaps it
//! with wait4(2) and writes `<wall_ns> <cpu_us> <maxrss_kb> <own_maxrss_kb> <hwm_kb> <anon_kb>
//! <file_kb>` to fd 3, then exits with the command's status (128+signal if it was killed).
//!
//! `timeit --hwm CMD...` also stops the command at its exit with ptrace (PTRACE_O_TRACEEXIT)
//! and reads /proc/PID/status: VmHWM, the peak RSS of the command's own address space (not its
//! children's, nothing inherited), and the RssAnon / RssFile split at that moment (the last
//! three fields; 0 without --hwm). Tracing costs time, so timed runs do not use it.
//!
//! Why a separate tiny program and not the Python driver: on exec the kernel folds the old
//! address space's high-water RSS into the new program's ru_maxrss, and a child spawned from
//! Python starts from Python's address space (vfork shares it, fork copies its high-water
//! mark), so every child would report at least the interpreter's ~20 MiB. Spawned from this
//! static binary, a child's ru_maxrss is its own peak or this program's (reported as
//! own_maxrss_kb: the resolution floor), whichever is larger. CPU is user+sys of the child and
//! of every process it waited for; wall is spawn to reap.
//!
//! Not a cargo target: scripts/bench.sh builds it with plain `rustc` (no dependencies).

use std::fs::File;
use std::io::Write;
use std::os::unix::io::FromRawFd;
use std::process::Command;
use std::time::Instant;

#[repr(C)]
struct Timeval {
    sec: i64,
    usec: i64,
}

#[repr(C)]
struct Rusage {
    utime: Timeval,
    stime: Timeval,
    maxrss: i64,
    rest: [i64; 13],
}

extern "C" {
    fn wait4(pid: i32, status: *mut i32, options: i32, ru: *mut Rusage) -> i32;
    fn fcntl(fd: i32, cmd: i32, arg: i32) -> i32;
    fn fork() -> i32;
    fn ptrace(req: i64, pid: i32, addr: usize, data: usize) -> i64;
    fn execvp(file: *const std::ffi::c_char, argv: *const *const std::ffi::c_char) -> i32;
    fn _exit(code: i32) -> !;
}

const PTRACE_TRACEME: i64 = 0;
const PTRACE_CONT: i64 = 7;
const PTRACE_SETOPTIONS: i64 = 0x4200;
const PTRACE_O_TRACEEXIT: usize = 0x40;
const PTRACE_EVENT_EXIT: i32 = 6;
const SIGTRAP: i32 = 5;

/// VmHWM, RssAnon and RssFile (kB) of a stopped process.
fn mem_kb(pid: i32) -> [i64; 3] {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> i64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
            .unwrap_or(0)
    };
    [field("VmHWM:"), field("RssAnon:"), field("RssFile:")]
}

/// fork + PTRACE_TRACEME + execvp; the parent follows the child until it exits, reading VmHWM at
/// the exit stop and passing every other signal through.
fn run_traced(args: &[std::ffi::OsString], status: &mut i32, ru: &mut Rusage) -> [i64; 3] {
    use std::os::unix::ffi::OsStrExt;
    let cargs: Vec<std::ffi::CString> = args
        .iter()
        .map(|a| std::ffi::CString::new(a.as_bytes()).expect("NUL in argument"))
        .collect();
    let mut argv: Vec<*const std::ffi::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: single-threaded; the child only calls async-signal-safe functions before exec.
    let pid = unsafe { fork() };
    if pid == 0 {
        unsafe {
            ptrace(PTRACE_TRACEME, 0, 0, 0);
            execvp(argv[0], argv.as_ptr());
            _exit(127);
        }
    }
    let mut mem = [0; 3];
    let mut first = true;
    loop {
        let r = unsafe { wait4(pid, status, 0, ru) };
        if r != pid {
            if std::io::Error::last_os_error().raw_os_error() == Some(EINTR) {
                continue;
            }
            eprintln!("timeit: wait4 failed");
            std::process::exit(125);
        }
        let st = *status;
        if st & 0xff != 0x7f {
            return mem; // exited or killed
        }
        let sig = (st >> 8) & 0xff;
        let event = st >> 16;
        let mut deliver = 0usize;
        if first && sig == SIGTRAP {
            first = false;
            unsafe { ptrace(PTRACE_SETOPTIONS, pid, 0, PTRACE_O_TRACEEXIT) };
        } else if sig == SIGTRAP && event == PTRACE_EVENT_EXIT {
            mem = mem_kb(pid);
        } else {
            deliver = sig as usize;
        }
        unsafe { ptrace(PTRACE_CONT, pid, 0, deliver) };
    }
}

const F_SETFD: i32 = 2;
const FD_CLOEXEC: i32 = 1;
const EINTR: i32 = 4;

fn zero() -> Rusage {
    Rusage {
        utime: Timeval { sec: 0, usec: 0 },
        stime: Timeval { sec: 0, usec: 0 },
        maxrss: 0,
        rest: [0; 13],
    }
}

fn main() {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let trace = args.first().is_some_and(|a| a == "--hwm");
    if trace {
        args.remove(0);
    }
    if args.is_empty() {
        eprintln!("usage: timeit [--hwm] CMD [ARGS...]   (results on fd 3)");
        std::process::exit(125);
    }
    // SAFETY: plain libc calls on our own fd and rusage buffers.
    unsafe { fcntl(3, F_SETFD, FD_CLOEXEC) };
    // Our own peak RSS, from our address space (getrusage would also count the address space
    // we were exec'd from): a child's ru_maxrss starts from it.
    let own_hwm = mem_kb(std::process::id() as i32)[0];
    let t0 = Instant::now();
    let mut status = 0i32;
    let mut ru = zero();
    let mut mem = [0; 3];
    if trace {
        mem = run_traced(&args, &mut status, &mut ru);
    } else {
        run_plain(&args, &mut status, &mut ru);
    }
    let wall = t0.elapsed();
    let cpu_us = (ru.utime.sec + ru.stime.sec) * 1_000_000 + ru.utime.usec + ru.stime.usec;
    // SAFETY: fd 3 is the result channel the caller opened for us.
    let mut out = unsafe { File::from_raw_fd(3) };
    let _ = writeln!(
        out,
        "{} {} {} {} {} {} {}",
        wall.as_nanos(),
        cpu_us,
        ru.maxrss,
        own_hwm,
        mem[0],
        mem[1],
        mem[2]
    );
    let code = if status & 0x7f == 0 {
        (status >> 8) & 0xff
    } else {
        128 + (status & 0x7f)
    };
    std::process::exit(code);
}

/// Spawns with std (posix_spawn: vfork + exec from this small address space) and reaps.
fn run_plain(args: &[std::ffi::OsString], status: &mut i32, ru: &mut Rusage) {
    let child = match Command::new(&args[0]).args(&args[1..]).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("timeit: cannot run {:?}: {e}", args[0]);
            std::process::exit(127);
        }
    };
    let pid = child.id() as i32;
    loop {
        let r = unsafe { wait4(pid, status, 0, ru) };
        if r == pid {
            return;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(EINTR) {
            eprintln!("timeit: wait4 failed");
            std::process::exit(125);
        }
    }
}
