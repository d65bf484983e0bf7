//! How the CLI's log reaches the terminal: colours (`[E]` and FAILED red, `[W]` yellow,
//! PASSED green) when the stream is a terminal and NO_COLOR is unset, or as `--color` says;
//! `--quiet` (only the final verdict line on stdout, warnings on stderr) and a silent mode for
//! `--json` (stdout carries only the JSON document).

use clap::{Args, ValueEnum};
use std::io::IsTerminal;

/// `--color`: when to colour the log.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ColorChoice {
    /// When the stream is a terminal and NO_COLOR is unset or empty.
    #[default]
    Auto,
    Always,
    Never,
}

/// The log's colour and verbosity options, for any command that prints a Polygraphy-style log.
#[derive(Args, Debug, Clone, Default)]
pub struct StyleArgs {
    /// Colour the log: auto (when printing to a terminal and NO_COLOR is not set), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN")]
    pub color: ColorChoice,
    /// Print only the final PASSED/FAILED line (warnings and errors still go to stderr).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// Whether to colour a stream: `always` and `never` decide; `auto` colours a terminal unless
/// NO_COLOR is set to a non-empty value (<https://no-color.org>).
pub fn use_color(choice: ColorChoice, is_terminal: bool, no_color: Option<&str>) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => is_terminal && no_color.is_none_or(str::is_empty),
    }
}

const RED: &str = "\x1b[31m";
const RED_BOLD: &str = "\x1b[1;31m";
const GREEN_BOLD: &str = "\x1b[1;32m";
const YELLOW: &str = "\x1b[33m";
const RESET: &str = "\x1b[0m";

/// Colours log text line by line: `[E]` lines red, `[W]` lines yellow, and elsewhere the words
/// FAILED (red) and PASSED (green), as in table rows and `[I] PASSED | ...` lines.
pub fn paint(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.split_inclusive('\n') {
        let (body, nl) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        if body.starts_with("[E]") {
            out.push_str(RED);
            out.push_str(&body.replace("FAILED", &format!("{RED_BOLD}FAILED{RESET}{RED}")));
            out.push_str(RESET);
        } else if body.starts_with("[W]") {
            out.push_str(YELLOW);
            out.push_str(body);
            out.push_str(RESET);
        } else {
            out.push_str(
                &body
                    .replace("FAILED", &format!("{RED_BOLD}FAILED{RESET}"))
                    .replace("PASSED", &format!("{GREEN_BOLD}PASSED{RESET}")),
            );
        }
        out.push_str(nl);
    }
    out
}

/// How much of the log to print, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verbosity {
    Normal,
    /// Only the verdict line on stdout; `[W]` lines on stderr.
    Quiet,
    /// Nothing on stdout but what `json` prints; `[W]` lines on stderr.
    Json,
}

/// The printer of one command's log.
#[derive(Clone, Copy, Debug)]
pub struct Out {
    pub verbosity: Verbosity,
    color: bool,
    err_color: bool,
}

impl Out {
    pub fn new(args: &StyleArgs, json: bool) -> Out {
        let no_color = std::env::var("NO_COLOR").ok();
        Out {
            verbosity: if json {
                Verbosity::Json
            } else if args.quiet {
                Verbosity::Quiet
            } else {
                Verbosity::Normal
            },
            color: use_color(
                args.color,
                std::io::stdout().is_terminal(),
                no_color.as_deref(),
            ),
            err_color: use_color(
                args.color,
                std::io::stderr().is_terminal(),
                no_color.as_deref(),
            ),
        }
    }

    /// Prints log text (whole lines, each ending in a newline). In quiet and JSON modes only
    /// its warnings are printed, on stderr.
    pub fn log(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        match self.verbosity {
            Verbosity::Normal => {
                if self.color {
                    print!("{}", paint(text));
                } else {
                    print!("{text}");
                }
            }
            Verbosity::Quiet | Verbosity::Json => {
                let warnings: String = text
                    .split_inclusive('\n')
                    .filter(|l| l.starts_with("[W]"))
                    .collect();
                if !warnings.is_empty() {
                    if self.err_color {
                        eprint!("{}", paint(&warnings));
                    } else {
                        eprint!("{warnings}");
                    }
                }
            }
        }
    }

    /// The final verdict line: printed in normal and quiet modes.
    pub fn verdict(&self, line: &str) {
        if self.verbosity == Verbosity::Json {
            return;
        }
        if self.color {
            println!("{}", paint(line));
        } else {
            println!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_is_decided_by_flag_terminal_and_no_color() {
        use ColorChoice::*;
        assert!(use_color(Auto, true, None));
        assert!(
            use_color(Auto, true, Some("")),
            "an empty NO_COLOR is unset"
        );
        assert!(!use_color(Auto, true, Some("1")));
        assert!(!use_color(Auto, false, None), "piped: plain");
        assert!(use_color(Always, false, Some("1")), "the flag wins");
        assert!(!use_color(Never, true, None));
    }

    #[test]
    fn paints_severities_and_verdicts() {
        let s = paint(
            "[I] PASSED | ok\n[W] careful\n[E] FAILED | Output: 'x'\n    1  Add  FAILED\nplain",
        );
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "[I] \x1b[1;32mPASSED\x1b[0m | ok");
        assert_eq!(lines[1], "\x1b[33m[W] careful\x1b[0m");
        assert_eq!(
            lines[2],
            "\x1b[31m[E] \x1b[1;31mFAILED\x1b[0m\x1b[31m | Output: 'x'\x1b[0m"
        );
        assert_eq!(lines[3], "    1  Add  \x1b[1;31mFAILED\x1b[0m");
        assert_eq!(lines[4], "plain");
        assert!(s.ends_with("plain"), "no newline added");
        assert_eq!(paint("a\n"), "a\n");
    }
}
