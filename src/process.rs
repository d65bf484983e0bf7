//! Child processes the library starts — `--check` commands ([`crate::search::check`]) and
//! data-loader scripts ([`crate::data::script`]) — contained so that none can hang a search,
//! outlive mixprec, fake a verdict or grow mixprec's memory (docs/search.md, "How checks run").
//!
//! - **Own session.** Each child calls `setsid` before it executes, so it leads a new session
//!   and process group (no terminal: a Ctrl-C at the terminal reaches mixprec only, which
//!   then stops the groups itself). Everything it starts stays in that group unless it makes
//!   its own session, and is signalled with it (`killpg`): a wrapper script, Polygraphy's
//!   subprocesses, `srun`'s helpers.
//! - **Ending a group**: SIGTERM to the group, then SIGKILL after [`KILL_GRACE`] to whatever
//!   is left. The leader is reaped only after the group was signalled for the last time, so
//!   its pid (the group's id) cannot be reused by another process in between. A check is
//!   finished when its leader exited *and* its output pipes closed (a background worker
//!   holding them is still part of the check, and of its timeout); what is left after that
//!   (a daemon that closed its output) is ended the same way.
//! - **A guard for every group.** Before it executes, the child starts a tiny `/bin/sh`
//!   watchdog inside its group (double-forked, so it is nobody's child it could wait for)
//!   that blocks on a pipe whose write end only mixprec holds. However mixprec ends — an
//!   error, a panic, a second Ctrl-C, `kill -9`, a crash — the kernel closes that end, the
//!   read returns, and the guard ends the group (SIGTERM, then SIGKILL after the grace).
//! - **Stop flag.** [`install_stop_handler`] turns SIGINT and SIGTERM into a flag the search
//!   and [`Run::wait_all`] poll ([`stop_requested`]); a second signal of the same kind kills
//!   as usual (the guards then end the groups).
//! - **Bounded output.** A check's stdout and stderr are read as they arrive (one `poll`
//!   loop for every running check, never blocking on one pipe) into a [`Capture`] that keeps
//!   the last [`OUTPUT_LIMIT`] bytes of each stream and counts what it dropped.
//!
//! Linux: `/proc` tells whether a group still has live members (elsewhere on unix the grace
//! is always waited in full).

use regex::Regex;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Between SIGTERM and SIGKILL when a group is ended. The guard's script waits as long.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// The bytes of each output stream (stdout, stderr) a check keeps: the last ones.
pub const OUTPUT_LIMIT: usize = 1 << 20;

/// How often a waiting loop looks at leaders, timeouts and the stop flag.
const TICK: Duration = Duration::from_millis(10);

/// After SIGKILL, how long output still drains (a process that left the group with its own
/// session may hold a pipe forever; its output is then abandoned).
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// The stop flag and signal handling.

static STOP_FLAG: AtomicPtr<AtomicBool> = AtomicPtr::new(std::ptr::null_mut());
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Makes `flag` the one [`stop_requested`] reads: running checks and data loaders are ended
/// when it is set. [`install_stop_handler`] calls it; a library caller with its own flag may
/// call it alone.
pub fn set_stop_flag(flag: &'static AtomicBool) {
    STOP_FLAG.store(
        flag as *const AtomicBool as *mut AtomicBool,
        Ordering::SeqCst,
    );
}

/// Flags watched by [`with_stop_flag`] calls now running (their addresses).
static WATCHED: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// Whether the flag given to [`set_stop_flag`], or one a running [`with_stop_flag`] watches,
/// is set.
pub fn stop_requested() -> bool {
    let p = STOP_FLAG.load(Ordering::SeqCst);
    // SAFETY: only `&'static AtomicBool`s are stored.
    if !p.is_null() && unsafe { &*p }.load(Ordering::SeqCst) {
        return true;
    }
    let watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
    watched.iter().any(|&a| {
        // SAFETY: an address is in WATCHED only while the `with_stop_flag` call that borrows
        // it runs (removed by a drop guard, on unwinding too).
        unsafe { &*(a as *const AtomicBool) }.load(Ordering::SeqCst)
    })
}

