//! The terminal side of the library's [`Progress`] and [`Event`] reports: indicatif bars and
//! the stderr lines the CLI has always printed.

use mixprec::event::{Event, Progress};

/// A calibration progress bar on stderr (hidden when `show` is false).
pub struct Bar(indicatif::ProgressBar);

impl Bar {
    pub fn calibration(show: bool) -> Bar {
        if !show {
            return Bar(indicatif::ProgressBar::hidden());
        }
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} runs ({elapsed}, eta {eta})",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        Bar(bar)
    }
}

impl Progress for Bar {
    fn start(&self, total: u64) {
        self.0.set_length(total);
    }
    fn message(&self, msg: &str) {
        self.0.set_message(msg.to_string());
    }
    fn advance(&self, n: u64) {
        self.0.inc(n);
    }
    fn finish(&self, ok: bool) {
        if ok {
            self.0.finish_and_clear();
        } else {
            self.0.abandon();
        }
    }
}

/// Prints a library event on stderr the way mixprec always has.
pub fn print_event(e: Event) {
    match e {
        Event::Warning(w) => eprintln!("warning: {w}"),
        Event::Info(n) => eprintln!("[I] {n}"),
        Event::Verbose(v) => eprintln!("[V] {v}"),
        Event::Output(text) => eprint!("{text}"),
    }
}
