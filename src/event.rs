//! How the library talks to its caller while it works. The library never prints: warnings,
//! notes, verbose detail and a child command's output reach the caller as [`Event`] values,
//! and long loops report through a [`Progress`]; the CLI (`src/cli`) decides what to show and
//! how (stderr, colours, progress bars).

/// Something the caller may want to show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Something is off but the work goes on (the CLI prints `warning: …`).
    Warning(String),
    /// A note (the CLI prints `[I] …`).
    Info(String),
    /// Detail for `--verbose` (the CLI prints `[V] …`).
    Verbose(String),
    /// Output of a child command (`--check`), shown verbatim.
    Output(String),
}

/// A receiver of events.
pub type Events<'a> = &'a mut dyn FnMut(Event);

/// Progress of a long loop (calibration passes). Every method has a do-nothing default.
pub trait Progress {
    /// The loop has `total` steps.
    fn start(&self, _total: u64) {}
    /// What the loop is doing now.
    fn message(&self, _msg: &str) {}
    /// `n` more steps are done.
    fn advance(&self, _n: u64) {}
    /// The loop ended: completed (`ok`) or stopped by an error.
    fn finish(&self, _ok: bool) {}
}

/// Progress nobody watches.
pub struct NoProgress;

impl Progress for NoProgress {}