/// Runs `f` with `flag` counted as a stop request too ([`stop_requested`]): a search's own
/// stop flag ends its running checks and data loaders.
pub fn with_stop_flag<R>(flag: &AtomicBool, f: impl FnOnce() -> R) -> R {
    let addr = flag as *const AtomicBool as usize;
    WATCHED.lock().unwrap_or_else(|e| e.into_inner()).push(addr);
    struct Unwatch(usize);
    impl Drop for Unwatch {
        fn drop(&mut self) {
            let mut w = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = w.iter().position(|&a| a == self.0) {
                w.swap_remove(i);
            }
        }
    }
    let _unwatch = Unwatch(addr);
    f()
}

/// The signal that set the stop flag (SIGINT or SIGTERM), if one did.
pub fn stop_signal() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

extern "C" fn on_stop_signal(sig: libc::c_int) {
    // Only atomic loads and stores: async-signal-safe.
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
    let p = STOP_FLAG.load(Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: only `&'static AtomicBool`s are stored.
        unsafe { &*p }.store(true, Ordering::SeqCst);
    }
}

/// SIGINT (Ctrl-C) and SIGTERM set `flag` (through [`set_stop_flag`]) instead of killing:
/// the search stops after ending the running checks' groups and reports the best plan so far.
/// A second signal of the same kind kills as usual (`SA_RESETHAND`). SIGXFSZ is ignored, so
/// a write beyond `RLIMIT_FSIZE` fails with an error (and the file being written is removed,
/// `crate::data::write_atomic`) instead of killing mixprec halfway through it; children get
/// the default action back before they execute.
pub fn install_stop_handler(flag: &'static AtomicBool) {
    set_stop_flag(flag);
    // SAFETY: the handler only touches atomics; sigaction/signal are called with valid data.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_stop_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// `SIGTERM`, `SIGSEGV`, … for a signal number (`signal 42` when unknown).
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

// ---------------------------------------------------------------------------------------------
// Starting a contained child.

/// The guard's script: wait for EOF on fd 3 (mixprec gone), then end the group it is in.
/// The `sleep` is [`KILL_GRACE`].
const GUARD_SCRIPT: &std::ffi::CStr =
    c"read x <&3; trap '' TERM; kill -TERM 0; sleep 2; kill -KILL 0";

/// The read end of the guard pipe (its write end stays open, unread, for the life of the
/// process: the kernel closes it when mixprec ends, however it ends). None when no pipe
/// could be made (the children then run unguarded).
fn guard_fd() -> Option<RawFd> {
    static GUARD: OnceLock<Option<RawFd>> = OnceLock::new();
    *GUARD.get_or_init(|| {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: plain fd calls on fds this function owns.
        unsafe {
            if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return None;
            }
            // Above stdio, which a child's own pipes replace before it executes.
            let lift = |fd: RawFd| {
                if fd > 2 {
                    return fd;
                }
                let n = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3);
                libc::close(fd);
                n
            };
            let (r, w) = (lift(fds[0]), lift(fds[1]));
            if r < 0 || w < 0 {
                return None;
            }
            Some(r)
        }
    })
}

/// In the child after `fork`, before `exec`: only async-signal-safe calls. A new session,
/// the guard started inside it, SIGXFSZ back to its default.
fn enter_own_session(guard: Option<RawFd>) -> io::Result<()> {
    // SAFETY: async-signal-safe libc calls only, on this process's own fds.
    unsafe {
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
        let Some(g) = guard else { return Ok(()) };
        let m = libc::fork();
        if m == 0 {
            // The middle process: start the guard and leave at once, so the guard is
            // nobody's child (a check that waits for all its children never waits for it).
            if libc::fork() == 0 {
                if g == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0);
                } else {
                    libc::dup2(g, 3);
                }
                // Not the check's pipes: the guard must not keep them open.
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                if null >= 0 {
                    libc::dup2(null, 0);
                    libc::dup2(null, 1);
                    libc::dup2(null, 2);
                    if null > 3 {
                        libc::close(null);
                    }
                }
                let argv = [
                    c"/bin/sh".as_ptr(),
                    c"-c".as_ptr(),
                    GUARD_SCRIPT.as_ptr(),
                    c"mixprec-guard".as_ptr(),
                    std::ptr::null(),
                ];
                libc::execv(c"/bin/sh".as_ptr(), argv.as_ptr());
                libc::_exit(127);
            }
            libc::_exit(0);
        }
        if m > 0 {
            while libc::waitpid(m, std::ptr::null_mut(), 0) < 0
                && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
            {}
        }
    }
    Ok(())
}

/// A child leading its own session and process group (with its guard), ended as a group.
/// Dropping it ends the group (SIGTERM, then SIGKILL after [`KILL_GRACE`]).
pub struct Contained {
    child: Child,
    pgid: i32,
    status: Option<ExitStatus>,
}

impl Contained {
    /// Starts `cmd` in its own session. Stdio is the caller's to set.
    pub fn spawn(cmd: &mut Command) -> io::Result<Contained> {
        let guard = guard_fd();
        // SAFETY: the closure makes async-signal-safe calls only (`enter_own_session`).
        unsafe {
            cmd.pre_exec(move || enter_own_session(guard));
        }
        let child = cmd.spawn()?;
        let pgid = child.id() as i32;
        Ok(Contained {
            child,
            pgid,
            status: None,
        })
    }

    /// The group's id (the leader's pid).
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    /// The leader's stdout/stderr, when piped.
    pub fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.stdout.take()
    }

    pub fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.child.stderr.take()
    }

    /// Signals the whole group, as long as the leader is not reaped (until then its pid, the
    /// group's id, cannot name another group).
    pub fn signal(&self, sig: i32) {
        if self.status.is_none() {
            // SAFETY: a plain kill(2) on our own child's group.
            unsafe {
                libc::killpg(self.pgid, sig);
            }
        }
    }

    /// Whether the leader has exited (without reaping it).
    pub fn leader_exited(&self) -> bool {
        if self.status.is_some() {
            return true;
        }
        // SAFETY: waitid on our own child, WNOWAIT leaves it to be reaped later.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                self.pgid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            r != 0 || info.si_pid() != 0
        }
    }

    /// Whether a process of the group other than a zombie is left.
    pub fn group_alive(&self) -> bool {
        group_alive(self.pgid)
    }

    /// Reaps the leader once it exited; its status.
    fn reap(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.wait().ok();
        }
        self.status
    }

    /// The leader's status once it was reaped.
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Waits up to `wait` for the leader to exit by itself, then ends what is left of the
    /// group (what the leader started, the guard): SIGTERM, SIGKILL after `grace`. Returns
    /// the leader's status.
    pub fn finish(&mut self, wait: Duration, grace: Duration) -> Option<ExitStatus> {
        if self.status.is_some() {
            return self.status;
        }
        let t0 = Instant::now();
        while t0.elapsed() < wait && !self.leader_exited() {
            std::thread::sleep(TICK);
        }
        self.terminate(grace)
    }

    /// Ends the group (SIGTERM; SIGKILL after `grace` to what is left) and reaps the leader.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.status.is_some() {
            return self.status;
        }
        if self.group_alive() {
            self.signal(libc::SIGTERM);
            let t0 = Instant::now();
            while t0.elapsed() < grace && self.group_alive() {
                std::thread::sleep(TICK);
            }
        }
        self.kill_and_reap()
    }

    /// SIGKILL to the group, then reaps the leader (waiting at most a few seconds: a
    /// process stuck in the kernel cannot be waited for).
    fn kill_and_reap(&mut self) -> Option<ExitStatus> {
        self.signal(libc::SIGKILL);
        let t0 = Instant::now();
        while !self.leader_exited() {
            if t0.elapsed() > Duration::from_secs(5) {
                return None;
            }
            std::thread::sleep(TICK);
        }
        self.reap()
    }
}

impl Drop for Contained {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.terminate(KILL_GRACE);
        }
    }
}

/// Whether group `pgid` has a live member (zombies do not count). From `/proc`; without it,
/// whether the group exists at all.
fn group_alive(pgid: i32) -> bool {
    match proc_group_alive(pgid) {
        Some(alive) => alive,
        // SAFETY: kill with signal 0 only checks.
        None => unsafe { libc::kill(-pgid, 0) == 0 },
    }
}

fn proc_group_alive(pgid: i32) -> Option<bool> {
    let dir = std::fs::read_dir("/proc").ok()?;
    let mut seen = false;
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        seen = true;
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue; // gone meanwhile
        };
        // `pid (comm) state ppid pgrp …`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let state = f.next().unwrap_or("Z");
        let group = f.nth(1).and_then(|g| g.parse::<i32>().ok());
        if group == Some(pgid) && state != "Z" && state != "X" {
            return Some(true);
        }
    }
    seen.then_some(false)
}

// ---------------------------------------------------------------------------------------------
// Bounded output.

/// The last `limit` bytes of a stream (cut at a line start where one is near), how many
/// were dropped, and — with a regex — its first match in what was dropped.
pub struct Capture {
    buf: Vec<u8>,
    limit: usize,
    dropped: u64,
    regex: Option<Regex>,
    dropped_match: Option<String>,
}

/// What a [`Capture`] kept.
#[derive(Clone, Debug, Default)]
pub struct Captured {
    /// The stream's last bytes (all of it when `dropped` is 0).
    pub bytes: Vec<u8>,
    /// Bytes dropped from the front.
    pub dropped: u64,
    /// The regex's first match in the dropped bytes (matched a block at a time as they left).
    pub dropped_match: Option<String>,
}

impl Capture {
    pub fn new(limit: usize, regex: Option<Regex>) -> Capture {
        Capture {
            buf: Vec::new(),
            limit: limit.max(1),
            dropped: 0,
            regex,
            dropped_match: None,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        if self.buf.len() > 2 * self.limit {
            self.trim();
        }
    }

    /// Drops the front beyond `limit`, at the next line start when there is one.
    fn trim(&mut self) {
        if self.buf.len() <= self.limit {
            return;
        }
        let from = self.buf.len() - self.limit;
        let cut = self.buf[from..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(from, |i| from + i + 1);
        if self.dropped_match.is_none() {
            if let Some(re) = &self.regex {
                let gone = String::from_utf8_lossy(&self.buf[..cut]);
                self.dropped_match = re.find(&gone).map(|m| m.as_str().to_string());
            }
        }
        self.dropped += cut as u64;
        self.buf.drain(..cut);
    }

    pub fn finish(mut self) -> Captured {
        self.trim();
        Captured {
            bytes: self.buf,
            dropped: self.dropped,
            dropped_match: self.dropped_match,
        }
    }
}

impl Captured {
    /// The kept text, after a line saying how much of `stream` was dropped when any was.
    pub fn text(&self, stream: &str) -> String {
        let kept = String::from_utf8_lossy(&self.bytes);
        if self.dropped == 0 {
            return kept.into_owned();
        }
        format!(
            "[mixprec: {} of {stream} dropped; the last {} kept]\n{kept}",
            human_bytes(self.dropped),
            human_bytes(self.bytes.len() as u64)
        )
    }
}

/// `1.5 MiB`, `400.0 MiB`, `812 bytes`.
fn human_bytes(n: u64) -> String {
    const K: f64 = 1024.0;
    let f = n as f64;
    if f >= K * K * K {
        format!("{:.1} GiB", f / (K * K * K))
    } else if f >= K * K {
        format!("{:.1} MiB", f / (K * K))
    } else if f >= K {
        format!("{:.1} KiB", f / K)
    } else {
        format!("{n} bytes")
    }
}

/// Reads `stream` into a bounded [`Capture`] on its own thread, until EOF — or, once
/// [`CaptureThread::finish`] was called, until the stream is quiet or a deadline passed (a
/// process outside the group may hold it forever).
pub struct CaptureThread {
    handle: std::thread::JoinHandle<Captured>,
    done: std::sync::Arc<AtomicBool>,
}

impl CaptureThread {
    pub fn start<R: Read + AsRawFd + Send + 'static>(stream: R, limit: usize) -> CaptureThread {
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let handle = std::thread::spawn(move || {
            let mut stream = stream;
            let mut cap = Capture::new(limit, None);
            let mut buf = vec![0u8; 64 << 10];
            let mut deadline: Option<Instant> = None;
            loop {
                let ready = poll_one(stream.as_raw_fd(), Duration::from_millis(50));
                if ready {
                    match stream.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => cap.push(&buf[..n]),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                } else if flag.load(Ordering::SeqCst) {
                    break; // asked to finish and quiet for a while
                }
                if flag.load(Ordering::SeqCst) {
                    let d = *deadline.get_or_insert_with(|| Instant::now() + DRAIN_AFTER_KILL);
                    if Instant::now() > d {
                        break;
                    }
                }
            }
            cap.finish()
        });
        CaptureThread { handle, done }
    }

    /// Call after the group ended: what the stream held.
    pub fn finish(self) -> Captured {
        self.done.store(true, Ordering::SeqCst);
        self.handle.join().unwrap_or_default()
    }
}

/// Whether `fd` is readable (or at EOF / in error) within `timeout`.
fn poll_one(fd: RawFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
    r > 0
}

/// A reader over a child's pipe whose reads give up with an error once [`stop_requested`]
/// (Ctrl-C, SIGTERM): a data loader that hangs cannot hold mixprec.
pub struct StopReader<R> {
    inner: R,
}

impl<R: Read + AsRawFd> StopReader<R> {
    pub fn new(inner: R) -> StopReader<R> {
        StopReader { inner }
    }
}

/// The message of the error a [`StopReader`] returns when stopped.
pub const STOPPED: &str = "stopped by Ctrl-C or SIGTERM";

impl<R: Read + AsRawFd> Read for StopReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if stop_requested() {
                return Err(io::Error::other(STOPPED));
            }
            if poll_one(self.inner.as_raw_fd(), Duration::from_millis(50)) {
                return self.inner.read(buf);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A command run to completion, with a timeout and bounded output (`--check`).

/// How a [`Run`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The leader exited (by itself) and the output pipes closed.
    Exited(ExitStatus),
    /// The timeout passed first: the group was ended.
    TimedOut(Duration),
    /// [`stop_requested`]: the group was ended.
    Interrupted,
}

/// A finished [`Run`].
#[derive(Debug)]
pub struct Finished {
    pub ending: Ending,
    pub stdout: Captured,
    pub stderr: Captured,
    /// From the start to the verdict (the group's end not included).
    pub elapsed: Duration,
}

impl Finished {
    /// What the exit status says, for a leader that exited: `None` for status 0, else
    /// `exited with status 3` / `was killed by signal 11 (SIGSEGV, core dumped)`.
    pub fn failure(status: ExitStatus) -> Option<String> {
        if let Some(sig) = status.signal() {
            let core = if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            };
            return Some(format!(
                "was killed by signal {sig} ({}{core})",
                signal_name(sig)
            ));
        }
        match status.code() {
            Some(0) => None,
            Some(c) => Some(format!("exited with status {c}")),
            None => Some("ended with an unknown status".into()),
        }
    }
}

struct Stream {
    fd: Option<OwnedFd>,
    cap: Capture,
}

enum Phase {
    Running,
    /// The group was sent SIGTERM (`killed`: and SIGKILL at that time).
    Ending {
        ending: Option<Ending>,
        since: Instant,
        killed: Option<Instant>,
    },
    Done,
}

/// A command started in its own group with stdout and stderr piped to mixprec.
pub struct Run {
    proc: Contained,
    streams: [Stream; 2],
    started: Instant,
    timeout: Option<Duration>,
    phase: Phase,
    ending: Option<Ending>,
    elapsed: Duration,
}

impl Run {
    /// Starts `cmd` (stdin from /dev/null) in its own session; its output is kept up to
    /// `limit` bytes a stream, `regex` matched over what is dropped.
    pub fn spawn(
        cmd: &mut Command,
        timeout: Option<Duration>,
        limit: usize,
        regex: Option<&Regex>,
    ) -> io::Result<Run> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut proc = Contained::spawn(cmd)?;
        let started = Instant::now();
        let out: Option<OwnedFd> = proc.take_stdout().map(Into::into);
        let err: Option<OwnedFd> = proc.take_stderr().map(Into::into);
        for fd in out.iter().chain(err.iter()) {
            set_nonblocking(fd.as_raw_fd());
        }
        let stream = |fd| Stream {
            fd,
            cap: Capture::new(limit, regex.cloned()),
        };
        Ok(Run {
            proc,
            streams: [stream(out), stream(err)],
            started,
            timeout,
            phase: Phase::Running,
            ending: None,
            elapsed: Duration::ZERO,
        })
    }

    fn streams_closed(&self) -> bool {
        self.streams.iter().all(|s| s.fd.is_none())
    }

    /// One look at the leader, the clock and the stop flag; signals the group as needed.
    fn step(&mut self, now: Instant, stop: bool) {
        match self.phase {
            Phase::Running => {
                let end = if self.proc.leader_exited() && self.streams_closed() {
                    Some(None) // the status comes with reaping
                } else if stop {
                    Some(Some(Ending::Interrupted))
                } else if self.timeout.is_some_and(|t| now - self.started > t) {
                    Some(Some(Ending::TimedOut(now - self.started)))
                } else {
                    None
                };
                if let Some(ending) = end {
                    self.elapsed = now - self.started;
                    // What is left of the group (for a finished check: a daemon, the guard).
                    self.proc.signal(libc::SIGTERM);
                    self.phase = Phase::Ending {
                        ending,
                        since: now,
                        killed: None,
                    };
                }
            }
            Phase::Ending {
                ending,
                since,
                killed,
            } => {
                let quiet = self.streams_closed() && !self.proc.group_alive();
                let drained = killed.is_some_and(|k| now - k > DRAIN_AFTER_KILL);
                if quiet || drained {
                    if !quiet {
                        for s in &mut self.streams {
                            s.fd = None; // held by a process that left the group
                        }
                    }
                    let status = self.proc.kill_and_reap();
                    self.ending = Some(match (ending, status) {
                        (Some(e), _) => e,
                        (None, Some(s)) => Ending::Exited(s),
                        (None, None) => Ending::Exited(ExitStatus::from_raw(libc::SIGKILL)),
                    });
                    self.phase = Phase::Done;
                } else if killed.is_none() && now - since >= KILL_GRACE {
                    self.proc.signal(libc::SIGKILL);
                    self.phase = Phase::Ending {
                        ending,
                        since,
                        killed: Some(now),
                    };
                }
            }
            Phase::Done => {}
        }
    }

    /// Waits for every run — reading their output as it comes, ending a group whose timeout
    /// passed, and every group once `stop()` — and returns them finished, in order.
    pub fn wait_all(mut runs: Vec<Run>, stop: &dyn Fn() -> bool) -> Vec<Finished> {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let now = Instant::now();
            let stopping = stop();
            for r in runs.iter_mut() {
                r.step(now, stopping);
            }
            if runs.iter().all(|r| matches!(r.phase, Phase::Done)) {
                break;
            }
            let mut fds = Vec::new();
            let mut owners = Vec::new();
            for (i, r) in runs.iter().enumerate() {
                for (k, s) in r.streams.iter().enumerate() {
                    if let Some(fd) = &s.fd {
                        fds.push(libc::pollfd {
                            fd: fd.as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        });
                        owners.push((i, k));
                    }
                }
            }
            // SAFETY: `fds` holds valid pollfds (an empty slice is a plain sleep).
            let n = unsafe {
                libc::poll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    TICK.as_millis() as libc::c_int,
                )
            };
            if n <= 0 {
                continue; // timeout, or EINTR from a signal: look again
            }
            for (p, &(i, k)) in fds.iter().zip(&owners) {
                if p.revents == 0 {
                    continue;
                }
                let s = &mut runs[i].streams[k];
                // Drain what is there (bounded, so one chatty stream cannot starve the loop).
                for _ in 0..16 {
                    let Some(fd) = &s.fd else { break };
                    // SAFETY: reading into our buffer from our own fd.
                    let got =
                        unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    if got > 0 {
                        s.cap.push(&buf[..got as usize]);
                        continue;
                    }
                    let err = io::Error::last_os_error().raw_os_error();
                    if got < 0 && (err == Some(libc::EAGAIN) || err == Some(libc::EINTR)) {
                        break;
                    }
                    s.fd = None; // EOF or an error
                }
            }
        }
        runs.into_iter().map(Run::into_finished).collect()
    }

    fn into_finished(self) -> Finished {
        let Run {
            streams: [out, err],
            ending,
            elapsed,
            ..
        } = self;
        Finished {
            ending: ending.unwrap_or(Ending::Interrupted),
            stdout: out.cap.finish(),
            stderr: err.cap.finish(),
            elapsed,
        }
    }
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on our own fd.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(script);
        c
    }

    #[test]
    fn capture_keeps_the_last_lines_and_counts_the_rest() {
        let mut c = Capture::new(100, Some(Regex::new("MISMATCH").unwrap()));
        c.push(b"first MISMATCH here\n");
        for i in 0..1000 {
            c.push(format!("line {i}\n").as_bytes());
        }
        let got = c.finish();
        assert!(got.bytes.len() <= 100, "{}", got.bytes.len());
        assert!(got.bytes.starts_with(b"line "), "cut at a line start");
        assert!(got.bytes.ends_with(b"line 999\n"));
        let total = 20
            + (0..1000)
                .map(|i| format!("line {i}\n").len())
                .sum::<usize>();
        assert_eq!(got.dropped as usize + got.bytes.len(), total);
        assert_eq!(got.dropped_match.as_deref(), Some("MISMATCH"));
        assert!(got.text("stdout").starts_with("[mixprec: "));
        let small = Capture::new(100, None);
        assert_eq!(small.finish().text("stdout"), "");
    }

    #[test]
    fn a_run_reads_both_streams_and_reports_the_status() {
        let r = Run::spawn(
            &mut sh("echo out; echo err >&2; exit 3"),
            None,
            OUTPUT_LIMIT,
            None,
        )
        .unwrap();
        let f = Run::wait_all(vec![r], &|| false).pop().unwrap();
        match f.ending {
            Ending::Exited(s) => assert_eq!(s.code(), Some(3)),
            e => panic!("{e:?}"),
        }
        assert_eq!(f.stdout.bytes, b"out\n");
        assert_eq!(f.stderr.bytes, b"err\n");
    }

    #[test]
    fn a_timeout_ends_a_group_whose_grandchild_holds_the_pipes() {
        let t0 = Instant::now();
        let r = Run::spawn(
            &mut sh("sleep 30 & echo started; exit 0"),
            Some(Duration::from_millis(300)),
            OUTPUT_LIMIT,
            None,
        )
        .unwrap();
        let pgid = r.proc.pgid();
        let f = Run::wait_all(vec![r], &|| false).pop().unwrap();
        assert!(matches!(f.ending, Ending::TimedOut(_)), "{:?}", f.ending);
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(f.stdout.bytes, b"started\n");
        assert!(!group_alive(pgid));
    }

    #[test]
    fn a_stop_ends_every_group() {
        let runs = (0..3)
            .map(|_| Run::spawn(&mut sh("sleep 30"), None, OUTPUT_LIMIT, None).unwrap())
            .collect();
        let t0 = Instant::now();
        let done = Run::wait_all(runs, &|| t0.elapsed() > Duration::from_millis(200));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(done.iter().all(|f| f.ending == Ending::Interrupted));
    }

    #[test]
    fn a_watched_flag_ends_the_groups_while_it_is_watched() {
        let flag = AtomicBool::new(false);
        let r = Run::spawn(&mut sh("sleep 30"), None, OUTPUT_LIMIT, None).unwrap();
        let t0 = Instant::now();
        let done = with_stop_flag(&flag, || {
            flag.store(true, Ordering::SeqCst);
            Run::wait_all(vec![r], &stop_requested)
        });
        assert_eq!(done[0].ending, Ending::Interrupted);
        assert!(t0.elapsed() < Duration::from_secs(5));
        // No longer watched once the call returned.
        let addr = &flag as *const AtomicBool as usize;
        assert!(!WATCHED.lock().unwrap().contains(&addr));
    }

    #[test]
    fn a_signal_is_named() {
        let r = Run::spawn(&mut sh("kill -SEGV $$"), None, OUTPUT_LIMIT, None).unwrap();
        let f = Run::wait_all(vec![r], &|| false).pop().unwrap();
        let Ending::Exited(s) = f.ending else {
            panic!("{:?}", f.ending)
        };
        let why = Finished::failure(s).unwrap();
        assert!(why.starts_with("was killed by signal 11 (SIGSEGV"), "{why}");
    }

    #[test]
    fn dropping_a_contained_child_ends_its_group() {
        let mut cmd = sh("sleep 30 & sleep 30");
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let c = Contained::spawn(&mut cmd).unwrap();
        let pgid = c.pgid();
        std::thread::sleep(Duration::from_millis(100));
        assert!(group_alive(pgid));
        drop(c);
        assert!(!group_alive(pgid));
    }
}
